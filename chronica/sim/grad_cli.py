"""``chronica simulate gradients``: step time and exposed communication of data-parallel
training under FIFO, priority and DDP-bucket gradient communication, simulated (see
``docs/simulate.md``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from chronica.sim.grad_profiles import PROFILES, DeviceModel, profile_layers
from chronica.sim.gradients import POLICIES, Layer, Link, Policy, StepResult, simulate_step

__all__ = ["Case", "build_parser", "main", "parse_rate", "run_cases"]

_RATE_UNITS = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}


def parse_rate(name: str, text: str) -> float:
    """A link rate (``10gbit``, ``400mbit``, like ``tc``; or bytes per second) in bytes per
    second; ``ValueError`` naming ``name`` otherwise."""
    low = text.strip().lower()
    unit = next((u for u in _RATE_UNITS if low.endswith(u)), "")
    try:
        value = float(low.removesuffix(unit)) * _RATE_UNITS.get(unit, 1.0)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"{name} {text!r} must be a positive rate such as 10gbit, 400mbit or 1.25e9 "
            "(bytes per second)"
        )
    return value


def _int_list(name: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 2:
        raise ValueError(f"{name} {text!r} must be comma-separated ints >= 2, e.g. 8,16,64")
    return values


def read_layers(path: str) -> list[Layer]:
    """Layers from a JSON file: a list of objects with ``name``, ``tensor_bytes`` (list),
    ``forward_s``, ``backward_s`` and optionally ``update_s``, in forward order."""
    try:
        rows = json.loads(Path(path).read_text())
        return [
            Layer(
                str(r["name"]),
                tuple(int(b) for b in r["tensor_bytes"]),
                float(r["forward_s"]),
                float(r["backward_s"]),
                float(r.get("update_s", 0.0)),
            )
            for r in rows
        ]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"--layers {path}: expected a JSON list of {{name, tensor_bytes, forward_s, "
            f"backward_s[, update_s]}} objects ({exc!r})"
        ) from None


@dataclass(frozen=True)
class Case:
    """One simulated configuration: ``ranks`` on a link of ``rate`` bytes per second, and
    each policy's result (in the order asked)."""

    ranks: int
    link: str
    rate: float
    results: list[StepResult]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {
            "ranks": self.ranks,
            "link": self.link,
            "bytes_per_second": self.rate,
            "results": [r.to_dict() for r in self.results],
        }


def run_cases(
    layers: list[Layer],
    ranks: list[int],
    links: list[str],
    policies: list[Policy],
    latency: float,
    slowdown: float = 0.0,
    queued_latency: float | None = None,
    link_slowdown: float = 0.0,
) -> list[Case]:
    """Every (ranks, link) combination under every policy."""
    cases = []
    for world in ranks:
        for text in links:
            rate = parse_rate("--link", text)
            link = Link(rate, latency, world, queued_latency)
            results = [
                simulate_step(layers, link, p, slowdown, link_slowdown=link_slowdown)
                for p in policies
            ]
            cases.append(Case(world, text, rate, results))
    return cases


def format_cases(cases: list[Case], title: str) -> str:
    """A table: step time, exposed communication and each policy against ``fifo`` and
    ``ddp`` (when simulated); labelled as simulated."""
    width = max([8] + [len(r.policy) + 2 for case in cases for r in case.results])
    lines = [f"SIMULATED gradient communication: {title}"]
    lines.append(
        f"{'ranks':>5} {'link':>8}  {'policy':<{width}}{'step ms':>9}{'exposed':>9}"
        f"{'vs fifo':>9}{'vs ddp':>8}"
    )
    for case in cases:
        step_s_of = {r.policy: r.step_s for r in case.results}
        for r in case.results:
            ratios = [step_s_of[k] / r.step_s if k in step_s_of else None for k in ("fifo", "ddp")]
            shown = "".join(f"{'':>8}" if x is None else f"{x:>8.2f}x" for x in ratios)
            lines.append(
                f"{case.ranks:>5} {case.link:>8}  {r.policy:<{width}}{1e3 * r.step_s:>9.1f}"
                f"{1e3 * r.exposed_s:>9.1f}{shown}"
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``chronica simulate gradients`` argument parser."""
    p = argparse.ArgumentParser(
        prog="chronica simulate gradients",
        description="Simulated step time and exposed communication of data-parallel "
        "training when gradients are all-reduced under FIFO, priority (ByteScheduler, "
        "chronica's torch shim) or DDP buckets, on W ranks joined by links of a given "
        "rate. Every figure is simulated.",
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--profile",
        default="gpt2",
        help="layer profile: "
        + ", ".join(f"{k} ({v[3]})" for k, v in PROFILES.items())
        + " (default gpt2)",
    )
    model.add_argument(
        "--layers",
        metavar="JSON",
        help="measured layers instead of --profile: a JSON list of {name, tensor_bytes, "
        "forward_s, backward_s, update_s}",
    )
    model.add_argument("--batch", type=int, help="per-rank batch (default: the profile's)")
    model.add_argument("--seq-len", type=int, help="tokens per sequence (default: the profile's)")
    model.add_argument(
        "--tflops",
        type=float,
        default=100.0,
        help="sustained device TFLOP/s that turns FLOPs into seconds (default 100)",
    )
    net = p.add_argument_group("cluster")
    net.add_argument("--ranks", default="8,64", help="comma-separated rank counts (default 8,64)")
    net.add_argument(
        "--link",
        default="10gbit,100gbit",
        help="comma-separated link rates, e.g. 10gbit,25gbit,100gbit (default 10gbit,100gbit)",
    )
    net.add_argument(
        "--latency", type=float, default=5e-6, help="seconds per ring hop (default 5e-6)"
    )
    net.add_argument(
        "--queued-latency",
        type=float,
        help="seconds per ring hop of a collective issued while another is on the link "
        "(default: --latency)",
    )
    net.add_argument(
        "--slowdown",
        type=float,
        default=0.0,
        help="compute runs 1/(1+S) as fast while a collective is in flight (a CPU "
        "transport on a host with no spare core; default 0)",
    )
    net.add_argument(
        "--link-slowdown",
        type=float,
        default=0.0,
        help="a collective advances 1/(1+S) as fast while the rank computes (the "
        "transport's CPU work waiting for cores; default 0)",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="repeatable: none, ddp, fifo or priority, then ,key=value knobs (partition=, "
        "credit=, bucket=, first_bucket= in bytes, e.g. priority,partition=4MiB,credit=16MiB); "
        "default: " + " ".join(POLICIES),
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``chronica simulate gradients [options]``; print the table; return the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.tflops <= 0:
            raise ValueError(f"--tflops {args.tflops!r} must be > 0")
        if args.layers:
            layers, title = read_layers(args.layers), args.layers
        else:
            device = DeviceModel(flops=args.tflops * 1e12)
            layers = profile_layers(args.profile, device, args.batch, args.seq_len)
            title = f"{PROFILES[args.profile][3]} at {args.tflops:g} TFLOP/s"
        policies = [Policy.parse(spec) for spec in args.policy or POLICIES]
        ranks = _int_list("--ranks", args.ranks)
        links = args.link.split(",")
        cases = run_cases(
            layers,
            ranks,
            links,
            policies,
            args.latency,
            args.slowdown,
            args.queued_latency,
            args.link_slowdown,
        )
    except (OSError, ValueError) as exc:
        print(f"chronica simulate gradients: error: {exc}", file=sys.stderr)
        return 2
    payload = {"simulated": True, "title": title, "cases": [c.to_dict() for c in cases]}
    if args.json == "-":
        print(json.dumps(payload, indent=1))
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1))
    print(format_cases(cases, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
