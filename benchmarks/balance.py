"""Balance benchmark: per-step max/mean rank cost of chronica's plans and of its peers.

For every case (a size distribution, a world size W, a global batch B and a cost model) and
every repeat (sampler seed × epoch), each method plans the epoch and is scored by
``common.step_metrics``: the mean over steps and the worst step of max/mean rank cost, and
the padding fraction. Tables report the median over repeats. The "exact bound" row is
max(mean rank cost, largest sample)/mean of the global batches that chronica's exact mode
(and torch, and every within-batch method) trains on. The "equal-count bound" row is
informational: it also counts the ``k - 1`` smallest samples that must share a rank with the
largest one (``common.equal_count_bound``), a bound every equal-count method obeys.

Targets checked (and printed, never tuned away):
  * chronica exact's mean is within 0.1% of the exact bound's mean (median over repeats;
    the worst repeat is reported too);
  * chronica exact is never worse than sorted LPT on the same global batches (mean and worst,
    every repeat);
  * chronica pool and guided are at least as good as upstream Chronica and FlatFlow, mean
    and worst (medians), on every case.

Run alone: ``python -m benchmarks --only balance [--quick]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import peers
from benchmarks.common import (
    Assignment,
    equal_count_bound,
    heavy_tailed_sizes,
    lognormal_sizes,
    machine_info,
    read_lengths,
    step_metrics,
)
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.cost import as_cost_model

__all__ = ["CASES", "METHODS", "check_targets", "default_data_dir", "run"]

DATA_SEED = 2024
N = 16384
# Relative slack for comparisons between methods: float sums in a different order.
EPS = 1e-12
BOUND_TOLERANCE = 1e-3

# (key, label): row order of the tables.
METHODS = [
    ("torch", "torch DistributedSampler"),
    ("upstream", "upstream Chronica static"),
    ("flatflow", "FlatFlow (BLDM)"),
    ("hf", "HF BatchRebalance shape, unequal counts"),
    ("lpt", "sorted LPT"),
    ("exact", "chronica exact"),
    ("pool", "chronica pool"),
    ("guided", "chronica guided"),
    ("bound", "exact bound"),
    ("bound_k", "equal-count bound"),
]
TRACED_CASE = "lognormal-8x256-linear"


@dataclass(frozen=True)
class Case:
    """One benchmark setting: where the sizes come from, W, B and the cost model."""

    name: str
    label: str
    source: str
    num_replicas: int
    batch_size: int
    cost: str


CASES = [
    Case(f"{src}-{w}x{b}-{cost}", label, src, w, b, cost)
    for src, label, shapes in (
        ("lognormal", "lognormal(5,1), N=16384", ((8, 256), (64, 2048))),
        ("heavy", "lognormal + 16 samples at 100x median, N=16384", ((8, 256),)),
        ("head500", "head500_lengths.txt", ((4, 32),)),
        ("lee", "lee_lengths.txt", ((8, 64),)),
    )
    for w, b in shapes
    for cost in ("linear", "quadratic")
]

_FILES = {"head500": "head500_lengths.txt", "lee": "lee_lengths.txt"}


def default_data_dir() -> Path:
    """``../shared/data`` next to the repository root (where the real lengths files live)."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _sizes(case: Case, data_dir: Path) -> np.ndarray | None:
    if case.source == "lognormal":
        return lognormal_sizes(N, DATA_SEED)
    if case.source == "heavy":
        return heavy_tailed_sizes(N, DATA_SEED)
    path = data_dir / _FILES[case.source]
    return read_lengths(path) if path.is_file() else None


def _validate(name: str, a: Assignment, n: int, w: int, equal_counts: bool) -> None:
    """Every sample at least once, exactly ``W·ceil(N/W)`` slots, equal steps on every rank."""
    uses = np.bincount(a.indices, minlength=n)
    total = -(-n // w) * w
    assert uses.shape[0] == n and uses.min() >= 1, f"{name}: a sample is missing"
    assert a.indices.shape[0] == total, f"{name}: {a.indices.shape[0]} slots, not {total}"
    assert np.all(a.bounds[1:, 0] == a.bounds[:-1, -1]), f"{name}: steps not contiguous"
    counts = np.diff(a.bounds, axis=1)
    assert counts.min() >= 1, f"{name}: a rank has an empty step"
    if equal_counts:
        assert np.all(counts == counts[:, :1]), f"{name}: unequal counts within a step"


def _chronica(sizes, case: Case, seed: int, kind: str, exact: bool) -> Scheduler:
    config = ScheduleConfig(
        num_replicas=case.num_replicas,
        batch_size=case.batch_size,
        kind=kind,
        exact=exact,
        shuffle=True,
        seed=seed,
        drop_last=False,
        cost=as_cost_model(case.cost),
    )
    return Scheduler(sizes, config)


def _one_repeat(sizes: np.ndarray, case: Case, seed: int, epochs: list[int]) -> list[dict]:
    """All methods on ``epochs`` of one seed; one dict of metrics per epoch."""
    w, b = case.num_replicas, case.batch_size
    schedulers = {
        "exact": _chronica(sizes, case, seed, "static", True),
        "pool": _chronica(sizes, case, seed, "static", False),
        "guided": _chronica(sizes, case, seed, "guided", True),
    }
    costs = schedulers["exact"].costs
    n = sizes.shape[0]
    out = []
    for epoch in epochs:
        plans = {key: sch.plan_epoch(epoch) for key, sch in schedulers.items()}
        assignments = {
            key: Assignment(plan.indices, plan.bounds, plan.loads) for key, plan in plans.items()
        }
        exact_plan = plans["exact"]
        batches = [exact_plan.indices[row[0] : row[-1]] for row in exact_plan.bounds]
        assignments["torch"] = peers.torch_distributed(costs, w, b, seed, epoch)
        assignments["upstream"] = peers.upstream_static(costs, w, b, seed, epoch)
        assignments["flatflow"] = peers.flatflow(costs, w, b, seed, epoch)
        assignments["lpt"] = peers.sorted_lpt(costs, w, batches)
        assignments["hf"] = peers.hf_rebalance(costs, w, batches)
        metrics = {}
        for key, a in assignments.items():
            _validate(key, a, n, w, equal_counts=key != "hf")
            metrics[key] = step_metrics(a, costs, sizes)
        stats = schedulers["exact"].stats(epoch)
        assert abs(stats.load_ratio_mean - metrics["exact"]["load_ratio_mean"]) < 1e-9
        assert abs(stats.bound_mean - metrics["exact"]["bound_mean"]) < 1e-9
        for key, ratio in (
            ("bound", metrics["exact"]["bound"]),
            ("bound_k", equal_count_bound(assignments["exact"], costs)),
        ):
            metrics[key] = {
                "ratio": ratio,
                "load_ratio_mean": float(ratio.mean()),
                "load_ratio_worst": float(ratio.max()),
                "padding_fraction": None,
            }
        out.append(metrics)
    return out


def _summary(runs: list[dict], key: str) -> dict:
    rows = [
        [r[key]["load_ratio_mean"], r[key]["load_ratio_worst"], r[key]["padding_fraction"]]
        for r in runs
    ]
    mean = [row[0] for row in rows]
    worst = [row[1] for row in rows]
    pads = [row[2] for row in rows if row[2] is not None]
    return {
        "mean": float(np.median(mean)),
        "worst": float(np.median(worst)),
        "padding": float(np.median(pads)) if pads else None,
        "runs": rows,
    }


def _case_checks(runs: list[dict], methods: dict) -> dict:
    """The targets on one case; every entry has ``ok`` and the numbers behind it."""
    gaps = [r["exact"]["load_ratio_mean"] / r["bound"]["load_ratio_mean"] - 1 for r in runs]
    gaps_k = [r["exact"]["load_ratio_mean"] / r["bound_k"]["load_ratio_mean"] - 1 for r in runs]
    lpt_mean = all(
        r["exact"]["load_ratio_mean"] <= r["lpt"]["load_ratio_mean"] * (1 + EPS) for r in runs
    )
    lpt_worst = all(
        r["exact"]["load_ratio_worst"] <= r["lpt"]["load_ratio_worst"] * (1 + EPS) for r in runs
    )
    lpt_wins = sum(int(np.sum(r["lpt"]["ratio"] < r["exact"]["ratio"] * (1 - EPS))) for r in runs)
    checks = {
        "exact_within_0.1pct_of_bound": {
            "ok": bool(np.median(gaps) <= BOUND_TOLERANCE),
            "median_gap": float(np.median(gaps)),
            "worst_gap": float(max(gaps)),
            "median_gap_to_equal_count_bound": float(np.median(gaps_k)),
            "worst_gap_to_equal_count_bound": float(max(gaps_k)),
        },
        "exact_not_worse_than_lpt": {
            "ok": bool(lpt_mean and lpt_worst),
            "mean_ok": bool(lpt_mean),
            "worst_ok": bool(lpt_worst),
            "steps_where_lpt_is_better": lpt_wins,
            "steps_total": sum(len(r["exact"]["ratio"]) for r in runs),
        },
    }
    for mode in ("pool", "guided"):
        for peer in ("upstream", "flatflow"):
            failing = [
                stat
                for stat in ("mean", "worst")
                if methods[mode][stat] > methods[peer][stat] * (1 + EPS)
            ]
            checks[f"{mode}_at_least_{peer}"] = {"ok": not failing, "failing": failing}
    return checks


def check_targets(result: dict) -> list[str]:
    """Human-readable lines, one per (case, target), starting with PASS or FAIL."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"SKIP {case['name']}: {case['skipped']}")
            continue
        for target, check in case["checks"].items():
            detail = {k: v for k, v in check.items() if k != "ok"}
            verdict = "PASS" if check["ok"] else "FAIL"
            lines.append(f"{verdict} {case['name']} {target} {detail}")
    return lines


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Run every case; returns the JSON-ready result (see the module docstring)."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    seeds = [0, 1] if quick else list(range(10))
    epochs = [0] if quick else [0, 1, 2]
    started = time.perf_counter()
    cases: list[dict[str, Any]] = []
    trace = None
    for case in CASES:
        entry = {
            "name": case.name,
            "label": case.label,
            "num_replicas": case.num_replicas,
            "batch_size": case.batch_size,
            "cost": case.cost,
        }
        sizes = _sizes(case, data_dir)
        if sizes is None:
            entry["skipped"] = f"{_FILES[case.source]} not found in {data_dir}"
            cases.append(entry)
            continue
        runs = []
        for seed in seeds:
            per_epoch = _one_repeat(sizes, case, seed, epochs)
            runs.extend(per_epoch)
            if case.name == TRACED_CASE and trace is None:
                trace = {
                    "case": case.name,
                    "seed": seed,
                    "epoch": epochs[0],
                    "ratio": {k: per_epoch[0][k]["ratio"].tolist() for k, _ in METHODS},
                }
        methods = {key: _summary(runs, key) for key, _ in METHODS}
        entry.update(
            num_samples=int(sizes.shape[0]),
            num_steps=len(runs[0]["exact"]["ratio"]),
            methods=methods,
            checks=_case_checks(runs, methods),
        )
        cases.append(entry)
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "balance",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "seeds": seeds,
        "epochs": epochs,
        "data_seed": DATA_SEED,
        "data_dir": str(data_dir),
        "methods": dict(METHODS),
        "cases": cases,
        "trace": trace,
        "all_targets_hold": all(ch["ok"] for c in checked for ch in c["checks"].values()),
    }


def format_table(result: dict) -> str:
    """A plain-text table of the medians, one block per case."""
    lines = []
    for case in result["cases"]:
        lines.append(
            f"\n{case['name']}  (W={case['num_replicas']}, B={case['batch_size']}, "
            f"{case['cost']} cost)"
        )
        if case.get("skipped"):
            lines.append(f"  skipped: {case['skipped']}")
            continue
        for key, label in METHODS:
            m = case["methods"][key]
            pad = "" if m["padding"] is None else f"  pad {m['padding']:.3f}"
            lines.append(f"  {label:44s} mean {m['mean']:.5f}  worst {m['worst']:.5f}{pad}")
    return "\n".join(lines)
