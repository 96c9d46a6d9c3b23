"""Fill numba's cache of chronica's kernels before the suite's workers start.

The kernels are ``@njit(cache=True)``: the first process that calls one compiles it and
writes it to ``__pycache__`` beside the sources; later processes load it. In a fresh clone
every xdist worker, and every process a multi-process test starts before a worker has
written the cache, would compile the same kernels (about a minute of CPU each). The suite's
controller runs :func:`fill` once instead, before it starts the workers.

The workload is the ``Example::`` blocks of the pure floors (``chronica.core``,
``chronica.sim``, checked by ``tests/test_docstring_examples.py``), which call every
kernel's public entry point. They run in one process per group of modules below, at once
(the packing kernels and the rest take about as long to compile); a group's own results
are not checked here (the tests check them). A group whose process fails leaves its kernels
to be compiled where they are first called, as without this step.
"""

from __future__ import annotations

import doctest
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("packing", "rest")


def modules(group: str) -> list[str]:
    """The modules of ``chronica.core`` and ``chronica.sim`` in ``group`` (``packing``: the
    step planner's; ``rest``: all others)."""
    names = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for floor in ("core", "sim")
        for path in (ROOT / "chronica" / floor).rglob("*.py")
    )
    return [n for n in names if ("packing" in n.split(".")) == (group == "packing")]


def fill(timeout: float) -> list[str]:
    """Run every group's examples, one process per group at once, and wait for them;
    returns the groups whose process failed or was still running after ``timeout`` (then
    stopped), each with the end of its error output.

    Args:
        timeout: seconds to wait for each group.

    Example::

        fill(timeout=600)   # about a minute on 2 cores in a fresh clone, 2 s once cached
    """
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    failed = []
    with tempfile.TemporaryDirectory(prefix="chronica-kernels-") as tmp:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, group],
                cwd=tmp,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for group in GROUPS
        ]
        for proc, group in zip(procs, GROUPS, strict=True):
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                err += f"\nstill running after {timeout:g} s"
            if proc.returncode:
                failed.append(f"{group}: {err[-2000:]}")
    return failed


if __name__ == "__main__":
    for name in modules(sys.argv[1]):
        doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=False)
