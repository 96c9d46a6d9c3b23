"""``python -m chronica`` is the ``chronica`` command."""

from __future__ import annotations

import subprocess
import sys

from workers import ROOT, base_env


def test_python_dash_m_chronica_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "chronica", "--help"],
        env=base_env(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: chronica" in done.stdout
    for command in ("demo", "simulate", "bench", "coordinator"):
        assert command in done.stdout
