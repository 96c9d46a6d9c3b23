"""The code type-checks: mypy over ``chronica`` and ``benchmarks`` (configuration in
pyproject.toml, whose ``files`` name the same two, so a plain ``mypy`` checks what this does)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["chronica", "benchmarks"]


def test_mypy_checks_the_package_and_the_benchmarks_by_default():
    mypy = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]", 1)[1]
    files = re.search(r"^files = \[(.*)\]$", mypy, re.MULTILINE)
    assert files is not None and re.findall(r'"([^"]+)"', files.group(1)) == CHECKED


def test_mypy_passes_on_the_package_and_the_benchmarks():
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *CHECKED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
