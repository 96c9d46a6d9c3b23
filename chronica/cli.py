"""The ``chronica`` command (also ``python -m chronica``): ``demo``, ``simulate``,
``bench`` and ``coordinator``.

Framework imports happen inside the subcommand that needs them, so ``chronica --help``
starts fast and works without any deep-learning framework installed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["checkout_root", "main"]


BENCH_FIX = (
    "chronica bench runs the benchmarks package of a source checkout, and this chronica is "
    "not installed from one: clone the repository, `pip install -e .` in it, then run "
    "`chronica bench` (or `python -m benchmarks` from the checkout's root)"
)


def checkout_root() -> Path | None:
    """The source checkout this ``chronica`` was imported from, or ``None`` when there is none.

    A checkout is the folder holding the ``chronica`` package next to the ``benchmarks``
    package (``benchmarks/__main__.py``); an installed wheel has no benchmarks.

    Example::

        >>> root = checkout_root()  # e.g. Path('/src/chronica') after `pip install -e .`
    """
    root = Path(__file__).resolve().parents[1]
    return root if (root / "benchmarks" / "__main__.py").is_file() else None


def _run_bench(args: list[str]) -> int:
    """``python -m benchmarks ARGS`` of the checkout, in this process (so ``--log-level``
    applies to it too)."""
    root = checkout_root()
    if root is None:
        raise SystemExit(BENCH_FIX)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import benchmarks

    loaded = Path(benchmarks.__file__ or "").resolve().parent
    if loaded != root / "benchmarks":
        raise SystemExit(
            f"chronica bench: the module `benchmarks` was imported from {loaded}, not from "
            f"the checkout {root}; run it where no other `benchmarks` package shadows it"
        )
    from benchmarks.run_all import main as bench_main

    return int(bench_main(args) or 0)


def _run_demo(args: list[str]) -> int:
    from chronica.demo.cli import main as demo_main  # imports torch only in the ranks

    return int(demo_main(args) or 0)


def _run_simulate(args: list[str]) -> int:
    from chronica.sim.cli import main as simulate_main

    return int(simulate_main(args) or 0)


def _run_coordinator(args: list[str]) -> int:
    from chronica.comm.standalone import main as coordinator_main

    return int(coordinator_main(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``chronica`` console script."""
    parser = argparse.ArgumentParser(
        prog="chronica",
        description="Data scheduling for distributed deep learning on imbalanced data.",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="logging level (default WARNING)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo",
        help="2-process torch.distributed training: torch's sampler vs chronica's",
        add_help=False,
    )
    sub.add_parser(
        "simulate",
        help="simulate W ranks: chronica's scheduler vs torch's sampler, step times",
        add_help=False,
    )
    sub.add_parser(
        "bench", help="run the benchmarks and regenerate docs/benchmarks.md", add_help=False
    )
    sub.add_parser(
        "coordinator",
        help="serve kind='dynamic' plans to the ranks of a multi-node job",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=args.log_level, format="%(name)s %(levelname)s %(message)s")
    runners = {
        "demo": _run_demo,
        "simulate": _run_simulate,
        "bench": _run_bench,
        "coordinator": _run_coordinator,
    }
    return runners[args.command](rest)


if __name__ == "__main__":
    sys.exit(main())
