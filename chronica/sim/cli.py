"""``chronica simulate``: compare chronica's configurations with torch's sampler on a
simulated cluster (see ``docs/simulate.md``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from chronica.core.checks import is_int
from chronica.core.pipeline import SCHEDULES, Pipeline
from chronica.sim.engine import (
    DEFAULT_STRATEGIES,
    SimOptions,
    SimulationResult,
    check_simulated,
    simulate,
)
from chronica.sim.pipeline import PipelineModel
from chronica.sim.report import format_table, plot
from chronica.sim.sizes import SizeDistribution, read_sizes, resample
from chronica.sim.speeds import PROFILE_HELP
from chronica.sim.timing import ALGORITHMS, AllReduceModel, ComputeModel

__all__ = ["build_parser", "main", "options_from_args", "sizes_from_args"]

logger = logging.getLogger("chronica.sim")

DEFAULT_SAMPLES = 100_000


def build_parser() -> argparse.ArgumentParser:
    """The ``chronica simulate`` argument parser."""
    p = argparse.ArgumentParser(
        prog="chronica simulate",
        description="Discrete-event simulation of synchronous data-parallel training: "
        "chronica's real scheduler against torch's DistributedSampler and length-grouped "
        "batching, on W simulated ranks.",
        epilog="chronica simulate gradients --help: the gradient-communication model "
        "(FIFO, priority and DDP buckets on a link). chronica simulate context-parallel "
        "--help: step plans with outliers sharded over context-parallel groups.",
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--sizes",
        metavar="FILE",
        help="sizes file: text (one per line), .npy, .csv or .parquet (with --column)",
    )
    data.add_argument("--column", metavar="NAME", help="column of a .csv/.parquet --sizes file")
    data.add_argument(
        "--dist",
        default="lognormal:5:1",
        metavar="SPEC",
        help="without --sizes: lognormal[:MU[:SIGMA]], uniform[:LOW[:HIGH]] or "
        "bimodal[:SHORT[:LONG[:FRACTION_LONG]]] (default lognormal:5:1)",
    )
    data.add_argument(
        "--samples",
        type=int,
        metavar="N",
        help=f"samples: drawn from --dist (default {DEFAULT_SAMPLES:,}), or "
        "resampled with replacement from --sizes (default: the file as it is)",
    )
    run = p.add_argument_group("training")
    run.add_argument("--world", type=int, default=8, help="ranks (1..4096, default 8)")
    run.add_argument("--batch-size", type=int, help="global batch (default 16 per rank)")
    run.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--cost",
        default="linear",
        help="linear, quadratic, or A,B,C for A + B*s + C*s^2 (default linear)",
    )
    run.add_argument("--speeds", default="constant", help=PROFILE_HELP)
    run.add_argument(
        "--config",
        action="append",
        metavar="SPEC",
        help="a configuration, repeatable: torch, length-grouped, static, pool, "
        "guided or dynamic, then ,key=value options (e.g. dynamic,window=8; "
        "static,shuffle=partial,q=0.1); default: " + " ".join(DEFAULT_STRATEGIES),
    )
    run.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="G",
        help="group ranks into nodes of G (data movement, local/partial shuffles)",
    )
    pipe = p.add_argument_group("pipeline (every rank a pipelined replica; see docs/pipelines.md)")
    pipe.add_argument(
        "--pipeline-stages",
        type=int,
        metavar="S",
        help="pipeline stages per replica: a rank's load becomes its micro-batches' "
        "makespan (packed configurations: their micro-batches; others: one sample each)",
    )
    pipe.add_argument(
        "--virtual-stages", type=int, default=1, metavar="V", help="chunks per stage (default 1)"
    )
    pipe.add_argument(
        "--pipeline-schedule",
        choices=SCHEDULES,
        help="default: interleaved with --virtual-stages >= 2, else 1f1b",
    )
    pipe.add_argument(
        "--backward-ratio", type=float, default=2.0, help="backward over forward time (2.0)"
    )
    pipe.add_argument(
        "--plan-order",
        action="store_true",
        help="run micro-batches in the plan's order instead of order_micro_batches's",
    )
    time_model = p.add_argument_group("time model")
    time_model.add_argument(
        "--seconds-per-cost",
        type=float,
        default=2.5e-5,
        help="compute seconds per unit of cost (default 2.5e-5)",
    )
    time_model.add_argument(
        "--fixed",
        type=float,
        default=0.0,
        help="compute seconds per step whatever the load (default 0)",
    )
    time_model.add_argument(
        "--overhead",
        type=float,
        default=0.0,
        help="seconds per step outside compute and all-reduce (default 0)",
    )
    time_model.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="sigma of lognormal noise on every compute time (default 0)",
    )
    time_model.add_argument(
        "--cores",
        type=int,
        default=0,
        help="processors the ranks share, e.g. a cluster emulated on one host (default 0: a "
        "device per rank)",
    )
    time_model.add_argument(
        "--coordinator-cpu",
        type=float,
        default=0.0,
        help="with --cores: processor seconds per step of the dynamic kind's coordinator on "
        "rank 0's host (default 0)",
    )
    time_model.add_argument("--allreduce", choices=ALGORITHMS, default="ring")
    time_model.add_argument(
        "--latency", type=float, default=5e-6, help="seconds per all-reduce hop (default 5e-6)"
    )
    time_model.add_argument(
        "--bandwidth",
        type=float,
        default=12.5e9,
        help="bytes per second per link (default 12.5e9: 100 Gbit/s)",
    )
    time_model.add_argument(
        "--grad-bytes",
        type=float,
        default=1e8,
        help="gradient bytes all-reduced per step (default 1e8)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--plot", metavar="PNG", help="write the comparison plot here")
    out.add_argument(
        "--out-dir", metavar="DIR", help="write simulate.png and simulate.json into DIR"
    )
    out.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    out.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    return p


def sizes_from_args(args: argparse.Namespace) -> np.ndarray:
    """The sizes the arguments name: ``--sizes`` (resampled to ``--samples``) or ``--dist``.
    ``--samples`` is checked against the simulator's bounds before anything is drawn."""
    if args.samples is not None and is_int(args.samples) and args.samples > 0:
        check_simulated(args.samples, args.epochs if is_int(args.epochs) else 1)
    if args.sizes:
        sizes = read_sizes(args.sizes, args.column)
        return sizes if args.samples is None else resample(sizes, args.samples, args.seed)
    if args.column:
        raise ValueError("--column needs --sizes FILE (a .csv or .parquet file)")
    samples = DEFAULT_SAMPLES if args.samples is None else args.samples
    return SizeDistribution.parse(args.dist).draw(samples, args.seed)


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """``SimOptions`` from the parsed arguments (validated; errors name the flag)."""
    return SimOptions(
        world=args.world,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        cost=_cost(args.cost),
        speeds=args.speeds,
        compute=ComputeModel(
            args.seconds_per_cost,
            args.fixed,
            args.overhead,
            args.noise,
            args.cores,
            args.coordinator_cpu,
        ),
        allreduce=AllReduceModel(args.latency, args.bandwidth, args.grad_bytes, args.allreduce),
        strategies=tuple(args.config or DEFAULT_STRATEGIES),
        ranks_per_node=args.ranks_per_node,
        pipeline=_pipeline(args),
    )


def _pipeline(args: argparse.Namespace) -> PipelineModel | None:
    if args.pipeline_stages is None:
        given = args.virtual_stages != 1 or args.pipeline_schedule or args.plan_order
        if given or args.backward_ratio != 2.0:
            raise ValueError(
                "--virtual-stages, --pipeline-schedule, --backward-ratio and --plan-order "
                "describe a pipeline: give --pipeline-stages S too"
            )
        return None
    try:
        pipeline = Pipeline(
            args.pipeline_stages,
            args.virtual_stages,
            args.pipeline_schedule,
            args.backward_ratio,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--pipeline-stages/--virtual-stages/--pipeline-schedule: {exc}") from None
    return PipelineModel(pipeline, order=not args.plan_order)


def _cost(text: str) -> Any:
    if "," not in text:
        return text
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(
            f"--cost {text!r}: give linear, quadratic or three numbers A,B,C"
        ) from None


def check_plotting(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` naming the install when a plot is asked for (``--plot``,
    ``--out-dir``) and matplotlib is missing: before anything is simulated."""
    if (args.plot or args.out_dir) and importlib.util.find_spec("matplotlib") is None:
        flag = "--plot" if args.plot else "--out-dir"
        raise ValueError(
            f"{flag} draws with matplotlib, which is not installed: pip install matplotlib "
            '(or pip install -e ".[bench]"), or leave out the flag'
        )


def _write(result: SimulationResult, args: argparse.Namespace) -> list[str]:
    """Write the JSON result where asked; returns the paths written."""
    written = []
    payload = json.dumps(result.to_dict(), indent=1)
    if args.json == "-":
        print(payload)
    elif args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(payload)
        written.append(args.json)
    if args.out_dir:
        folder = Path(args.out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "simulate.json").write_text(payload)
        written.append(str(folder / "simulate.json"))
    return written


def _plots(result: SimulationResult, args: argparse.Namespace) -> list[str]:
    """Draw the plots asked for; returns their paths."""
    written = []
    if args.out_dir:
        written.append(str(plot(result, Path(args.out_dir) / "simulate.png")))
    if args.plot:
        written.append(str(plot(result, args.plot)))
    return written


def main(argv: list[str] | None = None) -> int:
    """Run ``chronica simulate [options]``; print the table; return the exit code.
    ``chronica simulate gradients ...`` runs the gradient-communication model instead,
    ``chronica simulate context-parallel ...`` the context-parallel model."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gradients"]:
        from chronica.sim.grad_cli import main as gradients_main

        return gradients_main(argv[1:])
    if argv[:1] == ["context-parallel"]:
        from chronica.sim.context_cli import main as context_main

        return context_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        options = options_from_args(args)
        sizes = sizes_from_args(args)
        check_plotting(args)
        result = simulate(sizes, options, progress=False if args.quiet else None)
        written = _write(result, args)
    except (OSError, ValueError) as exc:
        print(f"chronica simulate: error: {exc}", file=sys.stderr)
        return 2
    shown = not args.quiet and args.json != "-"
    if shown:
        print(format_table(result), flush=True)  # before the plots, which may fail
    try:
        written += _plots(result, args)
    except (OSError, ValueError) as exc:
        print(f"chronica simulate: error: {exc}", file=sys.stderr)
        return 2
    if shown:
        for path in written:
            print(f"-> {path}")
    logger.info("chronica simulate took %.1f s", time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
