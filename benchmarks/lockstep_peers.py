"""The planners chronica's ``plan_step(..., Packing(balance="micro"))`` is measured against
on lockstep micro-batches, re-implemented from their published algorithms for one global
batch.

Every function takes the step's documents (token ``lengths``, and predicted ``costs``
where the peer balances a cost), the world size ``W`` and the token cap ``max_tokens`` of a
micro-batch, and returns ``packing_peers.MicroBatches``: every document's rank and
micro-batch (in execution order) and the common number of micro-batches every rank runs.

``verl``
    verl's dynamic batch size with its micro-batch balancing (``verl/utils/
    seqlen_balancing.py``, ``use_dynamic_bsz_balance=True``): the global batch is split
    across ranks into equal counts by Karmarkar–Karp on the documents' workloads
    (``get_seqlen_balanced_partitions(..., equal_size=True)``); each rank takes
    ``min(documents, ceil(tokens / max_token_len))`` micro-batches, synchronised to the
    largest count over the ranks (an all-reduce MAX), and splits its documents into them by
    Karmarkar–Karp again (``equal_size=False``, on the workloads, not the tokens, so that a
    micro-batch may hold more than ``max_token_len``: the benchmark counts those). The
    micro-batches are then ordered by workload, heaviest first (ties: the lower first
    document), and interleaved so that the light ones sit at both ends
    (``order[::2][::-1] + order[1::2]``). The workload is the cost chronica balances.
``nemo_rl``
    NeMo-RL's sequence packing (``BatchedDataDict.shard_by_batch_size`` with
    ``FirstFitDecreasingPacker``, ``min_bin_count = bin_count_multiple = W``): the global
    batch's documents, by length, longest first (ties: the higher position first), each
    into the first bin of ``max_tokens`` it fits in; the bin count is raised to at least
    ``W`` and to a multiple of ``W`` by moving the last document of the bins with the most
    documents into new bins (one at a time, keeping at least one per bin); bin ``b`` goes
    to rank ``b mod W`` as its micro-batch ``b div W``. Balances tokens only through the bin
    count; the cap holds.
``lpt``
    A lockstep LPT reference: the fewest micro-batches per rank the tokens need (one more
    while a document fits nowhere); documents by descending cost (ties: the lower
    position), each to the (rank, micro-batch) cell with room for it whose placement raises
    ``sum_k max_r C[r, k]`` least; ties by the lower resulting rank sum, then the lower
    micro-batch, then the lower rank. Every rank runs the same number of micro-batches and
    the cap holds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from benchmarks import packing_peers
from benchmarks.packing_peers import MicroBatches, karmarkar_karp

__all__ = ["lpt", "nemo_rl", "verl"]


# -- verl: equal-count Karmarkar–Karp over ranks, then rearrange_micro_batches ----------------


def _interleaved(parts: list[list[int]], workload: np.ndarray) -> list[list[int]]:
    """verl's ``use_dynamic_bsz_balance`` order: by workload, heaviest first (ties: the
    higher first document, as a reversed sort of ``(workload, first)`` gives), then the
    even positions reversed followed by the odd ones (light micro-batches at both ends)."""
    keyed = sorted(
        parts,
        key=lambda part: (float(workload[part].sum()), part[0] if part else 0),
        reverse=True,
    )
    return keyed[::2][::-1] + keyed[1::2]


def verl(lengths: np.ndarray, costs: np.ndarray, num_replicas: int, max_tokens: int):
    """verl's balance across ranks plus ``rearrange_micro_batches`` (module docstring).
    ``len(lengths)`` must be a multiple of ``num_replicas`` (verl's equal split)."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    shares = [sorted(share) for share in karmarkar_karp(costs.tolist(), num_replicas, True)]
    counts = [min(len(s), -(-int(lengths[s].sum()) // max_tokens)) for s in shares]
    m = max(1, *counts)  # the all-reduce MAX over ranks
    rank = np.full(lengths.shape[0], -1, np.int64)
    micro = np.full(lengths.shape[0], -1, np.int64)
    for r, share in enumerate(shares):
        local = karmarkar_karp(costs[share].tolist(), m, equal_size=False)
        parts = [sorted(share[i] for i in part) for part in local]
        for k, part in enumerate(_interleaved(parts, costs)):
            rank[part], micro[part] = r, k
    assert (rank >= 0).all(), "a document is not placed"
    return MicroBatches(rank, micro, m, lengths.astype(np.float64))


# -- NeMo-RL: first-fit decreasing over the global batch, bins dealt round-robin -------------


def _adjust_bin_count(bins: list[list[int]], num_replicas: int) -> list[list[int]]:
    """NeMo-RL's ``_adjust_bin_count`` with ``min_bin_count = bin_count_multiple = W``."""
    target = max(len(bins), num_replicas)
    target += -target % num_replicas
    order = sorted(((len(b), i) for i, b in enumerate(bins)), reverse=True)
    bins = [list(b) for b in bins]
    source = 0
    for _ in range(target - len(bins)):
        while len(bins[order[source][1]]) < 2:
            source += 1  # raises IndexError when too few documents: as NeMo-RL raises
        bins.append([bins[order[source][1]].pop()])
    return bins


def nemo_rl(lengths: np.ndarray, num_replicas: int, max_tokens: int) -> MicroBatches:
    """NeMo-RL's first-fit decreasing sequence packing, bins dealt round-robin (module
    docstring). Needs at least ``num_replicas`` documents."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    order = np.lexsort((-np.arange(n), -lengths))  # (length, position), descending
    where, count = packing_peers._first_fit(lengths, order, max_tokens)
    bins: list[list[int]] = [[] for _ in range(count)]
    for i in order.tolist():  # within a bin, documents in the order they were packed
        bins[int(where[i])].append(i)
    bins = _adjust_bin_count(bins, num_replicas)
    rank = np.empty(n, np.int64)
    micro = np.empty(n, np.int64)
    for b, docs in enumerate(bins):
        rank[docs], micro[docs] = b % num_replicas, b // num_replicas
    return MicroBatches(rank, micro, len(bins) // num_replicas, lengths.astype(np.float64))


# -- the lockstep LPT reference -----------------------------------------------------------------


@njit(cache=True)
def _lpt_attempt(
    lengths: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    w: int,
    m: int,
    max_tokens: int,
    rank: np.ndarray,
    micro: np.ndarray,
) -> bool:
    """One attempt at ``m`` micro-batches per rank; ``False`` if a document fits nowhere."""
    free = np.full((w, m), max_tokens, np.int64)
    cell = np.zeros((w, m))
    top = np.zeros(m)
    sums = np.zeros(w)
    for t in range(order.shape[0]):
        i = order[t]
        best_r, best_k = -1, -1
        best_rise, best_sum = np.inf, np.inf
        for k in range(m):
            for r in range(w):
                if free[r, k] < lengths[i]:
                    continue
                rise = max(0.0, cell[r, k] + costs[i] - top[k])
                after = sums[r] + costs[i]
                if rise < best_rise or (rise == best_rise and after < best_sum):
                    best_r, best_k, best_rise, best_sum = r, k, rise, after
        if best_r < 0:
            return False
        rank[i], micro[i] = best_r, best_k
        free[best_r, best_k] -= lengths[i]
        cell[best_r, best_k] += costs[i]
        sums[best_r] += costs[i]
        top[best_k] = max(top[best_k], cell[best_r, best_k])
    return True


def lpt(lengths: np.ndarray, costs: np.ndarray, num_replicas: int, max_tokens: int) -> MicroBatches:
    """The lockstep LPT reference (module docstring)."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    n = lengths.shape[0]
    order = np.lexsort((np.arange(n), -costs))
    rank = np.empty(n, np.int64)
    micro = np.empty(n, np.int64)
    m = max(1, -(-int(lengths.sum()) // (num_replicas * max_tokens)))
    while not _lpt_attempt(lengths, costs, order, num_replicas, m, max_tokens, rank, micro):
        m += 1
    return MicroBatches(rank, micro, m, lengths.astype(np.float64))
