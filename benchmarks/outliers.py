"""Outlier delay benchmark: ``Packing(outliers=OutlierDelay())`` against chronica without it
and against WLB-LLM's packing, where few documents share a rank and the heaviest document
sets the step.

A case is an epoch of ``STEPS`` global batches of ``d·W`` documents (``d`` in
``DOCS_PER_RANK``, the 4–8 documents per rank where the largest-document wall stands), with
lengths drawn from lognormal(mu, sigma) or from the shared real lengths files (sampled with
replacement), cut to the case's cap (``Packing(max_tokens=16384|32768)``), and cost
``24576·L + L²`` (``CostModel(0, 24576, 1)``). Every method trains the epoch's documents in
the same order and is scored on the same predicted costs:

* **per-step max/mean**: the slowest rank's cost over the mean rank's in each step, the
  mean over the steps and the worst step; **Σmax/Σmean**: the epoch's summed step times over
  the summed mean rank costs (the wall-clock loss over perfect balance);
* **delay**: steps a document trains after the step the epoch's order put it in (mean,
  99th percentile, maximum);
* **planning**: CPU milliseconds per step (the whole epoch's plan divided by its steps).

Methods:

* ``today``: ``Scheduler(sizes, ScheduleConfig(W, batch_size=d·W, packing=Packing(
  max_tokens=cap), cost=...)).plan_epoch(0)``;
* ``delay``: the same with ``Packing(..., outliers=OutlierDelay())`` (defaults:
  ``max_delay=16``);
* ``epoch``: ``OutlierDelay(max_delay=STEPS)``: a document may wait until the epoch's end,
  as WLB-LLM's queue lets it (the comparison on equal footing);
* ``wlb``: WLB-LLM's packing (Wang et al., OSDI 2025), re-implemented from the paper
  (``wlb_epoch``): a multi-level outlier queue (a document at least ``L_1`` tokens long waits
  in the queue of the highest level ``i`` with ``L_i <=`` its length; a queue that holds
  ``N = W`` documents releases them, oldest first, into the next global batch; the last
  batch takes what is left), then greedy variable-length packing of each batch (documents
  by descending length, each to the rank of least predicted workload). Its levels are
  lengths whose cost is a factor of the expected fair share ``d · E[cost]``; the benchmark
  runs ``WLB_LEVELS`` and reports, per case, the setting with the best Σmax/Σmean.

Target checked (printed, never tuned away): the default outlier delay's mean and worst
per-step max/mean and its Σmax/Σmean are at most WLB-LLM's on every case (WLB-LLM's queue
delays without bound; the default waits at most 16 steps). ``epoch`` is shown beside it.

Run alone: ``python -m benchmarks --only outliers [--quick]``.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_info, read_lengths
from benchmarks.packing import default_data_dir
from chronica import CostModel, OutlierDelay, Packing, ScheduleConfig, Scheduler

__all__ = ["CASES", "METHODS", "check_targets", "format_table", "render_markdown", "run"]

DATA_SEED = 2029
STEPS = 48
QUICK_STEPS = 16
DOCS_PER_RANK = (4, 8)
COST = CostModel(0.0, 24576.0, 1.0)
EPS = 1e-9
# WLB-LLM's queue levels, as factors of the expected fair share (a level's length is the
# one whose cost is that factor times d·E[cost]).
WLB_LEVELS = ((0.5,), (0.5, 2.0), (1.0,), (1.0, 4.0))
METHODS = [
    ("today", "chronica today (Packing, no delay)"),
    ("delay", "chronica, Packing(outliers=OutlierDelay()) (max_delay=16)"),
    ("epoch", "chronica, OutlierDelay(max_delay=steps): unbounded within the epoch, as WLB-LLM"),
    ("wlb", "WLB-LLM (outlier queue + greedy packing), best level setting"),
]


@dataclass(frozen=True)
class Data:
    """Where lengths come from: a file of the shared data, or lognormal(mu, sigma)."""

    key: str
    label: str
    file: str | None = None
    mu: float = 0.0
    sigma: float = 0.0


DATA = {
    d.key: d
    for d in (
        Data("ln6-1.0", "lognormal(6, 1.0)", mu=6.0, sigma=1.0),
        Data("ln6-1.5", "lognormal(6, 1.5)", mu=6.0, sigma=1.5),
        Data("ln7-1.5", "lognormal(7, 1.5)", mu=7.0, sigma=1.5),
        Data("lee", "lee_lengths.txt", "lee_lengths.txt"),
        Data("head500", "head500_lengths.txt", "head500_lengths.txt"),
    )
}


@dataclass(frozen=True)
class Case:
    """One setting: data, W, the cap and documents per rank and step."""

    data: str
    num_replicas: int
    max_tokens: int
    docs_per_rank: int

    @property
    def name(self) -> str:
        return f"{self.data}-W{self.num_replicas}-{self.max_tokens // 1024}k-d{self.docs_per_rank}"


CASES = [
    Case(data, w, cap, d)
    for data in DATA
    for w in (64, 256)
    for cap in (16384, 32768)
    for d in DOCS_PER_RANK
]


def _lengths(case: Case, pool: np.ndarray | None, steps: int) -> np.ndarray:
    data = DATA[case.data]
    n = case.docs_per_rank * case.num_replicas * steps
    rng = np.random.default_rng([DATA_SEED, case.num_replicas, case.max_tokens, case.docs_per_rank])
    raw = (
        rng.lognormal(data.mu, data.sigma, n)
        if pool is None
        else pool[rng.integers(0, len(pool), n)]
    )
    return np.clip(np.rint(raw), 1, case.max_tokens).astype(np.int64)


def wlb_epoch(
    lengths: np.ndarray, costs: np.ndarray, w: int, per_step: int, levels: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """WLB-LLM's packing of an epoch (module docstring): per-step rank loads ``(steps, W)``
    and every document's delay in steps. ``levels`` are the queues' length thresholds."""
    n = lengths.shape[0]
    steps = -(-n // per_step)
    queues: list[list[tuple[int, int]]] = [[] for _ in levels]
    loads = np.zeros((steps, w))
    delays = np.zeros(n, np.int64)
    for s in range(steps):
        batch = []
        for doc in range(s * per_step, min(n, (s + 1) * per_step)):
            level = int(np.searchsorted(levels, lengths[doc], side="right")) - 1
            if level >= 0 and s < steps - 1:
                queues[level].append((doc, s))
            else:
                batch.append(doc)
        for queue in queues:
            take = len(queue) if s == steps - 1 else (len(queue) // w) * w
            for doc, since in queue[:take]:
                batch.append(doc)
                delays[doc] = s - since
            del queue[:take]
        loads[s] = _greedy(lengths, costs, batch, w)
    return loads, delays


def _greedy(lengths: np.ndarray, costs: np.ndarray, batch: list[int], w: int) -> np.ndarray:
    """WLB-LLM's greedy packing: by descending length, each to the least-loaded rank."""
    docs = np.asarray(batch, dtype=np.int64)
    heap = [(0.0, r) for r in range(w)]
    for doc in docs[np.argsort(-lengths[docs], kind="stable")]:
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + float(costs[doc]), r))
    out = np.zeros(w)
    for load, r in heap:
        out[r] = load
    return out


def _level_lengths(factors: tuple[float, ...], fair: float, cap: int) -> tuple[int, ...]:
    """The length whose cost is each factor times ``fair`` (at most ``cap + 1``)."""
    b, c = COST.b, COST.c
    out = []
    for f in factors:
        target = f * fair
        length = (-b + np.sqrt(b * b + 4 * c * target)) / (2 * c)
        out.append(int(min(cap + 1, max(1, np.ceil(length)))))
    return tuple(out)


def _figures(loads: np.ndarray, delays: np.ndarray) -> dict[str, Any]:
    mean = loads.mean(axis=1)
    ratio = loads.max(axis=1) / np.where(mean > 0, mean, 1.0)
    return {
        "ratio_mean": float(ratio.mean()),
        "ratio_worst": float(ratio.max()),
        "sum_ratio": float(loads.max(axis=1).sum() / mean.sum()),
        "delay_mean": float(delays.mean()),
        "delay_p99": float(np.percentile(delays, 99)),
        "delay_max": int(delays.max()),
    }


def _chronica(case: Case, lengths: np.ndarray, outliers: OutlierDelay | None) -> dict[str, Any]:
    w = case.num_replicas
    packing = Packing(max_tokens=case.max_tokens, outliers=outliers)
    config = ScheduleConfig(w, batch_size=case.docs_per_rank * w, packing=packing, cost=COST)
    scheduler = Scheduler(lengths, config)
    start = time.process_time()
    plan = scheduler.plan_epoch(0)
    seconds = time.process_time() - start
    assert np.array_equal(np.sort(plan.indices), np.arange(lengths.shape[0])), "not exactly once"
    assert plan.micro is not None
    per_doc = np.zeros(lengths.shape[0], np.int64)
    if plan.micro.delays is not None:
        per_doc[plan.indices] = plan.micro.delays
        assert per_doc.max() <= (outliers.max_delay if outliers else 0)
    out = _figures(plan.loads, per_doc)
    out["plan_ms"] = 1e3 * seconds / plan.num_steps
    out["over_cap"] = int(
        np.sum(
            np.bincount(
                np.repeat(np.arange(plan.micro.bounds.shape[0] - 1), np.diff(plan.micro.bounds)),
                weights=plan.micro.lengths,
            )
            > case.max_tokens
        )
    )
    return out


def _wlb(case: Case, lengths: np.ndarray) -> dict[str, Any]:
    costs = COST(lengths.astype(np.float64))
    w, per_step = case.num_replicas, case.docs_per_rank * case.num_replicas
    fair = case.docs_per_rank * float(costs.mean())
    best: dict[str, Any] | None = None
    for factors in WLB_LEVELS:
        levels = _level_lengths(factors, fair, case.max_tokens)
        start = time.process_time()
        loads, delays = wlb_epoch(lengths, costs, w, per_step, levels)
        seconds = time.process_time() - start
        out = _figures(loads, delays)
        out["plan_ms"] = 1e3 * seconds / loads.shape[0]
        out["levels"] = list(factors)
        if best is None or out["sum_ratio"] < best["sum_ratio"]:
            best = out
    assert best is not None
    return best


def _checks(entry: dict) -> dict:
    ours, peer = entry["methods"]["delay"], entry["methods"]["wlb"]
    failing = [
        f"{key} {ours[key]:.4f} > WLB-LLM {peer[key]:.4f}"
        for key in ("ratio_mean", "ratio_worst", "sum_ratio")
        if ours[key] > peer[key] * (1 + EPS)
    ]
    over = entry["methods"]["delay"]["over_cap"] + ours["over_cap"]
    return {
        "at_most_wlb": {"ok": not failing, "failing": failing},
        "no_cap_violations": {"ok": over == 0, "over_cap": over},
    }


def _run_case(case: Case, pool: np.ndarray | None, steps: int) -> dict:
    lengths = _lengths(case, pool, steps)
    entry = {
        "name": case.name,
        "data": case.data,
        "num_replicas": case.num_replicas,
        "max_tokens": case.max_tokens,
        "docs_per_rank": case.docs_per_rank,
        "steps": steps,
        "methods": {
            "today": _chronica(case, lengths, None),
            "delay": _chronica(case, lengths, OutlierDelay()),
            "epoch": _chronica(case, lengths, OutlierDelay(max_delay=steps)),
            "wlb": _wlb(case, lengths),
        },
    }
    entry["checks"] = _checks(entry)
    return entry


def _cases(quick: bool) -> list[Case]:
    if quick:
        return [c for c in CASES if c.docs_per_rank == 4 and c.max_tokens == 16384]
    return CASES


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Run every case; the JSON-ready result."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    started = time.perf_counter()
    _chronica(Case("ln6-1.0", 2, 64, 4), np.arange(1, 33), OutlierDelay())  # numba warm-up
    pools = {
        key: read_lengths(data_dir / data.file) if (data_dir / data.file).is_file() else None
        for key, data in DATA.items()
        if data.file is not None
    }
    cases: list[dict[str, Any]] = []
    for case in _cases(quick):
        source = DATA[case.data]
        if source.file is not None and pools[case.data] is None:
            cases.append({"name": case.name, "skipped": f"{data_dir / source.file} not found"})
            continue
        cases.append(_run_case(case, pools.get(case.data), QUICK_STEPS if quick else STEPS))
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "outliers",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "data_seed": DATA_SEED,
        "data_dir": str(data_dir),
        "methods": dict(METHODS),
        "default": repr(OutlierDelay()),
        "cases": cases,
        "all_targets_hold": all(ch["ok"] for c in checked for ch in c["checks"].values()),
    }


def check_targets(result: dict) -> list[str]:
    """One line per (case, target), starting with PASS, FAIL or SKIP."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"SKIP {case['name']}: {case['skipped']}")
            continue
        for target, check in case["checks"].items():
            detail = {k: v for k, v in check.items() if k != "ok"}
            lines.append(f"{'PASS' if check['ok'] else 'FAIL'} {case['name']} {target} {detail}")
    return lines


def _cell(m: dict) -> str:
    return f"{m['ratio_mean']:.3f} / {m['ratio_worst']:.3f} / {m['sum_ratio']:.3f}"


def _delay(m: dict) -> str:
    return f"{m['delay_mean']:.2f} / {m['delay_p99']:.0f} / {m['delay_max']}"


def format_table(result: dict) -> str:
    """A plain-text line per case and method, then the target lines."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"{case['name']}: skipped ({case['skipped']})")
            continue
        for key, _ in METHODS:
            m = case["methods"][key]
            lines.append(
                f"{case['name']:24s} {key:6s} max/mean mean/worst/sum {_cell(m)}  delay "
                f"mean/p99/max {_delay(m)}  plan {m['plan_ms']:.2f} ms/step"
            )
    lines.append("")
    lines += check_targets(result)
    return "\n".join(lines)


def render_markdown(result: dict, img_dir: Path) -> str:
    """The page's section: what was run, the table and the target lines."""
    del img_dir  # no plot
    cases = [c for c in result["cases"] if not c.get("skipped")]
    failed = [line for line in check_targets(result) if line.startswith("FAIL")]
    lines = [
        "## Outlier delay across steps",
        "",
        f"`{result['command']}`" if "command" in result else "",
        "",
        f"{result['mode']} mode, {result['machine'].get('date_utc', '')}. An epoch of "
        f"{cases[0]['steps'] if cases else STEPS} steps of d·W documents (d = 4 or 8 per "
        "rank), lengths cut to the cap, cost 24576·L + L² (`CostModel(0, 24576, 1)`). "
        "Cells: per-step max/mean over the steps (mean / worst) and the epoch's Σmax/Σmean; "
        "delay in steps (mean / 99th percentile / max); planning in CPU ms per step. "
        f"chronica with delay uses `{result['default']}`. WLB-LLM is re-implemented from its "
        "paper (module docstring of `benchmarks/outliers.py`, and "
        "[the step planner's page](step-planner.md#outlier-delay)): the best of its level "
        "settings per case.",
        "",
        "| case | chronica today | + OutlierDelay() | its delay | + OutlierDelay(max_delay="
        "steps) | its delay | WLB-LLM | WLB delay | plan ms/step (OutlierDelay() / WLB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        m = case["methods"]
        lines.append(
            f"| {case['name']} | {_cell(m['today'])} | **{_cell(m['delay'])}** | "
            f"{_delay(m['delay'])} | {_cell(m['epoch'])} | {_delay(m['epoch'])} | "
            f"{_cell(m['wlb'])} | {_delay(m['wlb'])} | "
            f"{m['delay']['plan_ms']:.2f} / {m['wlb']['plan_ms']:.2f} |"
        )
    lines += [
        "",
        f"Targets (`OutlierDelay()` at most WLB-LLM on every figure, no micro-batch over "
        f"the cap): "
        f"{'all pass' if not failed else f'{len(failed)} FAIL'}.",
        "",
    ]
    lines += [f"- {line}" for line in failed]
    return "\n".join(lines) + "\n"
