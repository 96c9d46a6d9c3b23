"""The ``benchmarks`` package of this checkout is importable by the benchmark tests (it is
not installed with chronica: ``python -m benchmarks`` runs it from the repository root)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
