"""``chronica demo``'s command line: parse and check the arguments, launch, print the table.

Parsing imports no torch, so ``chronica demo --help`` and argument errors are fast; the ranks
import it (``chronica.demo.worker``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

from chronica.demo.config import SAMPLERS, DemoConfig, load_lengths, make_lengths
from chronica.demo.launch import DemoError, launch
from chronica.demo.report import format_report
from chronica.sim.speeds import PROFILE_HELP
from chronica.sizes_io import SIZES_HELP

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None) -> tuple[DemoConfig, float]:
    """The checked configuration and the ``--timeout`` in seconds; exits (argparse) on a bad
    argument, raises ``ValueError``/``OSError`` for an unreadable ``--lengths`` file."""
    parser = argparse.ArgumentParser(
        prog="chronica demo",
        description="Train a small sequence model on variable-length data in a real "
        "multi-process torch.distributed job (gloo, loopback), once with torch's "
        "DistributedSampler and once with chronica's, and compare step balance and epoch time.",
    )
    parser.add_argument("--samples", type=int, default=None, help="samples (default 2048)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (default 32)")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per run (default 6; 2 with --cost quadratic)",
    )
    parser.add_argument("--kind", choices=("static", "guided"), default="static")
    parser.add_argument(
        "--cost",
        choices=("linear", "quadratic"),
        default="linear",
        help="linear: per-token MLP; quadratic: adds per-sequence attention",
    )
    parser.add_argument(
        "--lengths",
        metavar="FILE",
        help=f"token lengths (default: generated); the {SIZES_HELP}",
    )
    parser.add_argument("--column", metavar="NAME", help="column of a .csv/.parquet --lengths file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--speeds",
        default="constant",
        help=f"emulated rank speeds (default constant): {PROFILE_HELP}",
    )
    parser.add_argument(
        "--samplers",
        default=None,
        help="comma list of torch, chronica, dynamic (default torch,chronica; with --speeds "
        "also dynamic)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny configuration (tests)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="stop everything after this many seconds"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    samples = args.samples if args.samples is not None else (192 if quick else 2048)
    if args.lengths:
        lengths = load_lengths(args.lengths, args.samples, args.column)
        source = args.lengths
    else:
        if args.column:
            parser.error("--column needs --lengths FILE (a .csv or .parquet file)")
        if samples < 1:
            parser.error(f"--samples {samples} must be >= 1")
        lengths = make_lengths(samples, seed=args.seed, high=1024 if quick else 4096)
        source = f"lognormal(5, 1) clipped to [8, {1024 if quick else 4096}], seed {args.seed}"
    config = DemoConfig(
        lengths=lengths.tolist(),
        lengths_source=source,
        batch_size=args.batch_size or (16 if quick else 32),
        epochs=args.epochs or (1 if quick else 2 if args.cost == "quadratic" else 6),
        kind=args.kind,
        cost=args.cost,
        seed=args.seed,
        world_size=args.world_size,
        dim=32 if quick else 128,
        hidden=64 if quick else 512,
        warmup_steps=1 if quick else 3,
        progress=not args.no_progress,
        speeds=args.speeds,
        samplers=tuple(args.samplers.split(","))
        if args.samplers
        else SAMPLERS[:2] + (("dynamic",) if args.speeds != "constant" else ()),
    )
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return config, args.timeout


def main(argv: list[str] | None = None) -> int:
    """Run the demo (``chronica demo [options]``); print the table; return the exit code."""
    started = time.perf_counter()
    try:
        config, timeout_s = parse_args(argv)
    except (OSError, ValueError) as exc:  # e.g. a missing or malformed --lengths file
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(
            "chronica demo needs PyTorch: pip install torch==2.13.0 (or chronica[torch])"
        )
    print(
        f"chronica demo: starting {config.world_size} processes; each trains once per sampler "
        f"({', '.join(config.samplers)}), alternating epochs",
        file=sys.stderr,
        flush=True,
    )
    try:
        results = launch(config, timeout_s)
    except DemoError as exc:
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("chronica demo: interrupted; all ranks stopped", file=sys.stderr)
        return 130
    print(format_report(config, results, time.perf_counter() - started), flush=True)
    return 0
