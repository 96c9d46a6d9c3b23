"""The ``Example::`` blocks in the docstrings of the pure floors (``chronica.core``,
``chronica.sim``) run and print what they say, so an example cannot drift from the code it
shows (doctest, each module's examples in one namespace)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for floor in ("core", "sim")
    for path in (ROOT / "chronica" / floor).rglob("*.py")
)


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run_as_written(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
