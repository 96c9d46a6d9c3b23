"""Lockstep benchmark: ``chronica.plan_step`` with ``Packing(balance="micro")`` and its peers
on the step FSDP, ZeRO-3 and expert parallelism run.

Under those, micro-batch *k* of every rank ends in a collective, so the step lasts
``sum_k max_r C[r, k]``, not ``max_r sum_k C[r, k]``. A *step* is one global batch of
``d·W`` documents (``d`` per rank: about four micro-batches' worth of tokens at the case's
cap, 8 to 256, and at most 16,384 documents a step) from a data set: the real length files
sampled with replacement, or lognormal lengths; lengths longer than the cap are cut to it.
Every method plans the step for ``W`` ranks under the same cap and is scored on the same
predicted costs
(``chronica.CostModel``: ``linear`` = tokens, ``quadratic`` = ``24576·L + L²``):

* **lockstep figure** ``sum_k max_r C[r, k] / mean_r sum_k C[r, k]`` (1 = no rank ever
  waits at a collective) and **rank-sum figure** ``max_r sum_k C[r, k] / mean`` (the DDP
  step), each the mean over the steps and the worst step, beside the bound
  ``max(mean, largest document cost) / mean`` that neither figure can beat, and the
  lockstep figure's own bound (``lockstep_bound``), which also counts the cap;
* **micro-batches** per rank, **cap violations** (micro-batches over ``max_tokens``) and
  **empty cells** (a rank's micro-batch with no document);
* **planning time**: CPU seconds of one call, the worst step of the case (not the median).

Methods: chronica ``balance="micro"`` and ``balance="rank"`` (``chronica.plan_step``), and
the peers of ``benchmarks/lockstep_peers.py`` (verl, NeMo-RL, a lockstep LPT reference).

Also timed: ``plan_step(balance="rank")`` over 40 draws of the step sizes whose planning had
a tail (318 documents for 4 ranks, 1,280 for 8; lognormal(6, 1.2) lengths), worst and median.

Targets checked (and printed, never tuned away): chronica ``balance="micro"`` keeps the cap;
its mean lockstep figure is at most 1.05 wherever the lockstep bound's mean is; its mean and worst
lockstep figures are no worse than those of any peer whose plans hold the same constraints (the
cap, no empty cell; the others are listed with what they broke, and counted apart); and
planning 4,096 documents for 64 ranks takes at most 20 ms of CPU, 16,384 for 256 at most
100 ms, in the worst step.

Run alone: ``python -m benchmarks --only lockstep [--quick]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import lockstep_peers as peers
from benchmarks.common import machine_info, read_lengths
from benchmarks.packing import default_data_dir
from benchmarks.packing_peers import MicroBatches
from chronica import CostModel, Packing, plan_step
from chronica.core.packing.lockstep_bound import lockstep_floor

__all__ = ["CASES", "METHODS", "check_targets", "counts", "format_table", "render_markdown", "run"]

DATA_SEED = 2028
LOCKSTEP_TARGET = 1.05
# Relative slack for comparisons between methods: float sums in a different order.
EPS = 1e-9
LOG_FLOOR = 1e-6
MICRO_PER_RANK = 4  # about this many micro-batches' worth of tokens per rank and step
DOCS_PER_RANK = (8, 256)
MAX_DOCS_PER_STEP = 16384  # the largest step the planning target names
PLAN_TARGETS = ((4096, 64, 0.020), (16384, 256, 0.100))  # documents, W, CPU seconds
# Steps where pack_step's refinement used to run long: (documents, W), lognormal(6, 1.2).
TAIL_STEPS = ((318, 4), (1280, 8))

METHODS = [
    ("micro", 'chronica plan_step, balance="micro"'),
    ("rank", 'chronica plan_step, balance="rank"'),
    ("verl", "verl (KK equal counts + rearrange_micro_batches, balanced order)"),
    ("nemo_rl", "NeMo-RL first-fit decreasing, bins round-robin"),
    ("lpt", "lockstep LPT reference"),
]
PEERS = ("verl", "nemo_rl", "lpt")
STYLE = {
    "micro": ("tab:blue", "o"),
    "rank": ("tab:cyan", "P"),
    "verl": ("tab:orange", "s"),
    "nemo_rl": ("tab:purple", "D"),
    "lpt": ("tab:green", "^"),
}
COSTS = {"linear": CostModel.linear(), "quadratic": CostModel.quadratic(b=24576.0, c=1.0)}


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
        Data("lee", "lee_lengths.txt (300 documents, longest 620)", "lee_lengths.txt"),
        Data("head500", "head500_lengths.txt (250 documents, longest 6610)", "head500_lengths.txt"),
        Data("ln6-1.0", "lognormal(6, 1.0)", mu=6.0, sigma=1.0),
        Data("ln6-1.5", "lognormal(6, 1.5)", mu=6.0, sigma=1.5),
        Data("ln7-1.5", "lognormal(7, 1.5)", mu=7.0, sigma=1.5),
    )
}


@dataclass(frozen=True)
class Case:
    """One setting: data, W, the cap of a micro-batch and the cost model."""

    data: str
    num_replicas: int
    max_tokens: int
    cost: str

    @property
    def name(self) -> str:
        return f"{self.data}-W{self.num_replicas}-{self.max_tokens // 1024}k-{self.cost}"


CASES = [
    Case(data, w, cap, cost)
    for data in DATA
    for w in (8, 64, 256)
    for cap in (4096, 16384, 32768)
    for cost in ("linear", "quadratic")
]


def _draw(data: Data, pool: np.ndarray | None, n: int, cap: int, rng) -> np.ndarray:
    """``n`` lengths (int64, in ``[1, cap]``) from the pool or the lognormal."""
    if pool is None:
        raw = np.rint(rng.lognormal(data.mu, data.sigma, n))
    else:
        raw = pool[rng.integers(0, pool.shape[0], n)]
    return np.clip(raw, 1, cap).astype(np.int64)


def docs_per_rank(data: Data, pool: np.ndarray | None, cap: int, w: int) -> int:
    """About ``MICRO_PER_RANK`` micro-batches' worth of tokens per rank, in documents
    (within ``DOCS_PER_RANK``, and at most ``MAX_DOCS_PER_STEP`` for the step)."""
    mean = float(_draw(data, pool, 20000, cap, np.random.default_rng(DATA_SEED)).mean())
    low, high = DOCS_PER_RANK
    return int(np.clip(round(MICRO_PER_RANK * cap / mean), low, min(high, MAX_DOCS_PER_STEP // w)))


def _steps(case: Case, pool: np.ndarray | None, num_steps: int):
    """The case's steps: ``num_steps`` arrays of ``d·W`` lengths, the same for both costs."""
    data = DATA[case.data]
    n = docs_per_rank(data, pool, case.max_tokens, case.num_replicas) * case.num_replicas
    rng = np.random.default_rng([DATA_SEED, case.num_replicas, case.max_tokens])
    for _ in range(num_steps):
        yield _draw(data, pool, n, case.max_tokens, rng)


def _plan(key: str, lengths: np.ndarray, costs: np.ndarray, case: Case):
    """Run one method: ``(MicroBatches, CPU seconds of the call)``."""
    w, cap = case.num_replicas, case.max_tokens
    start = time.process_time()
    if key in ("micro", "rank"):
        plan = plan_step(lengths, w, Packing(max_tokens=cap, balance=key), cost=COSTS[case.cost])
        seconds = time.process_time() - start
        out = MicroBatches(plan.rank, plan.micro, plan.num_micro, lengths.astype(np.float64))
        return out, seconds
    if key == "verl":
        out = peers.verl(lengths, costs, w, cap)
    elif key == "nemo_rl":
        out = peers.nemo_rl(lengths, w, cap)
    else:
        out = peers.lpt(lengths, costs, w, cap)
    return out, time.process_time() - start


def lockstep_bound(lengths: np.ndarray, costs: np.ndarray, w: int, cap: int) -> float:
    """A lower bound of ``sum_k max_r C[r, k]`` over every plan of the step for ``w`` equal
    ranks with at most ``cap`` tokens a micro-batch (any number of micro-batches), divided by
    the mean rank sum ``T / w``: ``chronica.core.packing.lockstep_bound.lockstep_floor``
    (the mean, the costliest document, documents over half the cap, the wall's column, and
    cells that cannot reach their index's maximum, sharing the short documents' cost per
    token; the proof is its module docstring, and
    ``tests/core/test_packing_lockstep_bound.py`` checks it against every plan of small
    steps)."""
    return lockstep_floor(lengths, costs, w, cap) / (float(costs.sum()) / w)


def figures(mb: MicroBatches, costs: np.ndarray, w: int, cap: int) -> dict:
    """The figures of one plan of one step (module docstring)."""
    n = costs.shape[0]
    assert mb.rank.shape == mb.micro.shape == (n,)
    assert mb.rank.min() >= 0 and mb.rank.max() < w, "a rank out of range"
    assert mb.micro.min() >= 0 and mb.micro.max() < mb.num_micro, "a micro-batch out of range"
    flat = mb.rank * mb.num_micro + mb.micro
    cells = np.bincount(flat, weights=costs, minlength=w * mb.num_micro).reshape(w, -1)
    mean = cells.sum(axis=1).mean()
    return {
        "lockstep": float(cells.max(axis=0).sum() / mean),
        "ranksum": float(cells.sum(axis=1).max() / mean),
        "bound": float(max(mean, costs.max()) / mean),
        "micro": int(mb.num_micro),
        "violations": int(np.sum(mb.tokens(w) > cap)),
        "empty_cells": int(np.sum(np.bincount(flat, minlength=w * mb.num_micro) == 0)),
    }


def _warm_up() -> None:
    """Load (or compile) every numba kernel, so that no timing includes it."""
    lengths = np.array([5, 3, 2, 7, 1, 4, 6, 2], dtype=np.int64)
    for key, _ in METHODS:
        for cost in COSTS:
            _plan(key, lengths, COSTS[cost](lengths), Case("lee", 2, 8, cost))


def _summary(steps: list[dict], seconds: list[float]) -> dict:
    out: dict[str, Any] = {}
    for fig in ("lockstep", "ranksum"):
        values = [s[fig] for s in steps]
        out[fig] = {"mean": float(np.mean(values)), "worst": float(np.max(values))}
        out[f"{fig}_steps"] = values
    out["micro_mean"] = float(np.mean([s["micro"] for s in steps]))
    out["violations"] = int(sum(s["violations"] for s in steps))
    out["empty_cells"] = int(sum(s["empty_cells"] for s in steps))
    out["plan_worst"] = float(max(seconds))
    out["plan_median"] = float(np.median(seconds))
    return out


def _run_case(case: Case, pool: np.ndarray | None, num_steps: int) -> dict:
    model = COSTS[case.cost]
    per_step: dict[str, list[dict]] = {key: [] for key, _ in METHODS}
    seconds: dict[str, list[float]] = {key: [] for key, _ in METHODS}
    docs = 0
    lockstep: list[float] = []
    for lengths in _steps(case, pool, num_steps):
        docs = int(lengths.shape[0])
        costs = model(lengths)
        lockstep.append(lockstep_bound(lengths, costs, case.num_replicas, case.max_tokens))
        for key, _ in METHODS:
            mb, spent = _plan(key, lengths, costs, case)
            seconds[key].append(spent)
            per_step[key].append(figures(mb, costs, case.num_replicas, case.max_tokens))
    bound = [s["bound"] for s in per_step["micro"]]
    entry = {
        "name": case.name,
        "data": case.data,
        "num_replicas": case.num_replicas,
        "max_tokens": case.max_tokens,
        "cost": case.cost,
        "docs_per_step": docs,
        "steps": num_steps,
        "bound": {"mean": float(np.mean(bound)), "worst": float(np.max(bound))},
        "lockstep_bound": {"mean": float(np.mean(lockstep)), "worst": float(np.max(lockstep))},
        "methods": {key: _summary(per_step[key], seconds[key]) for key, _ in METHODS},
    }
    entry["checks"] = _checks(entry)
    return entry


def _checks(case: dict) -> dict:
    """The targets on one case; every entry has ``ok`` and the numbers behind it.

    ``at_least_every_peer`` compares against the peers whose plans of the case hold the
    problem's constraints (no micro-batch over the cap, no empty cell: every rank runs
    the same number of non-empty micro-batches); a peer whose plan breaks one solved
    another problem, and is listed under ``set_aside`` with what it broke (``figure_ok``:
    whether ours is also no worse than those figures)."""
    ours = case["methods"]["micro"]
    applies = case["lockstep_bound"]["mean"] <= LOCKSTEP_TARGET
    failing: list[str] = []
    set_aside: list[str] = []
    for peer in PEERS:
        theirs = case["methods"][peer]
        for stat in ("mean", "worst"):
            if ours["lockstep"][stat] > theirs["lockstep"][stat] * (1 + EPS):
                line = (
                    f"{peer} {stat} {theirs['lockstep'][stat]:.5f} < {ours['lockstep'][stat]:.5f}"
                )
                broken = _broken(theirs)
                (set_aside if broken else failing).append(line + (f" ({broken})" if broken else ""))
    return {
        "no_cap_violations": {"ok": ours["violations"] == 0, "violations": ours["violations"]},
        "lockstep_within_5pct": {
            "ok": ours["lockstep"]["mean"] <= LOCKSTEP_TARGET if applies else True,
            "applies": applies,
            "mean": ours["lockstep"]["mean"],
        },
        "at_least_every_peer": {
            "ok": not failing,
            "failing": failing,
            "set_aside": set_aside,
            "figure_ok": not failing and not set_aside,
        },
    }


def _broken(method: dict) -> str:
    """What a method's plans of a case break ("" where they hold the constraints): a
    micro-batch over the cap is no plan for a job with a hard token cap, and an empty cell
    is a rank running a micro-batch's forward and collectives on nothing (unequal counts of
    real micro-batches)."""
    return ", ".join(
        f"{method[key]} {what}"
        for key, what in (
            ("violations", "micro-batches over the cap"),
            ("empty_cells", "empty cells"),
        )
        if method.get(key)
    )


def counts(result: dict) -> dict:
    """How many cases pass each target: ``(passed, of)`` for the 1.05 target (of the cases
    where the lockstep bound allows it), no worse than every peer whose plans hold the
    constraints, and no worse than every peer's figure whatever its plans break."""
    cases = [c for c in result["cases"] if not c.get("skipped")]
    peer = [c["checks"]["at_least_every_peer"] for c in cases]
    within = [c["checks"]["lockstep_within_5pct"] for c in cases]
    return {
        "within_5pct": (
            sum(ch["ok"] for ch in within if ch["applies"]),
            sum(ch["applies"] for ch in within),
        ),
        "every_valid_peer": (sum(ch["ok"] for ch in peer), len(peer)),
        "every_peer_figure": (sum(ch["figure_ok"] for ch in peer), len(peer)),
    }


def _counts_line(result: dict) -> str:
    got = counts(result)
    return (
        "Lockstep figure ≤ {} wherever the lockstep bound allows: {} of {}; ≤ every peer whose "
        "plan holds the constraints (cap, no empty cell): {} of {}; ≤ every peer's figure: {} "
        "of {}."
    ).format(
        LOCKSTEP_TARGET, *got["within_5pct"], *got["every_valid_peer"], *got["every_peer_figure"]
    )


def _planning(quick: bool) -> list[dict]:
    """CPU time of ``plan_step`` at the issue's sizes: the worst step of several."""
    steps = 3 if quick else 6
    out = []
    for n, w, target in PLAN_TARGETS:
        for data in ("ln6-1.0", "ln7-1.5"):
            for cost in COSTS:
                for balance in ("micro", "rank"):
                    rng = np.random.default_rng([DATA_SEED, n, w])
                    packing = Packing(max_tokens=16384, balance=balance)
                    times = []
                    for _ in range(steps):
                        lengths = _draw(DATA[data], None, n, 16384, rng)
                        start = time.process_time()
                        plan_step(lengths, w, packing, cost=COSTS[cost])
                        times.append(time.process_time() - start)
                    out.append(
                        {
                            "documents": n,
                            "num_replicas": w,
                            "data": data,
                            "cost": cost,
                            "balance": balance,
                            "steps": steps,
                            "worst": float(max(times)),
                            "median": float(np.median(times)),
                            "target": target,
                            "ok": max(times) <= target,
                        }
                    )
    return out


def _tail(quick: bool) -> list[dict]:
    """CPU time of ``plan_step(balance="rank")`` over many draws of the step sizes whose
    planning had a tail (lognormal(6, 1.2) lengths, 16k cap): the worst draw and the median."""
    draws = 10 if quick else 40
    out = []
    for n, w in TAIL_STEPS:
        for cost in COSTS:
            rng = np.random.default_rng([DATA_SEED, n, w, 1])
            data = Data("ln6-1.2", "lognormal(6, 1.2)", mu=6.0, sigma=1.2)
            times = []
            for _ in range(draws):
                lengths = _draw(data, None, n, 16384, rng)
                start = time.process_time()
                plan_step(lengths, w, Packing(max_tokens=16384), cost=COSTS[cost])
                times.append(time.process_time() - start)
            out.append(
                {
                    "documents": n,
                    "num_replicas": w,
                    "cost": cost,
                    "draws": draws,
                    "worst": float(max(times)),
                    "median": float(np.median(times)),
                }
            )
    return out


def _cases(quick: bool) -> list[Case]:
    if not quick:
        return CASES
    # Quick: every data set at W=8 and 64 with the 16k cap, and W=256 once.
    keep = [c for c in CASES if c.num_replicas < 256 and c.max_tokens == 16384]
    return keep + [Case("ln6-1.0", 256, 16384, "quadratic")]


def _num_steps(case: Case, quick: bool) -> int:
    if quick:
        return 2
    return {8: 6, 64: 2, 256: 1}[case.num_replicas]


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Run every case and the planning targets; the JSON-ready result."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    started = time.perf_counter()
    _warm_up()
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
        cases.append(_run_case(case, pools.get(case.data), _num_steps(case, quick)))
    planning = _planning(quick)
    tail = _tail(quick)
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "lockstep",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "data_seed": DATA_SEED,
        "data_dir": str(data_dir),
        "methods": dict(METHODS),
        "cases": cases,
        "planning": planning,
        "tail": tail,
        "all_targets_hold": all(ch["ok"] for c in checked for ch in c["checks"].values())
        and all(p["ok"] for p in planning),
    }


def check_targets(result: dict) -> list[str]:
    """Human-readable lines, one per (case, target), starting with PASS, FAIL or SKIP."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"SKIP {case['name']}: {case['skipped']}")
            continue
        for target, check in case["checks"].items():
            detail = {k: v for k, v in check.items() if k != "ok"}
            lines.append(f"{'PASS' if check['ok'] else 'FAIL'} {case['name']} {target} {detail}")
    lines.append(f"INFO {_counts_line(result)}")
    for t in result.get("tail", []):
        lines.append(
            f"INFO plan_step {t['documents']} documents W={t['num_replicas']} lognormal(6, 1.2) "
            f"{t['cost']}: worst of {t['draws']} draws {1e3 * t['worst']:.1f} ms of CPU, median "
            f"{1e3 * t['median']:.1f} ms"
        )
    for p in result["planning"]:
        lines.append(
            f"{'PASS' if p['ok'] else 'FAIL'} plan_step {p['documents']} documents W="
            f"{p['num_replicas']} {p['data']} {p['cost']} balance={p['balance']}: worst "
            f"{1e3 * p['worst']:.1f} ms of CPU (target {1e3 * p['target']:.0f} ms)"
        )
    return lines


def format_table(result: dict) -> str:
    """A plain-text table per case, then the target lines."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"\n{case['name']}: skipped ({case['skipped']})")
            continue
        b, lb = case["bound"], case["lockstep_bound"]
        lines.append(
            f"\n{case['name']}  ({case['docs_per_step']} documents, {case['steps']} steps; "
            f"bound mean {b['mean']:.4f} worst {b['worst']:.4f}; "
            f"lockstep bound mean {lb['mean']:.4f} worst {lb['worst']:.4f})"
        )
        for key, label in METHODS:
            m = case["methods"][key]
            lines.append(
                f"  {label:62s} lockstep {m['lockstep']['mean']:.4f}/{m['lockstep']['worst']:.4f}"
                f"  rank sums {m['ranksum']['mean']:.4f}/{m['ranksum']['worst']:.4f}"
                f"  micro {m['micro_mean']:5.2f}  over cap {m['violations']:3d}"
                f"  plan worst {1e3 * m['plan_worst']:8.2f} ms"
            )
    lines.append("")
    lines += check_targets(result)
    return "\n".join(lines)


# -- the page ----------------------------------------------------------------------------------


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in result["cases"] if not c.get("skipped")]
    keys = [k for k, _ in METHODS]
    fig, axes = plt.subplots(
        1, 2, figsize=(12, 0.16 * len(cases) + 2.0), sharey=True, layout="constrained"
    )
    for ax, fig_key, title in (
        (axes[0], "lockstep", "lockstep figure − 1: Σₖ maxᵣ C[r,k] / mean rank sum − 1"),
        (axes[1], "ranksum", "rank-sum figure − 1: maxᵣ Σₖ C[r,k] / mean − 1"),
    ):
        for j, key in enumerate(keys):
            color, marker = STYLE[key]
            y = np.arange(len(cases)) + (j - (len(keys) - 1) / 2) * 0.15
            mean = [max(c["methods"][key][fig_key]["mean"] - 1, LOG_FLOOR) for c in cases]
            worst = [max(c["methods"][key][fig_key]["worst"] - 1, LOG_FLOOR) for c in cases]
            ax.hlines(y, mean, worst, color=color, lw=0.8, alpha=0.6)
            label = result["methods"][key] if ax is axes[0] else None
            ax.scatter(mean, y, color=color, marker=marker, s=10, label=label)
        bound = [max(c["bound"]["mean"] - 1, LOG_FLOOR) for c in cases]
        ax.scatter(bound, range(len(cases)), color="black", marker="|", s=40)
        ax.set_xscale("log")
        ax.set_xlim(LOG_FLOOR / 2, 20)
        ax.set_xlabel(f"{title} (marker: mean, line to the worst step; | bound)", fontsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=6)
    axes[0].axvline(LOCKSTEP_TARGET - 1, color="gray", ls=":", lw=1)
    axes[0].set_yticks(range(len(cases)))
    axes[0].set_yticklabels([c["name"] for c in cases], fontsize=5)
    axes[0].invert_yaxis()
    fig.legend(fontsize=7, loc="outside upper center", ncol=3)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _reading(cases: list[dict]) -> list[str]:
    """A paragraph of what the tables say, computed from them."""

    def span(key: str, fig: str) -> str:
        values = [c["methods"][key][fig]["mean"] for c in cases]
        return f"{min(values):.4f}–{max(values):.4f}"

    beaten = {
        peer: sum(
            c["methods"][peer]["lockstep"]["mean"] < c["methods"]["micro"]["lockstep"]["mean"]
            for c in cases
        )
        for peer in PEERS
    }
    price = [
        c["methods"]["micro"]["ranksum"]["mean"] - c["methods"]["rank"]["ranksum"]["mean"]
        for c in cases
    ]
    over = [c["name"] for c in cases if c["methods"]["verl"]["violations"]]
    return [
        f'Reading the figures: `balance="micro"` has a mean lockstep figure of '
        f'{span("micro", "lockstep")} over the cases, `balance="rank"` '
        f"{span('rank', 'lockstep')}, verl {span('verl', 'lockstep')}, NeMo-RL "
        f"{span('nemo_rl', 'lockstep')} and the lockstep LPT reference "
        f"{span('lpt', 'lockstep')}. A peer's mean lockstep figure is below "
        f'`balance="micro"`\'s in {beaten["verl"]} (verl), {beaten["nemo_rl"]} (NeMo-RL) '
        f"and {beaten['lpt']} (LPT) of {len(cases)} cases. The price in rank sums: "
        f'`balance="micro"`\'s mean rank-sum figure is {span("micro", "ranksum")} against '
        f'`balance="rank"`\'s {span("rank", "ranksum")} (at most {max(price):+.4f}). '
        f"verl put more than max_tokens tokens in a micro-batch in {len(over)} of "
        f"{len(cases)} cases (its micro-batch split balances workload, not tokens). The LPT "
        "reference may leave (rank, micro-batch) cells empty, a rank idling through a "
        "micro-batch's collectives; chronica's plans leave none where the step has a document "
        "for every cell.",
        "",
    ]


def render_markdown(result: dict, img_dir: Path) -> str:
    """The section of docs/benchmarks.md, with its plot written into ``img_dir``."""
    img_dir = Path(img_dir)
    _plot(result, img_dir / "lockstep.png")
    cases = [c for c in result["cases"] if not c.get("skipped")]
    failures = sum(not ch["ok"] for c in cases for ch in c["checks"].values())
    failures += sum(not p["ok"] for p in result["planning"])
    lines = [
        "## Lockstep micro-batches",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s): `chronica.plan_step` with "
        '`Packing(balance="micro")` (the step of FSDP, ZeRO-3, expert parallelism: micro-batch '
        "*k* of every rank runs in lockstep, so a step lasts Σₖ maxᵣ C[r,k]) and "
        '`balance="rank"` (the DDP step, maxᵣ Σₖ C[r,k]), against verl, NeMo-RL and a '
        "lockstep LPT reference, re-implemented in `benchmarks/lockstep_peers.py` from their "
        "published code. A step is a global batch of d·W documents (d per rank: about "
        f"{MICRO_PER_RANK} micro-batches' worth of tokens at the cap, {DOCS_PER_RANK[0]} to "
        f"{DOCS_PER_RANK[1]}, at most {MAX_DOCS_PER_STEP} a step): the real length files "
        "sampled with replacement, or lognormal lengths, cut to the cap (seed "
        f"{result['data_seed']}). Costs: `linear` (tokens) and `quadratic` (24576·L + L², "
        "`CostModel.quadratic(b=24576.0, c=1.0)`). Figures: the lockstep figure Σₖ maxᵣ "
        "C[r,k] / mean rank sum and the rank-sum figure maxᵣ Σₖ C[r,k] / mean, as the mean "
        "over the steps / the worst step; the bound max(mean, largest document) / mean "
        "bounds both. The lockstep bound (`lockstep_floor` in "
        "`chronica/core/packing/lockstep_bound.py`, which `pack_step` also uses) also "
        "counts the cap: documents longer than half of it never share a micro-batch, and the "
        "micro-batch index that holds the costliest document c₁ has W − 1 other cells of at "
        "most (W − 1)·cap tokens, costing at most F (the costliest tokens besides c₁), so a "
        "step lasts at least c₁·(1 − 1/W) + (total − F)/W. And cells idle where they cannot "
        "reach their index's maximum: W times the step is the total plus every cell's idle "
        "time; a cell holding a document i longer than half the cap costs at most "
        "uᵢ = cᵢ + (cap − Lᵢ)·d(cap − Lᵢ) (d(R): the highest cost per token of a document of "
        "at most R tokens), any other cell at most cap·d(cap/2); the q = ⌈long documents / W⌉ "
        "costliest indices have maxima tⱼ ≥ b_{jW} (the long documents' costs sorted "
        "descending), and their qW distinct cells idle at least Σ (t − u)⁺, least when the "
        "largest u meet the largest t (a convex sum: uncrossing a pair never raises it), so a "
        "step lasts at least (total + that idle time)/W. The cells share the few dense short "
        "documents: at any price p per token, the short documents of a cell with room R cost "
        "at most p·R plus their cost above p per token, and all short documents together "
        "have E(p) = Σ (cⱼ − p·Lⱼ)⁺ of that; with u(p) = the same caps at min(p, d) per token, "
        "a cell idles at least (t − u(p))⁺ minus its share, so a step lasts at least "
        "(total + Σ (t − u(p))⁺ − E(p))/W for every p (the bound takes the best of a few; "
        "p = ∞ is the rule before). The 1.05 target applies where the "
        "lockstep bound's mean is at most 1.05. The peer target compares the mean and worst "
        "lockstep figures with those of every peer whose plans of the case hold the "
        "problem's constraints: no micro-batch over the cap and no empty (rank, "
        "micro-batch) cell, so that every rank runs the same number of real micro-batches; "
        "a peer whose plan breaks one is listed beside the figure it won with, and the "
        "summary also counts the cases where ours is no worse than every peer's figure "
        "whatever its plan breaks. Planning time is CPU time of one call, the worst step of "
        "the case.",
        "",
        "```sh",
        f"{result['command']}",
        "```",
        "",
        "![lockstep and rank-sum figures per case](img/lockstep.png)",
        "",
        f"{failures} failed check(s)." if failures else "All targets hold.",
        "",
        _counts_line(result),
        "",
        *_reading(cases),
        "### Planning time of `plan_step` (CPU, worst step)",
        "",
        "| documents | W | lengths | cost | balance | worst (ms) | median (ms) | target |",
        "|---:|---:|---|---|---|---:|---:|---|",
    ]
    for p in result["planning"]:
        mark = "pass" if p["ok"] else "**FAIL**"
        lines.append(
            f"| {p['documents']} | {p['num_replicas']} | {p['data']} | {p['cost']} | "
            f"{p['balance']} | {1e3 * p['worst']:.1f} | {1e3 * p['median']:.1f} | "
            f"{mark} (≤ {1e3 * p['target']:.0f} ms) |"
        )
    lines += [
        "",
        'The steps whose `balance="rank"` planning had a tail (the refinement crawled where '
        "the cap leaves little room; its work is now bounded): lognormal(6, 1.2) lengths, "
        "16k cap, CPU time over many draws.",
        "",
        "| documents | W | cost | draws | worst (ms) | median (ms) |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for t in result.get("tail", []):
        lines.append(
            f"| {t['documents']} | {t['num_replicas']} | {t['cost']} | {t['draws']} | "
            f"{1e3 * t['worst']:.1f} | {1e3 * t['median']:.1f} |"
        )
    lines += [
        "",
        "### Figures",
        "",
        "Lockstep figure and rank-sum figure as mean / worst over the steps; micro-batches per "
        "rank (mean); cap violations; the worst planning time of the case. A peer whose "
        "plans break the constraints (cap, no empty cell) is marked *set aside*: the peer "
        "target does not compare with it.",
        "",
        "| case | docs | bound | lockstep bound | method | lockstep | rank sums | micro | "
        "over cap | plan worst (ms) | checks |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for case in cases:
        bad = [name for name, ch in case["checks"].items() if not ch["ok"]]
        for i, (key, label) in enumerate(METHODS):
            m = case["methods"][key]
            head = (
                [
                    case["name"],
                    str(case["docs_per_step"]),
                    f"{case['bound']['mean']:.4f}",
                    f"{case['lockstep_bound']['mean']:.4f}",
                ]
                if i == 0
                else ["", "", "", ""]
            )
            name = f"**{label}**" if key == "micro" else label
            if i == 0:
                verdict = "**FAIL** " + ", ".join(bad) if bad else "pass"
            else:
                broken = _broken(m) if key in PEERS else ""
                verdict = f"set aside: {broken}" if broken else ""
            lines.append(
                "| "
                + " | ".join(
                    [
                        *head,
                        name,
                        f"{m['lockstep']['mean']:.4f} / {m['lockstep']['worst']:.4f}",
                        f"{m['ranksum']['mean']:.4f} / {m['ranksum']['worst']:.4f}",
                        f"{m['micro_mean']:.2f}",
                        str(m["violations"]),
                        f"{1e3 * m['plan_worst']:.1f}",
                        verdict,
                    ]
                )
                + " |"
            )
    lines.append("")
    return "\n".join(lines)
