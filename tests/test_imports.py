"""The import graph of ``chronica/`` and ``benchmarks/``, read from the source (ast, nothing
imported): no cycle anywhere, and the floors of DESIGN.md hold.

An edge ``a -> b`` is every ``import b`` / ``from b import x`` of module ``a`` (``b.x`` when
``x`` is a module of its own), at module level or inside a function, and every
``importlib.import_module("b")`` with a constant name. Imports under ``if TYPE_CHECKING:``
never run, so they are not edges of the cycle check, but they still count for the floors. An
import names the module it imports, not the parent packages Python initialises on the way
(as import-linter and pydeps count): ``from chronica.core.plan import X`` is an edge to
``chronica.core.plan``, not to ``chronica`` or ``chronica.core``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chronica", "benchmarks")
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "jaxlib", "flax", "optax", "grain")


@dataclass(frozen=True)
class Import:
    """One import statement of a module: what it names and where it sits."""

    target: str  # a dotted module name (first-party modules resolved to the module file)
    line: int
    in_function: bool
    type_checking: bool


@dataclass
class Module:
    name: str
    path: Path
    imports: list[Import] = field(default_factory=list)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(
    node: ast.AST, in_function: bool = False, type_checking: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node under ``node`` with whether it sits in a function / a TYPE_CHECKING block."""
    for child in ast.iter_child_nodes(node):
        yield child, in_function, type_checking
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, in_function, True
                yield from _walk(stmt, inner, True)
            for stmt in child.orelse:
                yield stmt, in_function, type_checking
                yield from _walk(stmt, inner, type_checking)
        else:
            yield from _walk(child, inner, type_checking)


@cache
def graph() -> dict[str, Module]:
    """Every module of ``PACKAGES`` with its imports."""
    modules = {
        _module_name(path): Module(_module_name(path), path)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    for module in modules.values():
        tree = ast.parse(module.path.read_text(), filename=str(module.path))
        package = (
            module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        )
        for node, in_function, type_checking in _walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                if base == "__future__":
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets = [node.args[0].value]
            line = getattr(node, "lineno", 0)
            module.imports += [Import(t, line, in_function, type_checking) for t in targets]
    return modules


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(floor: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{module.name}:{imp.line} imports {imp.target}"
        for module in graph().values()
        if _in(module.name, floor)
        for imp in module.imports
        if _in(imp.target, forbidden)
    ]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or with a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_every_module_and_resolves_imports():
    modules = graph()
    assert {"chronica", "chronica.core.scheduler", "chronica.cli", "benchmarks.run_all"} <= set(
        modules
    )
    targets = {imp.target for imp in modules["benchmarks.run_all"].imports}
    assert {"benchmarks.catalog", "benchmarks.report", "benchmarks.common"} <= targets


def test_no_import_cycle_anywhere():
    modules = graph()
    edges = {
        module.name: {
            imp.target for imp in module.imports if imp.target in modules and not imp.type_checking
        }
        for module in modules.values()
    }
    assert _cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]


UPPER = ("chronica.demo", "chronica.cli", "chronica.torch", "chronica.tf", "chronica.jax")


@pytest.mark.parametrize(
    ("floor", "forbidden"),
    [
        (
            ("chronica.core",),
            ("chronica.comm", "chronica.runtime", "chronica.adapters", "chronica.sim", *UPPER)
            + ("zmq", "msgpack", *FRAMEWORKS),
        ),
        (("chronica.comm",), ("chronica.runtime", "chronica.adapters", "chronica.sim", *UPPER)),
        (("chronica.comm",), FRAMEWORKS),
        (("chronica.runtime",), ("chronica.adapters", "chronica.sim", *UPPER, *FRAMEWORKS)),
        (("chronica.sizes_io",), ("chronica", *FRAMEWORKS)),
        (("chronica",), ("benchmarks",)),
    ],
    ids=["core", "comm-floors", "comm-frameworks", "runtime", "sizes_io", "chronica"],
)
def test_a_floor_imports_nothing_above_it(floor, forbidden):
    found = _violations(floor, forbidden)
    if floor == ("chronica",):  # `chronica bench` runs the checkout's benchmarks package
        found = [v for v in found if not v.startswith("chronica.cli:")]
    assert found == []


def test_sim_stands_on_core_and_sizes_io_only():
    found = [
        f"{module.name}:{imp.line} imports {imp.target}"
        for module in graph().values()
        if _in(module.name, ("chronica.sim",))
        for imp in module.imports
        if (
            _in(imp.target, ("chronica",))
            and not _in(imp.target, ("chronica.core", "chronica.sizes_io", "chronica.sim"))
        )
        or _in(imp.target, ("zmq", "msgpack", *FRAMEWORKS))
    ]
    assert found == []


def test_an_adapter_imports_no_other_adapters_framework():
    own = {"torch": "torch", "tf": "tensorflow", "jax": "jax", "grain": "grain"}
    found = []
    for adapter, framework in own.items():
        others = tuple(
            f for f in ("torch", "tensorflow", "keras", "jax", "grain") if f != framework
        )
        if adapter == "tf":
            others = tuple(f for f in others if f != "keras")
        if adapter == "grain":  # Grain's records feed JAX
            others = tuple(f for f in others if f != "jax")
        found += _violations((f"chronica.adapters.{adapter}",), others)
    assert found == []


def test_import_chronica_reaches_no_framework_at_module_level():
    """What ``import chronica`` runs: the module-level imports of ``chronica`` and of every
    first-party module they reach (the lazy faces are imports inside functions)."""
    modules = graph()
    seen, todo, reached = set(), ["chronica"], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imp in modules[name].imports:
            if imp.in_function or imp.type_checking:
                continue
            if imp.target in modules:
                # Importing a submodule initialises its packages first.
                parts = imp.target.split(".")
                todo += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            elif _in(imp.target, FRAMEWORKS):
                reached.append(f"{name}:{imp.line} imports {imp.target}")
    assert "chronica.core" in seen
    assert reached == []
