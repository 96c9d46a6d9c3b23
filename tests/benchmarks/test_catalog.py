"""The benchmarks as a package: one catalog of benchmarks, every one a module with the
functions the runner and the page call, and ``chronica bench`` running this checkout's
package (or refusing, with the fix, when chronica is not installed from a checkout)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks.catalog import BENCHMARKS, DEVICE_SECTIONS, SECTIONS, load, reproduce_command
from benchmarks.run_all import main
from chronica.cli import BENCH_FIX, checkout_root

ROOT = Path(__file__).resolve().parents[2]


def _functions(name: str) -> set[str]:
    """The module-level functions of ``benchmarks/<name>.py`` (read, not imported: some
    benchmarks import frameworks this test does not need)."""
    tree = ast.parse((ROOT / "benchmarks" / f"{name.replace('.', '/')}.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_has_what_the_runner_and_the_page_call(name):
    expected = {"run", "format_table"} | ({"render_markdown"} if name in SECTIONS else set())
    assert expected <= _functions(name)


def test_the_catalog_lists_sections_once_and_in_the_benchmarks():
    assert len(set(BENCHMARKS)) == len(BENCHMARKS)
    assert set(SECTIONS) <= set(BENCHMARKS)


@pytest.mark.parametrize("name", DEVICE_SECTIONS)
def test_a_gpu_section_renders_on_the_page_but_never_runs_in_the_runner(name):
    assert {"run", "format_table", "render_markdown"} <= _functions(name)
    assert name not in BENCHMARKS


def test_the_package_is_this_checkout_and_the_one_chronica_bench_finds():
    assert Path(benchmarks.__file__).resolve().parent == ROOT / "benchmarks"
    assert checkout_root() == ROOT


def test_load_names_a_missing_benchmark():
    assert load("planning").__name__ == "benchmarks.planning"
    with pytest.raises(ModuleNotFoundError, match=r"benchmarks/nope\.py not found"):
        load("nope")


def test_reproduce_command_is_the_package_command():
    assert reproduce_command("scaling", quick=True) == "python -m benchmarks --only scaling --quick"
    assert reproduce_command("packing", quick=False, data_dir=Path("/d")) == (
        "python -m benchmarks --only packing --data-dir /d"
    )
    assert reproduce_command("scaling", quick=False, data_dir=Path("/d")) == (
        "python -m benchmarks --only scaling"
    )


def test_help_lists_every_benchmark_under_the_program_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"], prog="python -m benchmarks")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks")
    assert ", ".join(BENCHMARKS) in out


def test_an_unknown_benchmark_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--only", "nope"])
    assert stop.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_chronica_bench_outside_a_checkout_names_the_fix(tmp_path):
    """An installed chronica (here: its cli alone, with no benchmarks beside it) stops
    before running anything and says how to get a checkout."""
    (tmp_path / "chronica").mkdir()
    (tmp_path / "chronica" / "__init__.py").write_text("")
    shutil.copy(ROOT / "chronica" / "cli.py", tmp_path / "chronica" / "cli.py")
    done = subprocess.run(
        [sys.executable, "-m", "chronica.cli", "bench", "--quick"],
        cwd=tmp_path,
        env={"PATH": "", "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == BENCH_FIX
