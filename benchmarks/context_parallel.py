"""Context-parallel benchmark: ``chronica.plan_step`` with ``Packing(context_parallel=g)``
against chronica's plan of today on the largest-document wall.

A *step* is ``d·W`` documents (``d`` = 4 or 8 per device, the regime where the wall bites)
for ``W`` = 64 and 256 devices: lognormal(6, 1.0), (6, 1.5), (7, 1.5) lengths, or the real
length files sampled with replacement, cut to the cap (16k or 32k tokens per device and
micro-batch). Cost ``24576·L + L²`` (``CostModel(0, 24576, 1)``). Per step and method the
figure is the per-device cost's max / mean (the planner's prediction; for a sharded
document every CP rank holds ``1/g`` of it); beside it today's bound
``max(mean, largest document) / mean`` and the bound of ``g``-way sharding,
``max(mean, largest / g) / mean``. ``step_figures`` takes one step's document lengths, so
steps that another policy chose (outlier delay) go through it unchanged.

Also measured: planning CPU time at 16,384 documents for 256 devices (target 100 ms, the
worst step); gloo all-gathers on this machine against the fitted exchange model of
``chronica.sim.context`` (target: within 10%); and ``chronica simulate context-parallel``'s
step times at 64, 256 and 1024 devices with the default (NVLink-class) exchange.

Run alone: ``python -m benchmarks --only context_parallel [--quick]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_info, read_lengths
from benchmarks.cp_allgather import measure
from benchmarks.outliers import DATA, Data
from benchmarks.packing import default_data_dir
from chronica import CostModel, Packing, plan_step
from chronica.sim.context import CommModel, simulate_context

__all__ = ["CASES", "check_targets", "format_table", "render_markdown", "run", "step_figures"]

DATA_SEED = 2029
COST = CostModel(0.0, 24576.0, 1.0)
SIZES = (1, 2, 4, 8)  # 1: chronica today, whole documents only
WALL = (2.1, 4.5)  # today's bound where the target applies
TARGET = 1.15
PLAN_TARGET = (16384, 256, 0.100)  # documents, devices, CPU seconds
COMM_TARGET = 0.10
# Buffers of 1-8 MiB (a layer's keys and values of 256-2048 tokens at 4 KiB a token): above
# them this 2-core VM's copies leave the caches and slow down (16 MiB took 3x the time of 8);
# below, scheduling noise on the shared machine dominates. The check runs at g = 2, the group
# this machine runs without oversubscribing its cores; g = 4 (four processes on two cores) is
# reported beside.
COMM_BYTES = (1 << 20, 1 << 21, 1 << 22, 1 << 23)
COMM_CHECKED = 2
SIM_WORLDS = (64, 256, 1024)


@dataclass(frozen=True)
class Case:
    """One setting: data, devices, cap, documents per device."""

    data: str
    devices: int
    cap: int
    per_device: int

    @property
    def name(self) -> str:
        return f"{self.data}-W{self.devices}-{self.cap // 1024}k-d{self.per_device}"


CASES = [
    Case(data, w, cap, d)
    for data in DATA
    for w in (64, 256)
    for cap in (16384, 32768)
    for d in (4, 8)
]


def _packing(cap: int, g: int) -> Packing:
    return Packing(max_tokens=cap, context_parallel=g, pad_multiple=2 * g if g > 1 else 1)


def step_figures(lengths: np.ndarray, devices: int, cap: int) -> dict[str, Any]:
    """One step's figures: per method (``g`` of ``SIZES``) the per-device max / mean cost,
    the documents sharded and the planning CPU seconds; and the bounds.

    Args:
        lengths: the step's document lengths (each at most ``cap``).
        devices: ``W``.
        cap: tokens per device and micro-batch.
    """
    costs = COST(lengths.astype(np.float64))
    mean = costs.sum() / devices
    out: dict[str, Any] = {"bound": float(max(mean, costs.max()) / mean)}
    for g in SIZES:
        start = time.process_time()
        plan = plan_step(lengths, devices, _packing(cap, g), cost=COST)
        spent = time.process_time() - start
        loads = plan.rank_costs
        out[f"g{g}"] = {
            "figure": float(loads.max() / loads.mean()),
            "sharded": 0 if plan.sharded is None else int(plan.sharded.sum()),
            "seconds": spent,
            "ideal": float(max(mean, costs.max() / g) / mean),
        }
    return out


def _draw(data: Data, pool: np.ndarray | None, n: int, cap: int, rng) -> np.ndarray:
    raw = (
        rng.lognormal(data.mu, data.sigma, n)
        if pool is None
        else pool[rng.integers(0, pool.size, n)]
    )
    return np.clip(np.rint(raw), 1, cap).astype(np.int64)


def _run_case(case: Case, pool: np.ndarray | None, num_steps: int) -> dict:
    rng = np.random.default_rng([DATA_SEED, case.devices, case.cap, case.per_device])
    steps = [
        step_figures(_draw(DATA[case.data], pool, case.per_device * case.devices, case.cap, rng),
                     case.devices, case.cap)
        for _ in range(num_steps)
    ]  # fmt: skip
    bound = [s["bound"] for s in steps]
    methods = {}
    for g in SIZES:
        figs = [s[f"g{g}"]["figure"] for s in steps]
        methods[f"g{g}"] = {
            "mean": float(np.mean(figs)),
            "worst": float(np.max(figs)),
            "ideal": float(np.mean([s[f"g{g}"]["ideal"] for s in steps])),
            "sharded": float(np.mean([s[f"g{g}"]["sharded"] for s in steps])),
            "plan_worst": float(max(s[f"g{g}"]["seconds"] for s in steps)),
        }
    best = min(methods[f"g{g}"]["mean"] for g in SIZES if g > 1)
    applies = WALL[0] <= float(np.mean(bound)) <= WALL[1]
    return {
        "name": case.name,
        "data": case.data,
        "devices": case.devices,
        "cap": case.cap,
        "per_device": case.per_device,
        "steps": num_steps,
        "bound": {"mean": float(np.mean(bound)), "worst": float(np.max(bound))},
        "methods": methods,
        "check": {"applies": applies, "best": best, "ok": best <= TARGET or not applies},
    }


def _planning(quick: bool) -> list[dict]:
    """Worst-step CPU time of ``plan_step`` at 16,384 documents for 256 devices, with
    ``context_parallel=g`` and, on the same steps, today's plan under the same padding
    (``pad_multiple=2·g``: padding alone changes the instance the refinement works on)."""
    n, w, target = PLAN_TARGET
    out = []
    for key in ("ln6-1.0", "ln7-1.5"):
        rng = np.random.default_rng([DATA_SEED, n, w])
        steps = [_draw(DATA[key], None, n, 16384, rng) for _ in range(2 if quick else 5)]
        for g in SIZES:
            times: dict[str, list[float]] = {"cp": [], "same_padding": []}
            for lengths in steps:
                for which, packing in (
                    ("cp", _packing(16384, g)),
                    ("same_padding", Packing(16384, pad_multiple=2 * g)),
                ):
                    start = time.process_time()
                    plan_step(lengths, w, packing, cost=COST)
                    times[which].append(time.process_time() - start)  # fmt: skip
            worst = max(times["cp"])
            out.append({"data": key, "g": g, "worst": worst,
                        "median": float(np.median(times["cp"])),
                        "same_padding_worst": max(times["same_padding"]),
                        "target": target, "ok": worst <= target})  # fmt: skip
    return out


def _comm(quick: bool) -> dict:
    """gloo all-gathers measured here, the model fitted to the fastest calls at
    ``COMM_CHECKED``, every point's relative error (the check: those at ``COMM_CHECKED``)."""
    points = measure([COMM_CHECKED, 4], list(COMM_BYTES), 11 if quick else 31, 1 if quick else 3)
    fitted = [p for p in points if p["size"] == COMM_CHECKED]
    model = CommModel.fit([p["size"] for p in fitted], [p["bytes"] for p in fitted],
                          [p["fastest"] for p in fitted])  # fmt: skip
    for p in points:
        p["model"] = model.seconds(p["bytes"], p["size"])
        p["error"] = p["model"] / p["fastest"] - 1
    worst = max(abs(p["error"]) for p in fitted)
    return {"latency": model.latency, "bandwidth": model.bandwidth, "points": points,
            "worst_error": worst, "ok": worst <= COMM_TARGET}  # fmt: skip


def _simulated(quick: bool) -> list[dict]:
    """``chronica simulate context-parallel``'s mean step per ``g`` at 64-1024 devices."""
    out = []
    for w in SIM_WORLDS:
        rng = np.random.default_rng([DATA_SEED, w, 7])
        steps = [_draw(DATA["ln6-1.5"], None, 4 * w, 16384, rng) for _ in range(2 if quick else 4)]
        results = simulate_context(steps, w, 16384, SIZES, COST)
        base = results[0].step_seconds.mean()
        for r in results:
            s = r.summary()
            out.append({"devices": w, **s, "speedup": float(base / s["step_s"])})
    return out


def _warm_up() -> None:
    for g in SIZES:
        plan_step(np.arange(1, 65), 8, _packing(64, g), cost=COST)


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Every case, the planning time, the exchange model's check and the simulated steps."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    started = time.perf_counter()
    _warm_up()
    pools = {
        key: read_lengths(data_dir / d.file) if (data_dir / d.file).is_file() else None
        for key, d in DATA.items()
        if d.file is not None
    }
    cases: list[dict[str, Any]] = []
    for case in CASES if not quick else [c for c in CASES if c.devices == 64]:
        source = DATA[case.data]
        if source.file is not None and pools[case.data] is None:
            cases.append({"name": case.name, "skipped": f"{data_dir / source.file} not found"})
            continue
        cases.append(_run_case(case, pools.get(case.data), 2 if quick else 4))
    planning = _planning(quick)
    comm = _comm(quick)
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "context_parallel",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "data_seed": DATA_SEED,
        "cases": cases,
        "planning": planning,
        "comm": comm,
        "simulated": _simulated(quick),
        "all_targets_hold": all(c["check"]["ok"] for c in checked)
        and all(p["ok"] for p in planning)
        and comm["ok"],
    }


def check_targets(result: dict) -> list[str]:
    """Lines starting PASS, FAIL, SKIP or INFO, one per target."""
    lines = []
    for c in result["cases"]:
        if c.get("skipped"):
            lines.append(f"SKIP {c['name']}: {c['skipped']}")
            continue
        ch = c["check"]
        state = ("PASS" if ch["ok"] else "FAIL") if ch["applies"] else "INFO"
        lines.append(
            f"{state} {c['name']}: today's bound {c['bound']['mean']:.2f}, best CP (g <= 8) "
            f"{ch['best']:.3f}, g = 8 ideal {c['methods']['g8']['ideal']:.3f} (target {TARGET} "
            f"where the bound is {WALL[0]}-{WALL[1]})"
        )
    for p in result["planning"]:
        lines.append(
            f"{'PASS' if p['ok'] else 'FAIL'} plan_step {PLAN_TARGET[0]} documents W="
            f"{PLAN_TARGET[1]} {p['data']} g={p['g']}: worst {1e3 * p['worst']:.1f} ms of CPU "
            f"(target {1e3 * p['target']:.0f} ms; today with the same padding "
            f"{1e3 * p['same_padding_worst']:.1f} ms)"
        )
    comm = result["comm"]
    lines.append(
        f"{'PASS' if comm['ok'] else 'FAIL'} exchange model against gloo all-gathers (g="
        f"{COMM_CHECKED}): worst error {100 * comm['worst_error']:.1f}% (target "
        f"{100 * COMM_TARGET:.0f}%)"
    )
    return lines


def format_table(result: dict) -> str:
    """A plain-text line per case, then the target lines."""
    lines = [f"{'case':28s} {'bound':>6} " + " ".join(f"{'g' + str(g):>13}" for g in SIZES)]
    for c in result["cases"]:
        if c.get("skipped"):
            continue
        cells = " ".join(
            f"{c['methods'][f'g{g}']['mean']:6.3f}/{c['methods'][f'g{g}']['worst']:6.3f}"
            for g in SIZES
        )
        lines.append(f"{c['name']:28s} {c['bound']['mean']:6.2f} {cells}")
    lines.append("")
    for s in result["simulated"]:
        lines.append(
            f"simulated W={s['devices']} g={s['context_parallel']}: step {s['step_s']:.3f} s, "
            f"exchange {s['exchange_s']:.4f} s, max/mean {s['balance_mean']:.3f}, "
            f"{s['speedup']:.2f}x"
        )
    lines.append("")
    return "\n".join(lines + check_targets(result))


def render_markdown(result: dict, img_dir: Path) -> str:
    """The section of docs/benchmarks.md (no plot)."""
    cases = [c for c in result["cases"] if not c.get("skipped")]
    applying = [c for c in cases if c["check"]["applies"]]
    lines = [
        "## Context parallelism: outliers sharded over CP groups",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s, {result['machine']['date_utc']}): "
        "`chronica.plan_step` with `Packing(context_parallel=g)` (the step's W devices in "
        "groups of g; documents costlier than half a device's fair share sharded head-tail "
        "over their group, the rest packed whole) against chronica's plan of today "
        "(`context_parallel=1`). A step is d·W documents (d = 4 or 8 per device) drawn from "
        "the data (the real length files sampled with replacement) and cut to the cap; cost "
        "24576·L + L² (`CostModel(0, 24576, 1)`); seed "
        f"{result['data_seed']}, {cases[0]['steps'] if cases else 0} steps a case. Figure: the "
        "per-device cost's max / mean, mean over the steps / worst step; *bound*: today's "
        "bound max(mean, largest document) / mean. Reproduce: "
        f"`{result.get('command', 'python -m benchmarks --only context_parallel')}`.",
        "",
        "| case | bound | today (g=1) | g=2 | g=4 | g=8 | g=8 ideal | sharded/step (g=8) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        m = c["methods"]
        cells = " | ".join(f"{m[f'g{g}']['mean']:.3f} / {m[f'g{g}']['worst']:.3f}" for g in SIZES)
        lines.append(
            f"| {c['name']} | {c['bound']['mean']:.2f} | {cells} | {m['g8']['ideal']:.3f} | "
            f"{m['g8']['sharded']:.0f} |"
        )
    if applying:
        best = [c["check"]["best"] for c in applying]
        lines += [
            "",
            f"Where today's bound is {WALL[0]}–{WALL[1]} ({len(applying)} of {len(cases)} "
            f"cases), the best CP plan with g ≤ 8 has a mean figure of {min(best):.3f}–"
            f"{max(best):.3f} (target {TARGET}; {sum(b <= TARGET for b in best)} of "
            f"{len(applying)} meet it).",
        ]
    above = [c for c in cases if c["bound"]["mean"] > WALL[1]]
    missed = [c for c in above if c["methods"]["g8"]["mean"] > TARGET]
    if above:
        lines += [
            "",
            f"Above that band ({len(above)} cases, bound up to "
            f"{max(c['bound']['mean'] for c in above):.2f}), g = 8 meets {TARGET} in "
            f"{len(above) - len(missed)}; "
            + (
                "in "
                + ", ".join(
                    f"{c['name']} ({c['methods']['g8']['mean']:.3f}, ideal "
                    f"{c['methods']['g8']['ideal']:.3f})"
                    for c in missed
                )
                + " the largest document alone, split 8 ways, costs that much more than the "
                "mean: the *g=8 ideal* column, max(mean, largest / 8) / mean, is what no "
                "g = 8 plan can beat."
                if missed
                else "every one."
            ),
        ]
    lines += ["", "Planning CPU time, worst step (16,384 documents, 256 devices; target 100 ms; "
              "this 2-core machine was shared with other work, so compare each row with "
              "today's plan of the same steps under the same padding, `pad_multiple = 2·g`, "
              "the last column). The g = 1 rows are today's plan; with g > 1 the whole "
              "documents' refinement looks at an eighth of the rank kernel's candidates "
              "(`context_step._REFINE_SHARE`), which leaves the slowest device within "
              "about 0.03% of the mean instead of 0.001% at a quarter of the time:", "",
              "| data | g | worst ms | median ms | today, same padding: worst ms |",
              "|---|---|---|---|---|"]  # fmt: skip
    for p in result["planning"]:
        lines.append(
            f"| {p['data']} | {p['g']} | {1e3 * p['worst']:.1f} | {1e3 * p['median']:.1f} | "
            f"{1e3 * p['same_padding_worst']:.1f} |"
        )
    comm = result["comm"]
    lines += [
        "",
        "The exchange model of `chronica simulate context-parallel` (`chronica.sim.context."
        "CommModel`: (g − 1)·latency + (g − 1)/g · bytes / bandwidth per all-gather) against "
        "gloo all-gathers measured on this machine (processes on 127.0.0.1, the fastest of "
        "the timed calls per point over three process groups; buffers of 1–8 MiB; fitted "
        "and checked at g = "
        f"{COMM_CHECKED}, the group this 2-core machine runs without oversubscribing it; "
        "g = 4 shown beside): latency "
        f"{1e6 * comm['latency']:.0f} µs, "
        f"bandwidth {comm['bandwidth'] / 1e9:.2f} GB/s; worst error "
        f"{100 * comm['worst_error']:.1f}% at g = {COMM_CHECKED} (target "
        f"{100 * COMM_TARGET:.0f}%). Larger buffers leave this VM's caches and take "
        "disproportionately longer (16 MiB about 3× the time of 8), smaller ones drown in the "
        "shared machine's scheduling noise; at g = 4 four processes share two cores, so the "
        "measured times there are the cores', not the exchange's.",
        "",
        "| g | bytes | measured ms | model ms | error |",
        "|---|---|---|---|---|",
    ]
    for p in comm["points"]:
        lines.append(
            f"| {p['size']} | {p['bytes']:,} | {1e3 * p['fastest']:.2f} | {1e3 * p['model']:.2f} "
            f"| {100 * p['error']:+.1f}% |"
        )
    lines += [
        "",
        "Simulated (`chronica simulate context-parallel`, lognormal(6, 1.5), 4 documents per "
        "device, 16k cap, the default exchange: 10 µs, 100 GB/s, 4096 bytes of keys and "
        "values per token and layer, 32 layers, all-gather forward and reduce-scatter "
        "backward, not overlapped):",
        "",
        "| W | g | step s | exchange s | max/mean | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for s in result["simulated"]:
        lines.append(
            f"| {s['devices']} | {s['context_parallel']} | {s['step_s']:.3f} | "
            f"{s['exchange_s']:.4f} | {s['balance_mean']:.3f} | {s['speedup']:.2f}× |"
        )
    lines.append("")
    return "\n".join(lines)
