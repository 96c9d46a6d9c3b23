"""The largest-document wall, every answer side by side: chronica's plan of today, outlier
delay alone, context-parallel sharding alone (g = 2, 4, 8), both, and WLB-LLM's packing.

A case is an epoch of ``STEPS`` global batches of ``d·W`` documents (``d`` = 4 or 8 per
device) for ``W`` = 64 and 256 devices, with lengths drawn as the outlier-delay benchmark
draws them (``benchmarks.outliers``: lognormal(6, 1.0), (6, 1.5), (7, 1.5) or the real
length files sampled with replacement, cut to the 16k or 32k cap), cost ``24576·L + L²``.
Every method plans every step with ``chronica.plan_step`` on the same predicted costs:

* ``today``: ``Packing(max_tokens=cap)``, the epoch's steps as they come;
* ``delay``: the steps formed by ``chronica.core.packing.outliers.delay_outliers`` with
  ``OutlierDelay()`` (a document's weight is its cost), then planned as today;
* ``cp2``/``cp4``/``cp8``: the epoch's steps planned with ``Packing(context_parallel=g,
  pad_multiple=2·g)`` (``benchmarks.context_parallel``'s packing);
* ``both2``/``both4``/``both8``: the steps formed by outlier delay, then planned with CP.
  The delay sees a document's weight as its cost on one CP rank once sharded, cost / g: a
  document waits only when even its ``1/g`` share would set the step;
* ``wlb``: WLB-LLM (``benchmarks.outliers``' re-implementation, the best of its level
  settings per case; whole documents, no CP).

Figures: the per-step max / mean of the per-device cost, the mean over the steps and the
worst step, and the epoch's Σmax/Σmean. Target (issue 29): the best of CP and both with
g <= 8 at most ``TARGET`` (mean per-step figure) where today's bound ``max(mean, largest
document) / mean`` is in ``WALL``; printed, never tuned away.

Run alone: ``python -m benchmarks --only wall [--quick]``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import outliers as peer
from benchmarks.common import machine_info, read_lengths
from benchmarks.context_parallel import COST, TARGET, WALL, _packing
from benchmarks.packing import default_data_dir
from chronica import OutlierDelay, plan_step
from chronica.core.packing.outliers import delay_outliers

__all__ = ["METHODS", "check_targets", "epoch_figures", "format_table", "render_markdown", "run"]

STEPS = 12
QUICK_STEPS = 6
SIZES = (2, 4, 8)
METHODS = [
    ("today", "chronica today (whole documents)"),
    ("delay", "outlier delay alone, OutlierDelay()"),
    *[(f"cp{g}", f"CP sharding alone, g = {g}") for g in SIZES],
    *[(f"both{g}", f"outlier delay, then CP sharding, g = {g}") for g in SIZES],
    ("wlb", "WLB-LLM (outlier queue + greedy packing)"),
]


def _figures(loads: list[np.ndarray]) -> dict[str, float]:
    top = np.array([x.max() for x in loads])
    mean = np.array([x.mean() for x in loads])
    ratio = top / mean
    return {
        "ratio_mean": float(ratio.mean()),
        "ratio_worst": float(ratio.max()),
        "sum_ratio": float(top.sum() / mean.sum()),
    }


def _planned(steps: list[np.ndarray], lengths: np.ndarray, w: int, cap: int, g: int) -> dict:
    loads, seconds = [], 0.0
    for docs in steps:
        start = time.process_time()
        plan = plan_step(lengths[docs], w, _packing(cap, g), cost=COST)
        seconds += time.process_time() - start
        loads.append(plan.rank_costs)
    return {**_figures(loads), "plan_ms": 1e3 * seconds / len(steps)}


def epoch_figures(lengths: np.ndarray, devices: int, cap: int, per_step: int) -> dict[str, Any]:
    """Every method's figures (``METHODS``) on one epoch: the documents in order, cut into
    steps of ``per_step``.

    Args:
        lengths: every document's length (each at most ``cap``).
        devices: ``W``.
        cap: tokens per device and micro-batch.
        per_step: documents per step (``d·W``).
    """
    costs = COST(lengths.astype(np.float64))
    steps = np.split(np.arange(lengths.shape[0]), range(per_step, lengths.shape[0], per_step))
    mean = np.array([costs[s].sum() / devices for s in steps])
    top = np.array([costs[s].max() for s in steps])
    out: dict[str, Any] = {"bound": float(np.mean(np.maximum(mean, top) / mean))}
    out["today"] = _planned(steps, lengths, devices, cap, 1)
    delayed, _ = delay_outliers(steps, costs, costs, devices, OutlierDelay())
    out["delay"] = _planned(delayed, lengths, devices, cap, 1)
    for g in SIZES:
        out[f"cp{g}"] = _planned(steps, lengths, devices, cap, g)
        both, _ = delay_outliers(steps, costs, costs / g, devices, OutlierDelay())
        out[f"both{g}"] = _planned(both, lengths, devices, cap, g)
    return out


def _run_case(case: peer.Case, pool: np.ndarray | None, steps: int) -> dict:
    lengths = peer._lengths(case, pool, steps)
    w, per_step = case.num_replicas, case.docs_per_rank * case.num_replicas
    methods = epoch_figures(lengths, w, case.max_tokens, per_step)
    bound = methods.pop("bound")
    methods["wlb"] = peer._wlb(case, lengths)
    best = min(methods[f"{kind}{g}"]["ratio_mean"] for kind in ("cp", "both") for g in SIZES)
    applies = WALL[0] <= bound <= WALL[1]
    return {
        "name": case.name,
        "steps": steps,
        "bound": bound,
        "methods": methods,
        "check": {"applies": applies, "best": best, "ok": best <= TARGET or not applies},
    }


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Every case (quick: W = 64, 16k cap, 4 per device); the JSON-ready result."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    started = time.perf_counter()
    epoch_figures(np.arange(1, 65), 8, 64, 32)  # numba warm-up
    pools = {
        key: read_lengths(data_dir / d.file) if (data_dir / d.file).is_file() else None
        for key, d in peer.DATA.items()
        if d.file is not None
    }
    chosen = [
        c
        for c in peer.CASES
        if not quick or (c.num_replicas == 64 and c.max_tokens == 16384 and c.docs_per_rank == 4)
    ]
    cases: list[dict[str, Any]] = []
    for case in chosen:
        source = peer.DATA[case.data]
        if source.file is not None and pools[case.data] is None:
            cases.append({"name": case.name, "skipped": f"{data_dir / source.file} not found"})
            continue
        cases.append(_run_case(case, pools.get(case.data), QUICK_STEPS if quick else STEPS))
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "wall",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "data_seed": peer.DATA_SEED,
        "methods": dict(METHODS),
        "cases": cases,
        "all_targets_hold": all(c["check"]["ok"] for c in checked),
    }


def check_targets(result: dict) -> list[str]:
    """Lines starting PASS, FAIL, INFO (today's bound outside the band) or SKIP."""
    lines = []
    for c in result["cases"]:
        if c.get("skipped"):
            lines.append(f"SKIP {c['name']}: {c['skipped']}")
            continue
        ch = c["check"]
        state = ("PASS" if ch["ok"] else "FAIL") if ch["applies"] else "INFO"
        lines.append(
            f"{state} {c['name']}: today's bound {c['bound']:.2f}, best of CP / both with "
            f"g <= 8 {ch['best']:.3f} (target {TARGET} where the bound is {WALL[0]}-{WALL[1]})"
        )
    return lines


def _cell(m: dict) -> str:
    return f"{m['ratio_mean']:.3f} / {m['ratio_worst']:.3f}"


def format_table(result: dict) -> str:
    """A plain-text line per case (mean / worst per-step max/mean per method), then the
    target lines."""
    keys = [k for k, _ in METHODS]
    lines = [f"{'case':24s} {'bound':>6} " + " ".join(f"{k:>13}" for k in keys)]
    for c in result["cases"]:
        if not c.get("skipped"):
            cells = " ".join(f"{_cell(c['methods'][k]):>13}" for k in keys)
            lines.append(f"{c['name']:24s} {c['bound']:6.2f} {cells}")
    return "\n".join([*lines, "", *check_targets(result)])


def render_markdown(result: dict, img_dir: Path) -> str:
    """The page's section: what was run, the table and the target's summary."""
    del img_dir  # no plot
    cases = [c for c in result["cases"] if not c.get("skipped")]
    applying = [c for c in cases if c["check"]["applies"]]
    keys = [k for k, _ in METHODS]
    lines = [
        "## The largest-document wall: outlier delay, CP sharding, both",
        "",
        f"`{result.get('command', 'python -m benchmarks --only wall')}`",
        "",
        f"{result['mode']} mode ({result['seconds']:.0f} s, "
        f"{result['machine'].get('date_utc', '')}). An epoch of "
        f"{cases[0]['steps'] if cases else STEPS} steps of d·W documents drawn as in "
        "[the outlier delay section](#outlier-delay-across-steps), cost 24576·L + L². Every "
        "method plans every step with `chronica.plan_step`: *today* whole documents; *delay* "
        "the steps formed by `delay_outliers` with `OutlierDelay()`; *CP g* "
        "`Packing(context_parallel=g, pad_multiple=2·g)`; *both g* the steps formed by "
        "outlier delay (a document's weight: its cost / g, what one CP rank carries once it "
        "is sharded), then planned with CP; WLB-LLM as in the outlier delay section. Cells: "
        "per-step max / mean of the per-device cost, mean over the steps / worst step; "
        "*bound*: today's bound max(mean, largest document) / mean, mean over the steps.",
        "",
        "| case | bound | " + " | ".join(k for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for c in cases:
        cells = " | ".join(_cell(c["methods"][k]) for k in keys)
        lines.append(f"| {c['name']} | {c['bound']:.2f} | {cells} |")
    if applying:
        best = [c["check"]["best"] for c in applying]
        lines += [
            "",
            f"Where today's bound is {WALL[0]}–{WALL[1]} ({len(applying)} of {len(cases)} "
            f"cases), the best of CP and both with g ≤ 8 has a mean per-step figure of "
            f"{min(best):.3f}–{max(best):.3f} (target {TARGET}; "
            f"{sum(b <= TARGET for b in best)} of {len(applying)} meet it).",
        ]
    if cases:

        def span(key: str) -> str:
            values = [c["methods"][key]["ratio_mean"] for c in cases]
            return f"{min(values):.3f}–{max(values):.3f}"

        below = sum(
            c["methods"]["delay"]["ratio_mean"] <= c["methods"]["wlb"]["ratio_mean"] for c in cases
        )
        lines += [
            "",
            f"Over all {len(cases)} cases (mean per-step figure): outlier delay alone "
            f"{span('delay')}, at most WLB-LLM's ({span('wlb')}) on {below}; both with "
            f"g = 2 {span('both2')}, g = 4 {span('both4')}, g = 8 {span('both8')}; CP alone "
            f"with g = 8 {span('cp8')}.",
        ]
    failed = [line for line in check_targets(result) if line.startswith("FAIL")]
    lines += ["", *[f"- {line}" for line in failed], ""]
    return "\n".join(lines)
