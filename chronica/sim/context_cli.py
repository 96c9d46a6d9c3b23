"""``chronica simulate context-parallel``: chronica's step plans with and without context
parallelism on ``W`` simulated devices, timed with the CP groups' key/value exchange
(``chronica.sim.context``; see ``docs/step-planner.md``, "Context parallelism")."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from chronica.sim.context import COMM_ALGORITHMS, CommModel, ContextResult, simulate_context
from chronica.sim.sizes import SizeDistribution, read_sizes

__all__ = ["build_parser", "format_results", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``chronica simulate context-parallel`` argument parser."""
    p = argparse.ArgumentParser(
        prog="chronica simulate context-parallel",
        description="Steps of long-tailed documents planned by chronica.plan_step for W "
        "devices, whole (context_parallel=1) and with outliers sharded over CP groups of g, "
        "timed with the groups' key/value exchange.",
    )
    p.add_argument("--world", type=int, default=256, help="devices W (default 256)")
    p.add_argument("--cp", default="1,2,4,8", help="context-parallel sizes (default 1,2,4,8)")
    p.add_argument("--cap", type=int, default=16384, help="tokens per device and micro-batch")
    p.add_argument("--docs-per-device", type=int, default=4, help="documents per device (4)")
    p.add_argument("--steps", type=int, default=8, help="steps simulated (default 8)")
    p.add_argument("--dist", default="lognormal:6:1.5", help="lengths (default lognormal:6:1.5)")
    p.add_argument("--sizes", metavar="FILE", help="lengths file, sampled with replacement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost", default="0,24576,1", help="A,B,C of A + B*L + C*L^2")
    p.add_argument("--seconds-per-cost", type=float, default=5e-9)
    p.add_argument("--latency", type=float, default=1e-5, help="seconds per hop (1e-5)")
    p.add_argument("--bandwidth", type=float, default=1e11, help="bytes/s per link (1e11)")
    p.add_argument("--kv-bytes", type=float, default=4096.0, help="K+V bytes per token, layer")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--comm", choices=COMM_ALGORITHMS, default="allgather")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    return p


def _steps(args: argparse.Namespace) -> list[np.ndarray]:
    n = args.world * args.docs_per_device
    rng = np.random.default_rng(args.seed)
    if args.sizes:
        pool = read_sizes(args.sizes)
        draws = [pool[rng.integers(0, pool.shape[0], n)] for _ in range(args.steps)]
    else:
        dist = SizeDistribution.parse(args.dist)
        draws = [dist.draw(n, args.seed * 1000 + s) for s in range(args.steps)]
    return [np.clip(np.rint(d), 1, args.cap).astype(np.int64) for d in draws]


def format_results(results: list[ContextResult]) -> str:
    """A table: per ``g``, the mean step, its exchange part, the planner's balance (mean and
    worst slowest device over the mean) and the speed-up over ``g = 1``."""
    base = results[0].step_seconds.mean()
    lines = [
        f"{'g':>3} {'step s':>9} {'exchange s':>11} {'max/mean':>9} {'worst':>7} {'speedup':>8}"
    ]
    for r in results:
        s = r.summary()
        lines.append(
            f"{r.size:>3} {s['step_s']:>9.4f} {s['exchange_s']:>11.4f} {s['balance_mean']:>9.3f} "
            f"{s['balance_worst']:>7.3f} {base / s['step_s']:>7.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``chronica simulate context-parallel [options]``; print the table; the exit code.

    Args:
        argv: the arguments after ``context-parallel`` (default ``sys.argv[1:]``).
    """
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sizes = [int(x) for x in args.cp.split(",")]
        cost = tuple(float(x) for x in args.cost.split(","))
        comm = CommModel(args.latency, args.bandwidth, args.kv_bytes, args.layers, 2, args.comm)
        results = simulate_context(
            _steps(args), args.world, args.cap, sizes, cost, comm, args.seconds_per_cost
        )
    except (OSError, ValueError, TypeError) as exc:
        print(f"chronica simulate context-parallel: error: {exc}", file=sys.stderr)
        return 2
    payload = [r.summary() for r in results]
    if args.json == "-":
        print(json.dumps(payload, indent=1))
        return 0
    if args.json:
        with open(args.json, "w") as file:
            json.dump(payload, file, indent=1)
    print(format_results(results))
    return 0
