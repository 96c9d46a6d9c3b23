"""``chronica demo``'s command line: parse and check the arguments, launch, print the table.

Parsing imports no torch, so ``chronica demo --help`` and argument errors are fast; the ranks
import it (``chronica.demo.worker``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chronica.demo.config import (
    DEFAULT_HIGH,
    SAMPLERS,
    DemoConfig,
    load_lengths,
    make_lengths,
    plural,
)
from chronica.demo.launch import DemoError, launch
from chronica.demo.report import format_report, summarize
from chronica.demo.warmup import kernels_cached, warm_up
from chronica.sim.speeds import PROFILE_HELP
from chronica.sizes_io import SIZES_HELP

__all__ = ["main", "parse_args"]


def _worlds(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a comma list of rank counts, e.g. 8,64,1024, or none"
        ) from None


def parse_args(argv: list[str] | None) -> tuple[DemoConfig, float]:
    """The checked configuration and the ``--timeout`` in seconds; exits (argparse) on a bad
    argument, raises ``ValueError``/``OSError`` for an unreadable ``--lengths`` file."""
    config, timeout_s, _, _ = _parse(argv)
    return config, timeout_s


def _parse(argv: list[str] | None) -> tuple[DemoConfig, float, str | None, bool]:
    parser = argparse.ArgumentParser(
        prog="chronica demo",
        description="Train a small sequence model with attention on variable-length data in a "
        "real multi-process torch.distributed job (gloo, loopback), with torch's "
        "DistributedSampler and with chronica's (steps interleaved, the same initialisation, "
        "several seeds). The cost model is fitted to the ranks' measured CPU time first. "
        "Prints each sampler's measured and predicted per-step balance, the speed-up in the "
        "slowest rank's compute, held-out loss and accuracy, and a simulation of the same job "
        "on 8 to 1024 ranks. A few minutes on 2 cores (it prints an estimate first; the first "
        "run in an environment also compiles chronica's kernels, once).",
    )
    parser.add_argument("--samples", type=int, default=None, help="samples (default 1024)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (default 32)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 4)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="model initialisations, each trained once per sampler (default 3)",
    )
    parser.add_argument("--kind", choices=("static", "guided"), default="static")
    parser.add_argument(
        "--cost",
        choices=("linear", "quadratic"),
        default="quadratic",
        help="quadratic (default): per-token MLP and per-sequence attention; linear: the MLP only",
    )
    parser.add_argument(
        "--calibration-steps",
        type=int,
        default=None,
        help="steps that fit the cost model to measured CPU time before training (default "
        "24; 0: the a-priori model, no refits)",
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
    parser.add_argument(
        "--simulate",
        type=_worlds,
        default=None,
        metavar="RANKS",
        help="world sizes to simulate the calibrated job on, besides the real one (default "
        "8,64,256,1024; none: no simulation)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the configuration, every rank's per-step measurements, the summary "
        "and the simulated projection as JSON",
    )
    parser.add_argument("--quick", action="store_true", help="tiny configuration (tests)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print the report only (no progress bar, no status lines): a clean report when "
        "piped to a file",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin each rank to a core of its own (by default they are, where the "
        "machine has a core per rank)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="stop everything after this many seconds"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    high = 512 if quick else DEFAULT_HIGH
    samples = args.samples if args.samples is not None else (192 if quick else 1024)
    if args.lengths:
        lengths = load_lengths(args.lengths, args.samples, args.column)
        source = args.lengths
    else:
        if args.column:
            parser.error("--column needs --lengths FILE (a .csv or .parquet file)")
        if samples < 1:
            parser.error(f"--samples {samples} must be >= 1")
        lengths = make_lengths(samples, seed=args.seed, high=high)
        source = f"lognormal(5, 1) clipped to [8, {high}], seed {args.seed}"

    def pick(value: int | None, quick_value: int, default: int) -> int:
        return value if value is not None else (quick_value if quick else default)

    config = DemoConfig(
        lengths=lengths.tolist(),
        lengths_source=source,
        batch_size=pick(args.batch_size, 16, 32),
        epochs=pick(args.epochs, 1, 4),
        kind=args.kind,
        cost=args.cost,
        seed=args.seed,
        world_size=args.world_size,
        dim=32 if quick else 64,
        hidden=64 if quick else 256,
        warmup_steps=1 if quick else 2,
        progress=not (args.no_progress or args.quiet),
        pin=not args.no_pin,
        speeds=args.speeds,
        samplers=tuple(args.samplers.split(","))
        if args.samplers
        else SAMPLERS[:2] + (("dynamic",) if args.speeds != "constant" else ()),
        seeds=pick(args.seeds, 2, 3),
        calibration_steps=pick(args.calibration_steps, 4, 24),
        eval_samples=64 if quick else 512,
        simulate_worlds=args.simulate
        if args.simulate is not None
        else ((8,) if quick else (8, 64, 256, 1024)),
    )
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return config, args.timeout, args.json, args.quiet


def _project(config: DemoConfig, results: dict[str, Any]) -> list[dict[str, Any]]:
    """The simulated projection of the calibrated job (``chronica.demo.scale``), or none
    with emulated speeds (``chronica simulate --speeds`` covers those)."""
    if not config.simulate_worlds or config.speeds != "constant":
        return []
    from chronica import CostModel
    from chronica.demo.scale import project

    calibration = results.get("calibration", {})
    coefficients = calibration.get("final", calibration).get("coefficients")
    if not coefficients:
        return []
    worlds = sorted({config.world_size, *config.simulate_worlds})
    if config.progress:
        print(
            f"chronica demo: simulating the same job on {', '.join(map(str, worlds))} ranks",
            file=sys.stderr,
            flush=True,
        )
    kind = config.kind  # "static" or "guided": the simulator's strategy of that name
    return project(
        config.lengths,
        CostModel(*coefficients),
        config.local_batch,
        worlds,
        kind=kind,
        seed=config.seed,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo (``chronica demo [options]``); print the table; return the exit code."""
    started = time.perf_counter()
    try:
        config, timeout_s, json_path, quiet = _parse(argv)
    except (OSError, ValueError) as exc:  # e.g. a missing or malformed --lengths file
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(
            "chronica demo needs PyTorch: pip install torch==2.13.0 (or chronica[torch])"
        )
    first = (
        f"calibrate the cost model ({config.calibration_steps} steps) and estimate the run time"
        if config.calibration_steps
        else "take the a-priori cost model (--calibration-steps 0)"
    )
    say = (lambda text: None) if quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    cached = kernels_cached()
    if not cached:
        say(
            "chronica demo: first run here: numba compiles chronica's balancing kernels once "
            "(about 1-2 min on 2 cores; later runs load them from the cache), before the "
            "processes start"
        )
    compiled = warm_up(config)
    if not cached:
        say(f"chronica demo: kernels compiled and cached in {compiled:.0f} s")
    say(
        f"chronica demo: starting {config.world_size} processes; they {first}, then train "
        f"{plural(config.seeds, 'seed')} x ({', '.join(config.samplers)}) with steps "
        f"interleaved"
    )
    try:
        results = launch(config, timeout_s)
    except DemoError as exc:
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("chronica demo: interrupted; all ranks stopped", file=sys.stderr)
        return 130
    projection = _project(config, results)
    print(format_report(config, results, time.perf_counter() - started, projection), flush=True)
    if json_path:
        payload = {
            "config": asdict(config),
            "summary": summarize(config, results),
            "projection": projection,
            "results": results,
        }
        Path(json_path).write_text(json.dumps(payload))
        say(f"-> {json_path}")
    return 0
