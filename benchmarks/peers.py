"""The systems chronica is measured against, re-implemented from their descriptions.

Every function plans one epoch and returns an ``Assignment``: which samples each rank trains
on at each step, and ``loads`` of shape ``(steps, W)``, the per-rank cost of every step.
All of them balance the *cost* of a sample (``costs``), the same predicted cost chronica
balances, so that the comparison is about the algorithms and not about the cost model.

Epoch conventions shared by all of them (torch's ``DistributedSampler`` semantics): an epoch
has ``ceil(N / W)`` samples per rank, padded by repeating samples from the start of the
epoch's order; a step gives every rank ``B / W`` samples, except a trailing partial step that
gives every rank ``ceil(N / W) mod (B / W)``.

``torch_distributed``
    The real ``torch.utils.data.DistributedSampler`` (shuffle, seed, ``set_epoch``); each
    rank's stream is cut into local batches of ``B / W``, as a ``DataLoader`` would.
``upstream_static``
    Upstream Chronica 0.2.6 ``static``: per step, fill every rank's ``B / W`` slots one at a
    time with the remaining sample of the *whole epoch pool* whose cost is nearest to what
    the rank still lacks of ``round(mean cost · B / W)``; then shuffle the order of steps.
``flatflow``
    FlatFlow's scheduler for identical machines: the whole epoch pool, sorted by cost, is
    partitioned into ``steps · W`` micro-batches of equal count by the Balanced Largest
    Differencing Method (BLDM, Michiels et al.), the micro-batches are shuffled
    ("inter-batch shuffling", which keeps micro-batches of equal cost adjacent), and
    consecutive runs of ``W`` micro-batches form the steps. One micro-batch per rank per
    step (micro-batch size ``B / W``, no gradient accumulation).
``sorted_lpt``
    Within each global batch: sort descending, each sample to the least-loaded rank that
    still has room (equal counts).
``hf_rebalance``
    The partition shape of Hugging Face transformers' ``BatchRebalanceSampler`` (``trainer_pt_
    utils``, ≥ 5.x): within each global batch, samples sorted by cost are cut into ``W``
    *contiguous* groups whose sizes (sample counts) vary so that group costs are as equal as
    possible. transformers balances a padded cost ``bs·L + α·bs·L²`` with an iterative
    size-adjusting loop; here the groups minimise the largest *summed* cost exactly (binary
    search on the threshold), which is the best this shape can score on our metric. Ranks
    get unequal sample counts, so the gradient needs per-rank weights, unlike every other
    method here.

``sorted_lpt`` and ``hf_rebalance`` take the global batches as input, so the benchmark can
hand them the very batches chronica's exact mode balanced (a paired comparison).

One peer is not a sampler but a batch-size controller, measured against chronica's
``BatchController`` on the same step-time trace (``benchmarks/dynamic.py``):

``omnilearn_batches``
    OmniLearn's (TPDS'25) per-rank batch-size arithmetic, from its description: sizes
    proportional to each rank's measured throughput, a relative dead-band, bounds, rounding
    up, and a correction towards the global batch that neither keeps it exact nor re-checks
    the bounds.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np

from benchmarks.common import Assignment, LengthOnly

__all__ = [
    "flatflow",
    "hf_rebalance",
    "omnilearn_batches",
    "per_rank_counts",
    "sorted_lpt",
    "torch_distributed",
    "upstream_static",
]


def per_rank_counts(n: int, num_replicas: int, batch_size: int) -> list[int]:
    """Samples each rank gets at each step: ``B / W`` per full step, then the remainder."""
    per_rank = -(-n // num_replicas)
    local = batch_size // num_replicas
    counts = [local] * (per_rank // local)
    if per_rank % local:
        counts.append(per_rank % local)
    return counts


def _check(num_replicas: int, batch_size: int) -> None:
    if batch_size % num_replicas:
        raise ValueError(f"batch_size={batch_size} must be a multiple of W={num_replicas}")


def _epoch_pool(n: int, num_replicas: int, rng: np.random.Generator) -> np.ndarray:
    """A random order of the epoch, padded to a multiple of W by repeating its start."""
    order = rng.permutation(n)
    total = -(-n // num_replicas) * num_replicas
    return np.resize(order, total)


def _equal_bounds(counts: Sequence[int], num_replicas: int) -> np.ndarray:
    """Bounds for steps in which every rank has ``counts[s]`` consecutive samples."""
    per_rank = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(per_rank * num_replicas)[:-1]])
    return starts[:, None] + per_rank[:, None] * np.arange(num_replicas + 1)[None, :]


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


# -- (a) torch ---------------------------------------------------------------------------------


def torch_distributed(
    costs: np.ndarray, num_replicas: int, batch_size: int, seed: int, epoch: int
) -> Assignment:
    """torch's ``DistributedSampler`` (shuffle=True, ``seed``, ``set_epoch(epoch)``) on every
    rank, each rank's stream cut into local batches of ``batch_size / num_replicas``."""
    from torch.utils.data import DistributedSampler

    _check(num_replicas, batch_size)
    n = costs.shape[0]
    streams = []
    for rank in range(num_replicas):
        sampler = DistributedSampler(
            LengthOnly(n), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed
        )
        sampler.set_epoch(epoch)
        streams.append(np.fromiter(iter(sampler), dtype=np.int64))
    counts = per_rank_counts(n, num_replicas, batch_size)
    pieces: list[np.ndarray] = []
    offset = 0
    for k in counts:
        pieces.extend(stream[offset : offset + k] for stream in streams)
        offset += k
    return Assignment.build(np.concatenate(pieces), _equal_bounds(counts, num_replicas), costs)


# -- (b) upstream Chronica static ------------------------------------------------------------


def upstream_static(
    costs: np.ndarray, num_replicas: int, batch_size: int, seed: int, epoch: int
) -> Assignment:
    """Upstream Chronica's ``static`` kind (see the module docstring).

    The remaining pool is a cost-sorted list (ties in random order); each pick is a bisection
    for the nearest cost to the rank's gap (ties go to the larger sample, as upstream's
    ``lower_bound``-then-previous lookup does) and a removal. The target of a trailing
    partial step is scaled to its sample count, and that step stays last so every rank
    keeps the same number of steps (upstream instead left the last ranks short).
    """
    _check(num_replicas, batch_size)
    rng = _rng(seed, epoch)
    pool = _epoch_pool(costs.shape[0], num_replicas, rng)
    tiebreak = rng.random(pool.shape[0])
    order = np.lexsort((tiebreak, costs[pool]))
    keys = costs[pool][order].tolist()
    ids = pool[order].tolist()
    mean = float(costs[pool].mean())
    counts = per_rank_counts(costs.shape[0], num_replicas, batch_size)
    steps = []
    for k in counts:
        target = round(mean * k)
        step = []
        for _ in range(num_replicas):
            filled = 0.0
            for _ in range(k):
                gap = target - filled
                pos = bisect.bisect_left(keys, gap)
                if pos == len(keys) or (pos > 0 and gap - keys[pos - 1] < keys[pos] - gap):
                    pos -= 1
                filled += keys.pop(pos)
                step.append(ids.pop(pos))
        steps.append(step)
    full = len(counts) - (1 if counts[-1] != counts[0] else 0)
    shuffled = [steps[i] for i in rng.permutation(full)] + steps[full:]
    indices = np.concatenate([np.asarray(s, dtype=np.int64) for s in shuffled])
    return Assignment.build(indices, _equal_bounds(counts, num_replicas), costs)


# -- (c) FlatFlow ----------------------------------------------------------------------------


def _bldm(costs: np.ndarray, items: np.ndarray, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """Balanced Largest Differencing: ``items`` into ``num_parts`` parts of equal count.

    Start from ``len(items) / num_parts`` partial solutions, each made of ``num_parts``
    consecutive items of the cost-sorted sequence (one item per part). Repeatedly take the
    two partial solutions with the largest spread (max part cost - min part cost) and join
    the lightest part of one with the heaviest of the other, the second lightest with the
    second heaviest, and so on. Returns ``(members, sums)``, parts in ascending cost order.
    """
    width = items.shape[0] // num_parts
    heap: list[tuple[float, int, np.ndarray, np.ndarray]] = []
    for j in range(width):
        chunk = items[j * num_parts : (j + 1) * num_parts]
        sums = costs[chunk].astype(np.float64)
        heapq.heappush(heap, (-(sums[-1] - sums[0]), j, sums, chunk[:, None]))
    counter = width
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        sums = sums_a + sums_b[::-1]
        members = np.hstack([members_a, members_b[::-1]])
        order = np.argsort(sums, kind="stable")
        sums, members = sums[order], members[order]
        heapq.heappush(heap, (-(sums[-1] - sums[0]), counter, sums, members))
        counter += 1
    _, _, sums, members = heap[0]
    return members, sums


def _inter_batch_shuffle(sums: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """FlatFlow's shuffle of micro-batches sorted by cost: runs of equal cost stay together
    (in shuffled order inside the run), and the runs themselves are shuffled."""
    starts = np.flatnonzero(np.concatenate([[True], sums[1:] != sums[:-1]]))
    runs = np.split(np.arange(sums.shape[0]), starts[1:])
    return np.concatenate([rng.permutation(runs[i]) for i in rng.permutation(len(runs))])


def flatflow(
    costs: np.ndarray, num_replicas: int, batch_size: int, seed: int, epoch: int
) -> Assignment:
    """FlatFlow's epoch schedule (see the module docstring).

    As FlatFlow does when the last micro-batch is shorter, the full-size micro-batches are
    partitioned first and the trailing partial step's micro-batches separately, last.
    """
    _check(num_replicas, batch_size)
    rng = _rng(seed, epoch)
    pool = _epoch_pool(costs.shape[0], num_replicas, rng)
    counts = per_rank_counts(costs.shape[0], num_replicas, batch_size)
    full = len(counts) - (1 if counts[-1] != counts[0] else 0)
    cut = full * num_replicas * counts[0]
    pieces = []
    for part, num_parts in ((pool[:cut], full * num_replicas), (pool[cut:], num_replicas)):
        if part.shape[0] == 0:
            continue
        tiebreak = rng.random(part.shape[0])
        ascending = part[np.lexsort((tiebreak, costs[part]))]
        members, sums = _bldm(costs, ascending, num_parts)
        pieces.append(members[_inter_batch_shuffle(sums, rng)].ravel())
    return Assignment.build(np.concatenate(pieces), _equal_bounds(counts, num_replicas), costs)


# -- (d) sorted LPT and (e) HF's rebalancing, within given global batches -------------------


def sorted_lpt(costs: np.ndarray, num_replicas: int, batches: Sequence[np.ndarray]) -> Assignment:
    """Capacity-bounded LPT within each global batch of ``batches`` (index arrays, each a
    multiple of ``num_replicas`` long): descending cost, each sample to the least-loaded rank
    with room left (ties to the lower rank), ``len(batch) / W`` samples per rank."""
    pieces: list[np.ndarray] = []
    bounds: list[np.ndarray] = []
    start = 0
    for batch in batches:
        k = batch.shape[0] // num_replicas
        order = batch[np.argsort(-costs[batch], kind="stable")]
        heap = [(0.0, r) for r in range(num_replicas)]
        members: list[list[int]] = [[] for _ in range(num_replicas)]
        for i in order.tolist():
            load, r = heapq.heappop(heap)
            members[r].append(i)
            if len(members[r]) < k:
                heapq.heappush(heap, (load + float(costs[i]), r))
        pieces.extend(np.asarray(m, dtype=np.int64) for m in members)
        bounds.append(start + k * np.arange(num_replicas + 1))
        start += batch.shape[0]
    return Assignment.build(np.concatenate(pieces), np.asarray(bounds), costs)


def _contiguous_cuts(values: np.ndarray, parts: int) -> np.ndarray:
    """Cut ``values`` into ``parts`` non-empty contiguous groups minimising the largest group
    sum; returns the ``parts + 1`` cut positions."""
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    n = values.shape[0]

    def greedy(limit: float) -> list[int]:
        cuts = [0]
        while cuts[-1] < n:
            end = int(np.searchsorted(prefix, prefix[cuts[-1]] + limit, side="right")) - 1
            cuts.append(max(end, cuts[-1] + 1))
        return cuts

    lo, hi = float(values.max()), float(prefix[-1])
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if len(greedy(mid)) - 1 <= parts:
            hi = mid
        else:
            lo = mid
    cuts = greedy(hi)
    while len(cuts) - 1 < parts:  # split the widest group: the largest sum cannot grow
        widths = np.diff(cuts)
        g = int(np.argmax(widths))
        cuts.insert(g + 1, cuts[g + 1] - 1)
    return np.asarray(cuts, dtype=np.int64)


def hf_rebalance(costs: np.ndarray, num_replicas: int, batches: Sequence[np.ndarray]) -> Assignment:
    """The ``BatchRebalanceSampler`` partition shape within each global batch of ``batches``:
    sort by cost descending and cut into ``num_replicas`` contiguous groups of varying
    size whose largest summed cost is minimal (needs ``len(batch) >= num_replicas``)."""
    pieces, bounds, start = [], [], 0
    for batch in batches:
        order = batch[np.argsort(-costs[batch], kind="stable")]
        cuts = _contiguous_cuts(costs[order], num_replicas)
        pieces.append(order)
        bounds.append(start + cuts)
        start += batch.shape[0]
    return Assignment.build(np.concatenate(pieces), np.asarray(bounds), costs)


# -- (f) OmniLearn's batch-size arithmetic -----------------------------------------------------


def omnilearn_batches(
    counts: np.ndarray,
    seconds: np.ndarray,
    global_batch: int,
    low: int,
    high: int,
    deadband: float = 0.2,
) -> np.ndarray:
    """OmniLearn's new per-rank batch sizes after one evaluation period, re-implemented from
    its description (``../shared/REFERENCES.md``), not from its code.

    ``counts`` are the sizes used during the period and ``seconds`` each rank's mean measured
    compute time per step over it. Each rank's throughput ``counts / seconds`` gives a
    proposal ``global_batch · x_r / Σx``. A rank whose proposal is within ``deadband``
    (relative to its current size) keeps its size; the others take the proposal rounded up
    and clipped to ``[low, high]``. The difference between ``global_batch`` and the new total
    is then spread over the ranks that changed, in proportion to their throughput, each share
    rounded up, and the bounds are not checked again. Hence, as described for OmniLearn: the
    total drifts above ``global_batch``, a negative correction can push a rank below ``low``,
    and ranks inside the dead-band stay where they are however long the imbalance lasts.
    """
    counts = np.asarray(counts, dtype=np.int64)
    seconds = np.asarray(seconds, dtype=np.float64)
    throughput = counts / seconds
    proposal = global_batch * throughput / throughput.sum()
    moved = np.abs(proposal - counts) > deadband * counts
    new = counts.copy()
    new[moved] = np.clip(np.ceil(proposal[moved]), low, high).astype(np.int64)
    if moved.any():
        share = throughput[moved] / throughput[moved].sum()
        new[moved] += np.ceil((global_batch - new.sum()) * share).astype(np.int64)
    return new
