"""Every example in examples/ runs to completion and prints what its docstring promises."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_torch_train_example_runs():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "torch_train.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "torch sampler: per-step max/mean" in out
    assert "chronica sampler: per-step max/mean" in out
