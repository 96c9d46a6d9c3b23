"""examples/torch_train.py runs to completion and prints what its docstring promises (the
TensorFlow and JAX examples are run by tests/test_tf.py and tests/test_jax.py)."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_torch_train_example_runs():
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "torch_train.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out = run.stdout
    assert "torch sampler: per-step max/mean" in out
    assert "chronica sampler: per-step max/mean" in out
