"""Which benchmarks exist, in which order they run and render, and how to rerun one.

The one list both the runner (``benchmarks.run_all``) and the page (``benchmarks.report``)
read, so neither imports the other for it. A benchmark is a module ``benchmarks.<name>``
with ``run(quick, ...) -> dict`` and ``format_table(result) -> str``; those in ``SECTIONS``
also have ``render_markdown(result, img_dir) -> str``.

Example::

    >>> from benchmarks.catalog import BENCHMARKS, reproduce_command
    >>> BENCHMARKS[0], reproduce_command("planning", quick=True)
    ('balance', 'python -m benchmarks --only planning --quick')
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = [
    "BENCHMARKS",
    "DATA_DIR_BENCHMARKS",
    "DEVICE_SECTIONS",
    "PAGE_SECTIONS",
    "REPRODUCE",
    "SECTIONS",
    "load",
    "reproduce_command",
]

# Modules that render their own section of the page, in page order. simulate comes after
# hetero_run: it calibrates on benchmarks/results/hetero_run.json.
SECTIONS = (
    "dynamic",
    "soak",
    "coordinator",
    "hetero_run",
    "simulate",
    "adapters",
    "gradsched",
    "grad_sim_validation",
    "scaling",
    "packing",
    "lockstep",
    "outliers",
    "context_parallel",
    "wall",
    "pipeline",
    "packing_e2e",
    "hf_rebalance",
    "fsdp_micro",
    "sources",
    "streaming",
)
BENCHMARKS = ("balance", "planning", "movement", "quality", *SECTIONS)
# Sections measured on a GPU machine by their own command (never by the runner, which runs
# where there is no GPU); the page renders them from their JSON like the others.
DEVICE_SECTIONS = ("device.attention_cost",)
PAGE_SECTIONS = (*SECTIONS, *DEVICE_SECTIONS)
# The benchmarks that read the real lengths files (``run(quick, data_dir=...)``).
DATA_DIR_BENCHMARKS = ("balance", "packing", "lockstep", "outliers", "context_parallel", "wall")
# Runs every benchmark from the repository root (`chronica bench` runs the same).
REPRODUCE = "python -m benchmarks"


def reproduce_command(name: str, quick: bool, data_dir: Path | None = None) -> str:
    """The command line (from the repository root) that reruns benchmark ``name`` alone.

    Args:
        name: a benchmark of ``BENCHMARKS``.
        quick: whether the run used ``--quick``.
        data_dir: the ``--data-dir`` of the run; named only for the benchmarks that read it.

    Example::

        >>> reproduce_command("balance", quick=False, data_dir=Path("/data"))
        'python -m benchmarks --only balance --data-dir /data'
    """
    command = f"{REPRODUCE} --only {name}"
    if quick:
        command += " --quick"
    if name in DATA_DIR_BENCHMARKS and data_dir is not None:
        command += f" --data-dir {data_dir}"
    return command


def load(name: str) -> ModuleType:
    """Import benchmark ``name`` (the module ``benchmarks.<name>``).

    Raises ``ModuleNotFoundError`` naming the missing file when there is no such module (an
    ``ImportError`` of something the benchmark itself imports propagates as it is).

    Args:
        name: a benchmark of ``BENCHMARKS``.

    Example::

        >>> load("planning").render_markdown  # doctest: +ELLIPSIS
        <function render_markdown at ...>
    """
    module = f"{__package__}.{name}"
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(
            f"benchmarks/{name}.py not found in {Path(__file__).resolve().parent}"
        )
    return importlib.import_module(module)
