"""Streaming benchmark: balanced packing of a sharded stream with a bounded planning window.

The stream's ranks run as threads of one process over an in-memory sharded source
(``SyntheticSource``: records are ``int32`` token arrays, built on read, so the all-to-all
moves realistic bytes), with ``chronica.runtime.streaming.StreamingEngine`` and
``LocalGroup`` collectives. Each case: ``W`` ranks, global batches of ``B`` documents,
lognormal(6, 1.2) lengths cut to the 16,384-token cap, 64 shards of uneven sizes, a
256-sample shuffle buffer per rank, ``Packing(max_tokens=16384)``. Figures per step, mean
over the steps / worst step:

* **rank figure** ``max_r sum_k C[r, k] / mean_r`` (the DDP step with gradient
  accumulation; 1 = no rank waits) and **lockstep figure** ``sum_k max_r C[r, k] / mean_r``
  (FSDP/ZeRO-3: micro-batch *k* of every rank in lockstep; a rank with fewer micro-batches
  counts 0 for the missing ones);
* **unequal counts**: the share of steps where ranks run different numbers of
  micro-batches (DDP hangs or needs dummy forward passes).

Methods: chronica's streamed plan with ``window_steps`` K = 1, 2, 4 (``balance="rank"``)
and K = 2 with ``balance="micro"``; the full-knowledge map-style plan (``chronica.plan_step``
of every step) on the same order the stream read; the map-style plan on a global shuffle of
the same samples; and each rank packing its own stream, as readers do by default (each rank
takes ``B/W`` documents of its own shards per step): greedy sequential packing (a
micro-batch closes when the next document does not fit: llm-foundry's and HF's packing)
and Grain-style first fit (each document into the first open micro-batch it fits).

Also: bytes the all-to-all moves between ranks per step (a source without random access;
with random access the planned rank reads by index and nothing moves), and the CPU time of
planning one window per step (``plan_window``) against the ~14 ms the issue measured to
read a 318-document step from local MDS.

Run alone: ``python -m benchmarks --only streaming [--quick]``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import stream_throughput
from chronica import CostModel, Packing, ScheduleConfig, StreamOptions, plan_step
from chronica.core.packing import step_starts
from chronica.core.streaming import plan_window
from chronica.runtime.streaming import StreamingEngine
from chronica.runtime.streaming_exchange import LocalGroup

__all__ = ["CASES", "format_table", "render_markdown", "run"]

DATA_SEED = 2030
CAP = 16384
SHARDS = 64
BUFFER = 256
K_VALUES = (1, 2, 4)
TARGET = 0.01  # streamed K = 2 within 1% of the map-style plan on the same order
READ_MS_318 = 14.0  # the measured read of a 318-document step from local MDS


@dataclass(frozen=True)
class Case:
    name: str
    world: int
    batch: int
    cost: str


CASES = (
    Case("W=4, 318 docs/step, linear", 4, 318, "linear"),
    Case("W=4, 318 docs/step, quadratic", 4, 318, "quadratic"),
    Case("W=8, 1280 docs/step, linear", 8, 1280, "linear"),
)
COSTS = {"linear": CostModel.linear(), "quadratic": CostModel.quadratic(b=24576.0, c=1.0)}


class SyntheticSource:
    """Shards of token arrays built on read: record ``j`` of shard ``s`` is ``length``
    ``int32`` tokens. No random access: records travel by the all-to-all."""

    random_access = False

    def __init__(self, shards: Sequence[np.ndarray]) -> None:
        self.shards = [np.asarray(s, np.int64) for s in shards]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_size(self, shard: int) -> int:
        return int(self.shards[shard].shape[0])

    def read(self, shard: int, start: int = 0) -> Iterator[Any]:
        for n in self.shards[shard][start:].tolist():
            yield np.zeros(n, np.int32)

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[Any]:
        raise NotImplementedError("SyntheticSource has no random access")

    def length(self, record: Any) -> int:
        return int(record.shape[0])


def _source(case: Case, steps: int) -> SyntheticSource:
    rng = np.random.default_rng(DATA_SEED)
    total = case.batch * steps
    weights = rng.uniform(0.5, 1.5, SHARDS)
    sizes = np.floor(weights / weights.sum() * total).astype(int)
    sizes[0] += total - sizes.sum()
    lengths = np.clip(rng.lognormal(6.0, 1.2, total).astype(np.int64), 1, CAP)
    return SyntheticSource(np.split(lengths, np.cumsum(sizes)[:-1]))


def _stream(source: SyntheticSource, case: Case, k: int, balance: str) -> dict:
    """Run the engine's ranks as threads; rank 0 records every window's pool."""
    group = LocalGroup(case.world)
    packing = Packing(max_tokens=CAP, balance=balance)
    engines = [
        StreamingEngine(
            source,
            ScheduleConfig(
                num_replicas=case.world, batch_size=case.batch, seed=DATA_SEED,
                cost=COSTS[case.cost], packing=packing,
            ),
            group.rank(r),
            StreamOptions(window_steps=k, buffer_size=BUFFER),
        )
        for r in range(case.world)
    ]  # fmt: skip
    pools: list[dict] = []

    def consume(r: int) -> None:
        for _ in engines[r].micro_batches():
            if r == 0:
                state = engines[0].state_dict()
                if not pools or pools[-1]["key"] != (state["epoch"], state["window"]):
                    pools.append({**state, "key": (state["epoch"], state["window"])})

    threads = [threading.Thread(target=consume, args=(r,)) for r in range(case.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "pools": pools,
        "steps": engines[0].stats.steps,
        "bytes": sum(e.stats.bytes_sent for e in engines),
        "packing": packing,
    }


def _figures(cells: list[np.ndarray]) -> dict:
    """Rank and lockstep figures over steps of ``(W, micro)`` cost cells."""
    rank, lock, unequal = [], [], 0
    for c in cells:
        sums = c.sum(1)
        mean = sums.mean()
        rank.append(sums.max() / mean)
        lock.append(c.max(0).sum() / mean)
    return {
        "rank_mean": float(np.mean(rank)),
        "rank_worst": float(np.max(rank)),
        "lock_mean": float(np.mean(lock)),
        "lock_worst": float(np.max(lock)),
        "unequal": unequal,
    }


def _windows(result: dict, case: Case) -> tuple[list[Any], list[int], list[list[int]]]:
    """The streamed run's steps (replanned from the recorded pools, as every rank does),
    the stream's order, and every rank's own read order."""
    packing = result["packing"]
    steps: list[Any] = []
    order: list[int] = []
    own: list[list[int]] = [[] for _ in range(case.world)]
    carried = 0
    for pool in result["pools"]:
        ids, lengths = np.array(pool["pool_ids"]), np.array(pool["pool_lengths"])
        holders = np.array(pool["pool_holders"])
        final = all(not lane["segments"] and not lane["buffer_ids"] for lane in pool["lanes"])
        plan = plan_window(ids, lengths, case.world, packing, batch_size=case.batch,
                           final=final, cost=COSTS[case.cost])  # fmt: skip
        steps.extend(plan.steps)
        order.extend(i for s in plan.steps for i in s.ids.tolist())
        for r in range(case.world):
            own[r].extend(ids[carried:][holders[carried:] == r].tolist())
        carried = plan.carry.shape[0]
    return steps, order, own


def _map_style(order: np.ndarray, lengths: np.ndarray, case: Case, packing: Packing) -> list:
    starts = step_starts(lengths[order], case.batch, None)
    cells = []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        if b - a >= case.world:
            docs = order[a:b]
            cells.append(
                plan_step(lengths[docs], case.world, packing, cost=COSTS[case.cost]).micro_costs
            )
    return cells


def _per_rank(own: list[list[int]], lengths: np.ndarray, case: Case, first_fit: bool) -> dict:
    """Every rank packs its own next ``B/W`` documents per step."""
    share = case.batch // case.world
    steps = min(len(o) for o in own) // share
    cost = COSTS[case.cost]
    cells, unequal = [], 0
    for s in range(steps):
        ranks = []
        for r in range(case.world):
            docs = lengths[own[r][s * share : (s + 1) * share]]
            ranks.append(_pack(docs, first_fit, cost))
        counts = {len(x) for x in ranks}
        unequal += len(counts) > 1
        m = max(counts)
        cells.append(np.array([x + [0.0] * (m - len(x)) for x in ranks]))
    out = _figures(cells)
    out["unequal"] = unequal / max(steps, 1)
    return out


def _pack(docs: np.ndarray, first_fit: bool, cost: CostModel) -> list[float]:
    """Micro-batch costs of one rank's documents packed in arrival order under the cap."""
    bins: list[int] = []
    costs: list[float] = []
    for n in docs.tolist():
        c = float(cost(np.array([float(n)]))[0])
        slot = next((i for i, used in enumerate(bins) if used + n <= CAP), None) if first_fit else (
            len(bins) - 1 if bins and bins[-1] + n <= CAP else None
        )  # fmt: skip
        if slot is None:
            bins.append(0)
            costs.append(0.0)
            slot = len(bins) - 1
        bins[slot] += n
        costs[slot] += c
    return costs


def _plan_ms(steps_pools: list[dict], case: Case, packing: Packing) -> list[float]:
    out = []
    for pool in steps_pools:
        start = time.process_time()
        plan = plan_window(pool["pool_ids"], pool["pool_lengths"], case.world, packing,
                           batch_size=case.batch, cost=COSTS[case.cost])  # fmt: skip
        if plan.steps:
            out.append(1e3 * (time.process_time() - start) / len(plan.steps))
    return out


def _run_case(case: Case, steps: int) -> dict:
    source = _source(case, steps)
    lengths = np.concatenate(source.shards)
    rows: dict[str, dict] = {}
    extra: dict[str, Any] = {}
    for k in K_VALUES:
        streamed = _stream(source, case, k, "rank")
        plan_steps, order, own = _windows(streamed, case)
        rows[f"stream_k{k}"] = _figures([s.micro_costs for s in plan_steps])
        if k == 2:
            packing = streamed["packing"]
            rows["map_same_order"] = _figures(_map_style(np.array(order), lengths, case, packing))
            shuffled = np.random.default_rng(DATA_SEED + 1).permutation(lengths.shape[0])
            rows["map_shuffled"] = _figures(_map_style(shuffled, lengths, case, packing))
            rows["rank_greedy"] = _per_rank(own, lengths, case, first_fit=False)
            rows["rank_first_fit"] = _per_rank(own, lengths, case, first_fit=True)
            tokens = float(lengths.sum()) / max(len(plan_steps), 1)
            extra["bytes_per_step"] = streamed["bytes"] / max(streamed["steps"], 1)
            extra["token_bytes_per_step"] = 4 * tokens
            extra["plan_ms"] = float(np.median(_plan_ms(streamed["pools"], case, packing)))
            assert sorted(order) == list(range(lengths.shape[0])), "a sample was lost or repeated"
    micro = _stream(source, case, 2, "micro")
    rows["stream_k2_micro"] = _figures([s.micro_costs for s in _windows(micro, case)[0]])
    gap = rows["stream_k2"]["rank_mean"] / rows["map_same_order"]["rank_mean"] - 1
    return {
        "case": case.name, "world": case.world, "batch": case.batch, "cost": case.cost,
        "steps": steps, "methods": rows, "gap_k2": gap, "ok": gap <= TARGET, **extra,
    }  # fmt: skip


METHOD_NAMES = {
    "stream_k1": 'chronica streamed, K = 1, balance="rank"',
    "stream_k2": 'chronica streamed, K = 2, balance="rank"',
    "stream_k4": 'chronica streamed, K = 4, balance="rank"',
    "stream_k2_micro": 'chronica streamed, K = 2, balance="micro"',
    "map_same_order": "map-style plan_step, same order (full knowledge)",
    "map_shuffled": "map-style plan_step, global shuffle",
    "rank_greedy": "per-rank greedy packing (llm-foundry / HF default)",
    "rank_first_fit": "per-rank first fit (Grain FirstFit)",
}


def _throughput(quick: bool) -> dict:
    """Every reader alone and through the engine (``benchmarks.stream_throughput``)."""
    return stream_throughput.measure(*((3180, 3) if quick else (12720, 7)))


def run(quick: bool) -> dict:
    """Every case; ``quick`` takes fewer steps."""
    start = time.perf_counter()
    steps = 12 if quick else 48
    cases = [_run_case(case, steps) for case in CASES]
    return {
        "cases": cases,
        "throughput": _throughput(quick),
        "seconds": time.perf_counter() - start,
        "data_seed": DATA_SEED,
    }


def format_table(result: dict) -> str:
    """The figures as a console table."""
    lines = []
    for c in result["cases"]:
        lines.append(
            f"{c['case']} ({c['steps']} steps): K=2 vs map-style same order "
            f"{100 * c['gap_k2']:+.3f}% "
            f"({'ok' if c['ok'] else 'FAIL'}), moved {c['bytes_per_step'] / 1e6:.2f} MB/step, "
            f"plan {c['plan_ms']:.1f} ms/step"
        )
        for key, name in METHOD_NAMES.items():
            m = c["methods"][key]
            lines.append(
                f"  {name:<55} rank {m['rank_mean']:.4f}/{m['rank_worst']:.4f} "
                f"lockstep {m['lock_mean']:.4f}/{m['lock_worst']:.4f} unequal {m['unequal']:.0%}"
            )
    for r in (result.get("throughput") or {}).get("readers", []):
        lines.append(
            f"{r['reader']:<11} alone {r['alone']:>10,.0f}/s  chronica {r['chronica']:>10,.0f}/s  "
            f"overhead {100 * r['overhead']:5.1f}%  CPU {r['alone_cpu_us']:.1f} -> "
            f"{r['chronica_cpu_us']:.1f} us/sample"
        )
    return "\n".join(lines)


def _span(values: list[float], digits: int = 2) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else (
        f"{low:.{digits}f}–{high:.{digits}f}"
    )  # fmt: skip


def _reading(result: dict) -> list[str]:
    """The paragraph that reads the tables."""
    cases = result["cases"]
    per_rank = [c["methods"][k] for c in cases for k in ("rank_greedy", "rank_first_fit")]
    gaps = [100 * c["gap_k2"] for c in cases]
    return [
        "Reading the figures: a streamed step is the full-knowledge plan of the same samples "
        f"in the same order (K = 2 against it: {_span(gaps, 3)}%); K changes only how the "
        "lanes' samples interleave into the order (each rank's share of a window), hence the "
        "slightly different lockstep figures at K = 1. The streamed plan gives every rank "
        "the same micro-batch count by construction. Each rank packing its own stream has a "
        f"mean rank figure of {_span([m['rank_mean'] for m in per_rank])} (worst step "
        f"{_span([m['rank_worst'] for m in per_rank])}) and different micro-batch counts on "
        f"the ranks in {_span([100 * m['unequal'] for m in per_rank], 0)}% of the steps. "
        "Without random access the all-to-all moves about (W − 1)/W of a step's token "
        "bytes; with it nothing moves (the planned rank reads by index). Planning takes "
        f"{_span([c['plan_ms'] for c in cases], 1)} ms of CPU per step, against the "
        f"~{READ_MS_318:.0f} ms the issue measured to read a 318-document step from local "
        "MDS, and runs in the planning thread while the previous window trains. Not "
        "measured here: reader throughput at several ranks (one rank below).",
    ]


def render_markdown(result: dict, img_dir: Path) -> str:
    """The section of docs/benchmarks.md (no plot)."""
    failures = sum(not c["ok"] for c in result["cases"])
    lines = [
        "",
        "## Streaming: a bounded planning window",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s): "
        "`chronica.runtime.streaming.StreamingEngine` (the engine under "
        "`chronica.torch.StreamingDataset`), its ranks as threads of one process over an "
        "in-memory source of 64 uneven shards (no random access: records travel by the "
        f"all-to-all), lognormal(6, 1.2) lengths cut to the {CAP}-token cap, a "
        f"{BUFFER}-sample shuffle buffer per rank, `Packing(max_tokens={CAP})`, seed "
        f"{result['data_seed']}. Figures per step, mean / worst over the steps: the rank figure "
        "maxᵣ Σₖ C[r,k] / mean (the DDP step) and the lockstep figure Σₖ maxᵣ C[r,k] / mean "
        "(FSDP); *unequal* is the share of steps where ranks run different micro-batch counts. "
        "Per-rank packers take B/W documents of their own shards per step. See "
        "[streaming.md](streaming.md).",
        "",
        "```sh",
        f"{result['command']}",
        "```",
        "",
        f"{failures} failed check(s)." if failures else
        "The target holds in every case: the streamed plan at K = 2 is within 1% of the "
        "map-style plan on the same order.",
        "",
        *_reading(result),
        "",
        "| case | method | rank figure | lockstep figure | unequal counts |",
        "|---|---|---:|---:|---:|",
    ]  # fmt: skip
    for c in result["cases"]:
        for i, (key, name) in enumerate(METHOD_NAMES.items()):
            m = c["methods"][key]
            lines.append(
                f"| {c['case'] if i == 0 else ''} | {name} | {m['rank_mean']:.4f} / "
                f"{m['rank_worst']:.4f} | {m['lock_mean']:.4f} / {m['lock_worst']:.4f} | "
                f"{m['unequal']:.0%} |"
            )
    lines += [
        "",
        "| case | K = 2 against map-style, same order | bytes moved per step (all ranks) | "
        "tokens' bytes per step | planning per step (CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in result["cases"]:
        lines.append(
            f"| {c['case']} | {100 * c['gap_k2']:+.3f}% | {c['bytes_per_step'] / 1e6:.2f} MB | "
            f"{c['token_bytes_per_step'] / 1e6:.2f} MB | {c['plan_ms']:.1f} ms |"
        )
    lines += ["", *_throughput_lines(result.get("throughput")), ""]
    return "\n".join(lines)


def _throughput_lines(t: dict | None) -> list[str]:
    if t is None or "readers" not in t:
        return ["Reader throughput: not in this run's results (rerun the benchmark)."]
    return stream_throughput.markdown_lines(t)
