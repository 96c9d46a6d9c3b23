"""The ``chronica`` command: ``chronica demo``, ``chronica bench`` and ``chronica coordinator``.

Framework imports happen inside the subcommand that needs them, so ``chronica --help``
starts fast and works without any deep-learning framework installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

__all__ = ["main"]


def _find_benchmarks() -> Path:
    candidates = [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[1] / "benchmarks"]
    for folder in candidates:
        if (folder / "run_all.py").is_file():
            return folder
    raise SystemExit(
        "chronica bench: benchmarks/run_all.py not found; run it from a source checkout of "
        "chronica (the benchmarks are not part of the installed package)"
    )


def _run_bench(args: list[str]) -> int:
    script = _find_benchmarks() / "run_all.py"
    spec = importlib.util.spec_from_file_location("chronica_benchmarks_run_all", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(args) or 0)


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
