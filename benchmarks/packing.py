"""Packing benchmark: token-capped micro-batches per rank, chronica's ``pack_step`` and its peers.

A *step* is a global batch of ``64·W`` documents drawn from a data set (lognormal lengths, or
the real length files sampled with replacement). Every method turns the step into the same
number of micro-batches on every rank, each meant to hold at most ``max_tokens`` tokens, and
is scored on the same predicted costs (``chronica.core.CostModel``: ``linear`` = tokens,
``attention`` = ``L² + 8·1024·L``):

* **max/mean**: the slowest rank's cost over the mean rank cost of the step's real
  documents; a rank's cost is the sum of its documents' costs, and for padding to the longest
  a padded document costs the cost of its padded length (so padding's figure includes what
  padding adds; *inflation* is its mean rank cost over the real mean, 1 for the packers).
  Reported as the mean over the steps and the worst step, next to the bound
  ``max(mean rank cost, largest document cost) / mean`` that no split of the step beats.
* **waste**: ``1 − real tokens / (W · micro-batches · max_tokens)``, what a static
  ``[rows, row_length]`` micro-batch shape holds in padding.
* **micro-batches** per rank, **cap violations** (micro-batches over ``max_tokens`` tokens,
  and for chronica also rows over ``row_length``), and **planning time** (median over the
  steps of one call, measured in the same run, after a warm-up that loads the numba kernels).

Layouts: ``flat`` is one row per micro-batch (``row_length = max_tokens``, what
flash-attention's variable-length path consumes); ``rows4`` cuts a micro-batch into 4 rows of
``row_length`` (chronica and Grain pack rows; verl, first-fit decreasing and padding know no
rows and are held to ``max_tokens`` only).

Targets checked (and printed, never tuned away): chronica has no cap violation; its mean
max/mean is at most 1.01 wherever the bound's mean is (the largest document allows it); its
mean and worst are no worse than any peer's in every case; and planning 16,384 documents
for 256 ranks takes at most 100 ms (median).

Run alone: ``python -m benchmarks --only packing [--quick]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import packing_peers as peers
from benchmarks.common import machine_info, read_lengths
from chronica.core import CostModel
from chronica.core.packing import Packing, pack_step

__all__ = ["CASES", "METHODS", "check_targets", "format_table", "render_markdown", "run"]

DATA_SEED = 2025
DOCS_PER_RANK = 64
HIDDEN = 1024
GRAIN_OPEN_ROWS = 8
RATIO_TARGET = 1.01
PLAN_TARGET_SECONDS = 0.100
PLAN_TARGET_WORLD = 256
# Relative slack for comparisons between methods: float sums in a different order.
EPS = 1e-9
LOG_FLOOR = 1e-8

METHODS = [
    ("verl", "verl (KK equal counts + KK micro-batches)"),
    ("ffd", "first-fit decreasing (NeMo-RL/TRL/torchtitan)"),
    ("grain", f"Grain first fit, {GRAIN_OPEN_ROWS} open rows"),
    ("padding", "padding to the longest (DistributedSampler)"),
    ("chronica", "chronica pack_step"),
]
PEERS = [key for key, _ in METHODS if key != "chronica"]
STYLE = {
    "verl": ("tab:orange", "s"),
    "ffd": ("tab:purple", "D"),
    "grain": ("tab:green", "^"),
    "padding": ("tab:red", "v"),
    "chronica": ("tab:blue", "o"),
}


@dataclass(frozen=True)
class Data:
    """Where lengths come from and the row every document fits in."""

    key: str
    label: str
    row_length: int
    file: str | None = None


DATA = {
    "lognormal": Data("lognormal", "lognormal(6, 1) lengths, rounded, clipped to [1, 4096]", 4096),
    "lee": Data("lee", "lee_lengths.txt (300 documents, longest 620)", 1024, "lee_lengths.txt"),
    "head500": Data(
        "head500", "head500_lengths.txt (250 documents, longest 6610)", 8192, "head500_lengths.txt"
    ),
}


@dataclass(frozen=True)
class Case:
    """One setting: data, W, cost model and layout (rows per micro-batch)."""

    data: str
    num_replicas: int
    cost: str
    rows: int

    @property
    def row_length(self) -> int:
        return DATA[self.data].row_length

    @property
    def max_tokens(self) -> int:
        return self.rows * self.row_length

    @property
    def layout(self) -> str:
        return "flat" if self.rows == 1 else f"rows{self.rows}"

    @property
    def name(self) -> str:
        return f"{self.data}-{self.layout}-W{self.num_replicas}-{self.cost}"


CASES = [
    Case(data, w, cost, rows)
    for data, layouts in (("lognormal", (1, 4)), ("lee", (1,)), ("head500", (1,)))
    for rows in layouts
    for w in (8, 64, 256)
    for cost in ("linear", "attention")
]


def default_data_dir() -> Path:
    """``../shared/data`` next to the repository root (where the real lengths files live)."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _cost_model(name: str) -> CostModel:
    return CostModel.linear() if name == "linear" else CostModel.attention(HIDDEN)


def _steps(data: Data, pool: np.ndarray | None, w: int, num_steps: int):
    """``num_steps`` steps of ``64·W`` document lengths (int64), in stream order; the same
    steps for both cost models and both layouts of a data set and W."""
    rng = np.random.default_rng([DATA_SEED, w])
    n = DOCS_PER_RANK * w
    for _ in range(num_steps):
        if pool is None:
            raw = np.rint(rng.lognormal(6.0, 1.0, n))
            yield np.clip(raw, 1, data.row_length).astype(np.int64)
        else:
            yield pool[rng.integers(0, pool.shape[0], n)].astype(np.int64)


def _chronica(lengths, costs, w, case: Case):
    packing = Packing(case.max_tokens, case.row_length)
    start = time.perf_counter()
    step = pack_step(lengths, costs, w, packing)
    seconds = time.perf_counter() - start
    # Rows over row_length count as violations too (chronica promises them).
    flat = (step.rank * step.num_micro + step.micro) * packing.rows + step.row
    rows = np.bincount(flat, weights=lengths, minlength=w * step.num_micro * packing.rows)
    loads = np.bincount(step.rank, weights=costs, minlength=w)
    assert np.allclose(loads, step.loads, rtol=1e-9, atol=0.0), "PackedStep.loads is off"
    assert step.row.min() >= 0 and step.row.max() < packing.rows
    out = peers.MicroBatches(step.rank, step.micro, step.num_micro, lengths.astype(np.float64))
    return out, int(np.sum(rows > case.row_length)), seconds


def _plan(key: str, lengths, costs, case: Case):
    """Run one method; returns ``(MicroBatches, extra row violations, seconds)``, the time
    being that of the method's call alone (not of the benchmark's checks)."""
    w = case.num_replicas
    if key == "chronica":
        return _chronica(lengths, costs, w, case)
    start = time.perf_counter()
    if key == "verl":
        out = peers.verl(lengths, costs, w, case.max_tokens)
    elif key == "ffd":
        out = peers.ffd(lengths, w, case.max_tokens)
    elif key == "grain":
        out = peers.grain(lengths, w, case.max_tokens, case.row_length, GRAIN_OPEN_ROWS)
    else:
        out = peers.padding(lengths, w, case.max_tokens)
    return out, 0, time.perf_counter() - start


def _metrics(mb: peers.MicroBatches, extra: int, lengths, costs, model, case: Case) -> dict:
    w = case.num_replicas
    n = lengths.shape[0]
    assert mb.rank.shape == (n,) and mb.micro.shape == (n,)
    assert mb.rank.min() >= 0 and mb.rank.max() < w, "a rank out of range"
    assert mb.micro.min() >= 0 and mb.micro.max() < mb.num_micro, "a micro-batch out of range"
    assert np.all(mb.padded >= lengths), "a document occupies less than its length"
    real = np.bincount(mb.rank, weights=costs, minlength=w)
    charged = np.bincount(mb.rank, weights=model(mb.padded), minlength=w)
    mean = real.mean()
    tokens = mb.tokens(w)
    return {
        "ratio": float(charged.max() / mean),
        "inflation": float(charged.mean() / mean),
        "waste": float(1.0 - lengths.sum() / (w * mb.num_micro * case.max_tokens)),
        "micro": int(mb.num_micro),
        "violations": int(np.sum(tokens > case.max_tokens)) + extra,
        "fullest": float(tokens.max() / case.max_tokens),
        "bound": float(max(mean, costs.max()) / mean),
    }


def _warm_up() -> None:
    """Load (or compile) every numba kernel, so that no timing includes it."""
    lengths = np.array([5, 3, 2, 7, 1, 4, 6, 2], dtype=np.int64)
    costs = lengths.astype(np.float64)
    for key, _ in METHODS:
        _plan(key, lengths, costs, Case("lognormal", 2, "linear", 2))


def _run_case(case: Case, pool: np.ndarray | None, num_steps: int) -> dict:
    model = _cost_model(case.cost)
    per_step: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in METHODS}
    seconds: dict[str, list[float]] = {key: [] for key, _ in METHODS}
    for lengths in _steps(DATA[case.data], pool, case.num_replicas, num_steps):
        costs = model(lengths)
        for key, _ in METHODS:
            mb, extra, spent = _plan(key, lengths, costs, case)
            seconds[key].append(spent)
            per_step[key].append(_metrics(mb, extra, lengths, costs, model, case))
    bound = [m["bound"] for m in per_step["chronica"]]
    methods = {}
    for key, _ in METHODS:
        steps = per_step[key]
        ratio = [s["ratio"] for s in steps]
        methods[key] = {
            "mean": float(np.mean(ratio)),
            "worst": float(np.max(ratio)),
            "inflation": float(np.mean([s["inflation"] for s in steps])),
            "waste": float(np.mean([s["waste"] for s in steps])),
            "micro_mean": float(np.mean([s["micro"] for s in steps])),
            "micro_max": int(max(s["micro"] for s in steps)),
            "violations": int(sum(s["violations"] for s in steps)),
            "micro_batches_checked": int(sum(s["micro"] for s in steps) * case.num_replicas),
            "fullest": float(max(s["fullest"] for s in steps)),
            "plan_seconds": float(np.median(seconds[key])),
            "plan_all": seconds[key],
            "ratio": ratio,
            "micro": [s["micro"] for s in steps],
            "step_violations": [s["violations"] for s in steps],
        }
    entry = {
        "name": case.name,
        "data": case.data,
        "label": DATA[case.data].label,
        "num_replicas": case.num_replicas,
        "docs_per_step": DOCS_PER_RANK * case.num_replicas,
        "cost": case.cost,
        "layout": case.layout,
        "max_tokens": case.max_tokens,
        "row_length": case.row_length,
        "steps": num_steps,
        "bound": {"mean": float(np.mean(bound)), "worst": float(np.max(bound)), "ratio": bound},
        "methods": methods,
    }
    entry["checks"] = _checks(entry)
    return entry


def _fewer_micro(case: dict) -> list[str]:
    """Steps where a peer that kept the cap in that step used fewer micro-batches per rank
    than chronica (information: chronica takes one more when its packing does not fit)."""
    ours = case["methods"]["chronica"]["micro"]
    out = []
    for k, m in enumerate(ours):
        fewer = [
            f"{peer} {case['methods'][peer]['micro'][k]}"
            for peer in PEERS
            if case["methods"][peer]["step_violations"][k] == 0
            and case["methods"][peer]["micro"][k] < m
        ]
        if fewer:
            out.append(f"step {k}: chronica {m}, {', '.join(fewer)}")
    return out


def _checks(case: dict) -> dict:
    """The targets on one case; every entry has ``ok`` and the numbers behind it."""
    ours = case["methods"]["chronica"]
    applies = case["bound"]["mean"] <= RATIO_TARGET
    failing = []
    for peer in PEERS:
        theirs = case["methods"][peer]
        for stat in ("mean", "worst"):
            if ours[stat] > theirs[stat] * (1 + EPS):
                failing.append(
                    f"{peer} {stat} {theirs[stat]:.7f} < {ours[stat]:.7f}"
                    f" (peer over cap {theirs['violations']})"
                )
    checks = {
        "no_cap_violations": {"ok": ours["violations"] == 0, "violations": ours["violations"]},
        "mean_within_1pct": {
            "ok": (ours["mean"] <= RATIO_TARGET) if applies else True,
            "applies": applies,
            "mean": ours["mean"],
            "bound_mean": case["bound"]["mean"],
        },
        "at_least_every_peer": {"ok": not failing, "failing": failing},
    }
    fewer = _fewer_micro(case)
    checks["info_fewest_micro_batches"] = {
        "ok": True,
        "steps_where_a_peer_used_fewer": len(fewer),
        "steps": case["steps"],
        "detail": fewer,
    }
    if case["num_replicas"] == PLAN_TARGET_WORLD:
        checks["planning_100ms"] = {
            "ok": ours["plan_seconds"] <= PLAN_TARGET_SECONDS,
            "seconds": ours["plan_seconds"],
        }
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
            verdict = "INFO" if target.startswith("info_") else "PASS" if check["ok"] else "FAIL"
            lines.append(f"{verdict} {case['name']} {target} {detail}")
    return lines


def _cases(quick: bool) -> list[Case]:
    if not quick:
        return CASES
    # Quick: every data set and layout at W=8 and 64, and the W=256 planning target once.
    keep = [c for c in CASES if c.num_replicas < 256 and c.cost == "attention"]
    keep += [c for c in CASES if c.num_replicas == 256 and c.data == "lognormal" and c.rows == 1]
    return keep


def run(quick: bool, data_dir: Path | None = None) -> dict:
    """Run every case; returns the JSON-ready result (see the module docstring)."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    num_steps = 3 if quick else 16
    started = time.perf_counter()
    _warm_up()
    cases: list[dict[str, Any]] = []
    for case in _cases(quick):
        source = DATA[case.data]
        pool = None
        if source.file is not None:
            path = data_dir / source.file
            if not path.is_file():
                cases.append({"name": case.name, "skipped": f"{path} not found"})
                continue
            pool = read_lengths(path).astype(np.int64)
            assert pool.max() <= source.row_length
        cases.append(_run_case(case, pool, num_steps))
    checked = [c for c in cases if not c.get("skipped")]
    return {
        "name": "packing",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "steps": num_steps,
        "data_seed": DATA_SEED,
        "data_dir": str(data_dir),
        "docs_per_rank": DOCS_PER_RANK,
        "hidden": HIDDEN,
        "grain_open_rows": GRAIN_OPEN_ROWS,
        "methods": dict(METHODS),
        "cases": cases,
        "all_targets_hold": all(ch["ok"] for c in checked for ch in c["checks"].values()),
    }


def format_table(result: dict) -> str:
    """A plain-text table per case, then the target lines."""
    lines = []
    for case in result["cases"]:
        if case.get("skipped"):
            lines.append(f"\n{case['name']}: skipped ({case['skipped']})")
            continue
        b = case["bound"]
        lines.append(
            f"\n{case['name']}  (W={case['num_replicas']}, {case['docs_per_step']} documents, "
            f"max_tokens={case['max_tokens']}, row_length={case['row_length']}, "
            f"{case['cost']} cost; bound mean {b['mean']:.5f} worst {b['worst']:.5f})"
        )
        for key, label in METHODS:
            m = case["methods"][key]
            lines.append(
                f"  {label:46s} mean {m['mean']:.5f}  worst {m['worst']:.5f}  "
                f"waste {m['waste']:.3f}  micro {m['micro_mean']:5.2f}  "
                f"over cap {m['violations']:4d}  plan {1e3 * m['plan_seconds']:8.2f} ms"
                + (f"  inflation {m['inflation']:.3f}" if m["inflation"] > 1 + 1e-12 else "")
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
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(12, 0.32 * len(cases) + 2.2),
        sharey=True,
        width_ratios=(3, 2),
        layout="constrained",
    )
    for j, key in enumerate(keys):
        color, marker = STYLE[key]
        y = np.array([i + (j - (len(keys) - 1) / 2) * 0.14 for i in range(len(cases))])
        mean = np.array([max(c["methods"][key]["mean"] - 1, LOG_FLOOR) for c in cases])
        worst = [max(c["methods"][key]["worst"] - 1, LOG_FLOOR) for c in cases]
        waste = np.array([c["methods"][key]["waste"] for c in cases])
        over = np.array([c["methods"][key]["violations"] > 0 for c in cases])
        left.hlines(y, mean, worst, color=color, lw=1, alpha=0.6)
        for ax, x in ((left, mean), (right, waste)):
            label = result["methods"][key] if ax is left else None
            ax.scatter(x[~over], y[~over], color=color, marker=marker, s=18, label=label)
            if over.any():
                ax.scatter(
                    x[over],
                    y[over],
                    facecolors="none",
                    edgecolors=color,
                    marker=marker,
                    s=18,
                    label=None if ax is right else f"{result['methods'][key]}: over the cap",
                )
    bound = [max(c["bound"]["mean"] - 1, LOG_FLOOR) for c in cases]
    left.scatter(bound, range(len(cases)), color="black", marker="|", s=80, label="bound (mean)")
    left.axvline(RATIO_TARGET - 1, color="gray", ls=":", lw=1)
    left.set_xscale("log")
    left.set_xlim(LOG_FLOOR / 2, 10)
    left.set_xlabel(
        f"max/mean rank cost − 1 (log; marker: mean over steps, line to the worst step; "
        f"{LOG_FLOOR:g} = exactly 1)",
        fontsize=8,
    )
    right.set_xlabel("waste: 1 − tokens / (W · micro-batches · max_tokens)", fontsize=8)
    right.set_xlim(0, 1)
    left.set_yticks(range(len(cases)))
    left.set_yticklabels([c["name"] for c in cases], fontsize=7)
    left.invert_yaxis()
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    right.tick_params(labelleft=False)
    fig.legend(fontsize=7, loc="outside upper center", ncol=4)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _span(cases: list[dict], key: str, stat: str) -> str:
    values = [c["methods"][key][stat] for c in cases]
    return f"{min(values):.5f}–{max(values):.5f}"


def _most_fewer(cases: list[dict]) -> int:
    """The most micro-batches per rank a cap-keeping peer saved over chronica in a step."""
    most = 0
    for case in cases:
        for k, m in enumerate(case["methods"]["chronica"]["micro"]):
            for peer in PEERS:
                theirs = case["methods"][peer]
                if theirs["step_violations"][k] == 0:
                    most = max(most, m - theirs["micro"][k])
    return most


def _reading(cases: list[dict]) -> list[str]:
    """A paragraph of what the tables say, computed from them."""
    ours = [c["methods"]["chronica"] for c in cases]
    verl = [c["methods"]["verl"] for c in cases]
    wins = [c for c, o, v in zip(cases, ours, verl, strict=True) if v["mean"] < o["mean"]]
    clean = [c for c in wins if c["methods"]["verl"]["violations"] == 0]
    gap = max(
        (c["methods"]["chronica"]["mean"] - c["methods"]["verl"]["mean"] for c in wins), default=0
    )
    over = [c for c in cases if c["methods"]["verl"]["violations"]]
    fewer = sum(
        c["checks"]["info_fewest_micro_batches"]["steps_where_a_peer_used_fewer"] for c in cases
    )
    steps = sum(c["steps"] for c in cases)
    extra = max(c["methods"]["chronica"]["waste"] - c["methods"]["ffd"]["waste"] for c in cases)
    worst_case = max(
        cases, key=lambda c: c["methods"]["chronica"]["waste"] - c["methods"]["ffd"]["waste"]
    )
    return [
        "Reading the figures: chronica's mean max/mean is "
        f"{_span(cases, 'chronica', 'mean')} in every case, with no cap violation; first-fit "
        f"decreasing scores {_span(cases, 'ffd', 'mean')}, Grain "
        f"{_span(cases, 'grain', 'mean')} and padding to the longest "
        f"{_span(cases, 'padding', 'mean')}. verl's equal-count Karmarkar–Karp balances "
        f"better than chronica's kernel in {len(wins)} of {len(cases)} cases, by at most "
        f"{gap:.1e} of the mean rank cost; in {len(clean)} of those its micro-batches kept "
        f"the cap in every step (in `rows4` verl is not held to the rows). verl put more "
        f"than max_tokens tokens in a micro-batch in {len(over)} of {len(cases)} cases "
        f"(largest: {max(v['fullest'] for v in verl):.2f} × max_tokens). In {fewer} of "
        f"{steps} steps a peer that kept the cap ran fewer micro-batches per rank than "
        f"chronica (at most {_most_fewer(cases)} fewer; chronica takes one more "
        "micro-batch per rank whenever its packing does not fit; see the last column of the "
        "targets), which costs up to "
        f"{extra:.3f} more waste than first-fit decreasing ({worst_case['name']}).",
        "",
    ]


def _fewer_cell(info: dict) -> str:
    count = info["steps_where_a_peer_used_fewer"]
    if not count:
        return f"0/{info['steps']} steps"
    return f"{count}/{info['steps']} steps, e.g. {info['detail'][0]}"


def _mark(check: dict) -> str:
    return "pass" if check["ok"] else "**FAIL**"


def render_markdown(result: dict, img_dir: Path) -> str:
    """The section of docs/benchmarks.md, with its plot written into ``img_dir``."""
    img_dir = Path(img_dir)
    _plot(result, img_dir / "packing.png")
    cases = [c for c in result["cases"] if not c.get("skipped")]
    lines = [
        "## Packing: token-capped micro-batches",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s): `chronica.core.packing."
        "pack_step` against the packers people use, re-implemented in "
        "`benchmarks/packing_peers.py` from their published algorithms. A step is a global "
        f"batch of {result['docs_per_rank']}·W documents: lognormal(6, 1) lengths (rounded, "
        "clipped to [1, 4096]), or the real length files sampled with replacement "
        f"(seed {result['data_seed']}); {result['steps']} steps per case. Every method gives "
        "every rank the same number of micro-batches, each meant to hold at most `max_tokens` "
        "tokens, and all balance the same predicted cost: `linear` = tokens, `attention` = "
        f"`CostModel.attention({result['hidden']})` = L² + {8 * result['hidden']}·L. "
        "`max_tokens` is the smallest power of two the longest document fits in "
        "(4096, 1024 and 8192 tokens), times the rows of the layout: `flat` is one row per "
        "micro-batch (flash-attention's variable-length layout); `rows4` is 4 rows of that "
        "length per micro-batch, which chronica and Grain respect (no document across a row "
        "boundary) and the other peers, who know no rows, are not held to.",
        "",
        "*mean* / *worst*: the slowest rank's cost over the mean rank cost, mean over the "
        "steps and worst step (1.00000 is perfect); a rank's cost is the sum of its documents' "
        "costs, and a document padded to the longest of its micro-batch costs the cost of the "
        "padded length, divided by the mean of the *real* rank costs, so padding's figures "
        "include what padding adds (*inflation*: its mean rank cost over the real mean). "
        "*bound*: max(mean rank cost, largest document cost)/mean, which no split beats. "
        "*waste*: 1 − real tokens / (W · micro-batches · max_tokens), what a static "
        "[rows, row_length] micro-batch shape holds in padding. *micro*: micro-batches per rank "
        "(mean over steps). *over cap*: micro-batches above max_tokens tokens over all steps "
        "(for chronica, rows above row_length too). *plan*: median over the steps of one "
        "call, after a warm-up that loads the numba kernels; chronica, first-fit decreasing "
        "and Grain's first fit are numba, verl's Karmarkar–Karp and padding are Python.",
        "",
        "Peers: **verl**: equal-count Karmarkar–Karp across ranks "
        "(`get_seqlen_balanced_partitions(equal_size=True)`), then per rank "
        "`rearrange_micro_batches`: ceil(rank tokens / max_tokens) micro-batches, the maximum "
        "over ranks, filled by Karmarkar–Karp on the cost without looking at the cap (so it "
        "can exceed it). **first-fit decreasing** (NeMo-RL, TRL, torchtitan): longest first, "
        "first bin of max_tokens it fits in, bins dealt round-robin, missing micro-batches "
        f"empty. **Grain**: stream order, first fit into {result['grain_open_rows']} open rows "
        "of row_length, all emitted when a document fits in none, rows grouped into "
        "micro-batches and dealt round-robin. **padding**: DistributedSampler's strided split, "
        "each rank's documents in order into micro-batches of as many as fit padded to the "
        "longest (count × longest ≤ max_tokens). **chronica**: `pack_step(lengths, costs, W, "
        "Packing(max_tokens, row_length))`.",
        "",
        f"![packing per case]({img_dir.name}/packing.png)",
        "",
        "### Targets",
        "",
        f"chronica: no micro-batch over the cap; mean max/mean ≤ {RATIO_TARGET} wherever the "
        "bound's mean allows it; mean and worst no worse than any peer's; planning "
        f"{DOCS_PER_RANK * PLAN_TARGET_WORLD:,} documents for {PLAN_TARGET_WORLD} ranks in "
        f"≤ {1e3 * PLAN_TARGET_SECONDS:.0f} ms (median).",
        "",
        "The last column is information, not a target: the steps in which a peer that kept "
        "the cap in that step ran fewer micro-batches per rank than chronica.",
        "",
        "| case | no violation | mean ≤ 1.01 | ≤ every peer | planning ≤ 100 ms "
        "| fewer micro-batches by a peer (info) |",
        "|---|---|---|---|---|---|",
    ]
    failures = 0
    for case in cases:
        ch = case["checks"]
        within = ch["mean_within_1pct"]
        peer = ch["at_least_every_peer"]
        plan = ch.get("planning_100ms")
        cells = [
            _mark(ch["no_cap_violations"]),
            (f"{_mark(within)} ({within['mean']:.5f})" if within["applies"] else "n/a (bound)"),
            _mark(peer) + (f" ({', '.join(peer['failing'])})" if peer["failing"] else ""),
            "–" if plan is None else f"{_mark(plan)} ({1e3 * plan['seconds']:.1f} ms)",
            _fewer_cell(ch["info_fewest_micro_batches"]),
        ]
        failures += sum(not c["ok"] for c in ch.values())
        lines.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{failures} failed check(s)." if failures else "All targets hold.",
        "",
        *_reading(cases),
        "### Figures",
        "",
        "| case | method | mean | worst | bound (mean) | waste | micro | over cap | plan (ms) "
        "| inflation |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        for i, (key, label) in enumerate(METHODS):
            m = case["methods"][key]
            head = (
                f"{case['name']} (max_tokens {case['max_tokens']}, row {case['row_length']})"
                if i == 0
                else ""
            )
            bound = f"{case['bound']['mean']:.5f}" if i == 0 else ""
            name = f"**{label}**" if key == "chronica" else label
            lines.append(
                f"| {head} | {name} | {m['mean']:.5f} | {m['worst']:.5f} | {bound} | "
                f"{m['waste']:.3f} | {m['micro_mean']:.2f} | {m['violations']} | "
                f"{1e3 * m['plan_seconds']:.2f} | {m['inflation']:.3f} |"
            )
    lines.append("")
    return "\n".join(lines)
