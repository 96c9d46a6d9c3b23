"""Test configuration: the shared helpers (``tests/helpers``) are importable by every test,
hypothesis runs derandomized so every run checks the same cases, and every test that starts
other processes is marked ``multiprocess``.

The suite mirrors the package's layers: ``core/``, ``comm/``, ``runtime/``, ``sim/``,
``adapters/<framework>/``, ``benchmarks/``; tests of the whole package (docs, examples, the
demo, types, imports) sit at the top. Worker scripts of multi-process tests live in
``helpers/`` beside ``workers.py``, which starts them.

``multiprocess`` is found, not declared: a test is in it when its body, a fixture it uses, or
a function of its module or of ``tests/helpers`` it calls (transitively) names something
that starts a process (``run_workers``, ``subprocess``, ``Popen``, ...). So the group
cannot go stale as tests are added. Processes a library starts inside the test's own
process (a data loader's workers) do not count. ``python -m pytest -q -m "not
multiprocess"`` is the fast check; CI runs all.

Under ``-n`` (xdist) the controller fills numba's cache of chronica's kernels before it
starts the workers (``helpers/kernel_cache.py``), so that in a fresh clone the workers and
the processes the tests start load the kernels instead of each compiling them.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

import kernel_cache
from workers import scaled

settings.register_profile(
    "chronica",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("chronica")

# Names whose use starts a process: the workers helpers, the subprocess module, the
# multiprocessing ones and the shared integration and dynamic job runners.
_STARTS_PROCESSES = frozenset(
    {
        "run_workers",
        "start_workers",
        "run_job",
        "subprocess",
        "Popen",
        "Process",
        "get_context",
        "check_output",
    }
)


_HELPERS = Path(__file__).resolve().parent / "helpers"


@cache
def _process_starters(path: Path) -> frozenset[str]:
    """The functions of the module at ``path`` that start a process, directly or through
    another function of the module (called, or taken as a fixture argument) or one imported
    from ``tests/helpers`` that does."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and (_HELPERS / f"{node.module}.py").is_file()
        for alias in node.names
        if alias.name in _process_starters(_HELPERS / f"{node.module}.py")
    }
    functions = {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    uses = {
        name: {
            n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))
        }
        | {a.arg for a in node.args.args}
        for name, node in functions.items()
    }
    starters = {name for name, used in uses.items() if used & (_STARTS_PROCESSES | imported)}
    grew = True
    while grew:
        more = {name for name, used in uses.items() if used & starters} - starters
        starters |= more
        grew = bool(more)
    return frozenset(starters)


def pytest_configure(config: pytest.Config) -> None:
    # Only the xdist controller (a worker has ``workerinput``), only when it starts workers.
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    for failure in kernel_cache.fill(timeout=scaled(600)):
        print(f"numba's cache was not filled before the workers started ({failure})")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        starters = _process_starters(Path(str(item.fspath)))
        if item.originalname in starters or set(item.fixturenames) & starters:
            item.add_marker(pytest.mark.multiprocess)
    # The files that start the most processes first: under ``-n`` (one file per worker at a
    # time, pyproject.toml) the longest files then start early instead of ending the run alone.
    started = Counter(str(item.fspath) for item in items if item.get_closest_marker("multiprocess"))
    items.sort(key=lambda item: -started[str(item.fspath)])
