"""The house's rules, read from the source: kinds are objects, rooms stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "chronica"

# The one module that may compare kind names: the modes themselves.
MODES = PACKAGE / "core" / "modes.py"
KIND_NAMES = {"static", "guided", "dynamic"}

# Modules allowed past LIMIT lines, each with why it is still one job.
LIMIT = 600
LONGER: dict[str, str] = {}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _named_kind(node: ast.AST) -> bool:
    """``kind`` or ``<anything>.kind``."""
    return (isinstance(node, ast.Name) and node.id == "kind") or (
        isinstance(node, ast.Attribute) and node.attr == "kind"
    )


def _literal(node: ast.AST) -> bool:
    """A string or bytes constant, or a tuple/list/set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))


def _kind_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KIND_NAMES


def _kind_comparisons(path: Path) -> list[str]:
    """Comparisons of a ``kind`` with a string literal, or of a kind's name with anything."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(_named_kind(side) for side in sides) and any(_literal(s) for s in sides)
        if named or any(_kind_name(side) for side in sides):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_kind_is_compared_as_a_string_outside_the_modes():
    # Behaviour belongs to objects (chronica.core.modes, ShufflePolicy, message types):
    # a comparison of a ``kind`` or of a kind's name elsewhere is a rule in the wrong room.
    found = [line for path in _modules() if path != MODES for line in _kind_comparisons(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    sample = PACKAGE.parent / "tests" / "helpers" / "_kind_sample.py"
    sample.write_text(
        'if (config.kind == "dynamic" or mode == "static" or kind in (b"m", b"f")\n'
        "    or kind != 3 or p.kind in KINDS):\n    pass\n"
    )
    try:
        # The first three: a kind against literals, a kind's name against anything.
        assert [line.split(": ", 1)[1] for line in _kind_comparisons(sample)] == [
            "config.kind == 'dynamic'",
            "mode == 'static'",
            "kind in (b'm', b'f')",
        ]
    finally:
        sample.unlink()


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_one_job_of_at_most_600_lines(path: Path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    name = str(path.relative_to(ROOT))
    assert lines <= LIMIT or name in LONGER, (
        f"{name} has {lines} lines; split it by job, or add it to LONGER saying why it is one"
    )


MIRRORED = ("core", "comm", "runtime")


def _floor_modules() -> list[Path]:
    return [
        path
        for floor in MIRRORED
        for path in sorted((PACKAGE / floor).rglob("*.py"))
        if path.name != "__init__.py"
    ]


@pytest.mark.parametrize("path", _floor_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_of_the_lower_floors_has_a_test_file_of_its_own(path: Path):
    # core/packing/epoch.py -> tests/core/test_packing_epoch.py
    floor, *package = path.relative_to(PACKAGE).with_suffix("").parts
    expected = ROOT / "tests" / floor / f"test_{'_'.join(package)}.py"
    assert expected.exists(), f"{path.relative_to(ROOT)} has no {expected.relative_to(ROOT)}"
