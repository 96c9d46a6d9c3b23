"""The package's import contract: ``import chronica`` loads no framework, and the framework
faces are attributes loaded on first use."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_importing_chronica_loads_no_framework():
    code = (
        "import sys, chronica, chronica.core, chronica.runtime, chronica.cli;"
        "print(sorted({'torch', 'tensorflow', 'jax'} & set(sys.modules)))"
    )
    assert _run(code) == "[]"


@pytest.mark.parametrize(
    ("face", "name", "framework"),
    [
        ("torch", "utils.data.DistributedSampler", "torch"),
        ("tf", "schedule", "tensorflow"),
        ("jax", "iterator", "jax"),
    ],
)
def test_framework_faces_are_attributes_after_import_chronica(face, name, framework):
    pytest.importorskip(framework)
    code = (
        "import functools, sys, chronica\n"
        f"assert {framework!r} not in sys.modules\n"
        f"obj = functools.reduce(getattr, {name!r}.split('.'), chronica.{face})\n"
        f"print(callable(obj), {framework!r} in sys.modules)"
    )
    assert _run(code) == "True True"


def test_unknown_attribute_is_an_attribute_error():
    import chronica

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        chronica.nope  # noqa: B018
    assert chronica.DynamicOptions().timeout == 10.0


def test_the_command_refuses_an_unknown_log_level_by_name():
    out = subprocess.run(
        [sys.executable, "-m", "chronica.cli", "--log-level", "bogus", "simulate", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "--log-level: invalid choice: 'BOGUS'" in out.stderr
    assert "Traceback" not in out.stderr
