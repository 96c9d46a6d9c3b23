"""Test configuration: the shared helpers (``tests/helpers``) are importable by every test,
and hypothesis runs derandomized so every run checks the same cases.

The suite mirrors the package's layers: ``core/``, ``comm/``, ``runtime/``, ``sim/``,
``adapters/<framework>/``, ``benchmarks/``; tests of the whole package (docs, examples, the
demo, types, imports) sit at the top. Worker scripts of multi-process tests live in
``helpers/`` beside ``workers.py``, which starts them.
"""

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

settings.register_profile(
    "chronica",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("chronica")
