"""The packers chronica's ``pack_step`` is measured against, re-implemented from their
published algorithms (not from their code) for one step of documents.

Every function takes the step's documents in stream order (token ``lengths``, and predicted
``costs`` where the peer balances a cost), the world size ``W`` and the token cap
``max_tokens`` of a micro-batch, and returns ``MicroBatches``: for every document its rank
and its micro-batch on that rank, the common number of micro-batches every rank runs (ranks
with fewer get empty ones, as the peers do to keep collectives in step), and, for padding,
the length every document occupies once padded. All the peers that balance a cost balance
the same predicted cost chronica balances, so that the comparison is about the algorithms.

``verl``
    verl's dynamic batch size (``verl/utils/seqlen_balancing.py``): the step is split across
    ranks into equal counts by Karmarkar–Karp's largest differencing method
    (``get_seqlen_balanced_partitions(..., equal_size=True)``), then each rank's share goes
    through ``rearrange_micro_batches``: ``ceil(rank tokens / max_token_len)`` micro-batches
    (at most one per document), synchronised to the maximum over ranks (an all-reduce MAX),
    and the rank's documents are split into that many micro-batches by Karmarkar–Karp again
    (``equal_size=False``), balancing the per-document workload. The second split balances
    cost and ignores the cap, so a micro-batch can hold more than ``max_tokens`` tokens;
    the benchmark counts those violations.
``ffd``
    Packing as NeMo-RL, TRL and torchtitan do it: documents sorted by length, longest first,
    each into the first bin of ``max_tokens`` it fits in (first-fit decreasing), bins dealt
    to ranks round-robin in the order they were opened; ranks with fewer bins get empty
    micro-batches. Balances tokens only through the bin count.
``grain``
    Grain's online first-fit packer (``FirstFitPackIterDataset``): documents in stream order
    (no sort), each into the first of ``open_rows`` open rows of ``row_length`` tokens it fits
    in; when it fits in none, the open rows are emitted and a fresh set is opened. Emitted
    rows are grouped, in order, into micro-batches of ``max_tokens // row_length`` rows,
    which are dealt to ranks round-robin.
``padding``
    Padding to the longest: torch's ``DistributedSampler`` split of the step (rank ``r``
    takes the documents at positions ``r, r + W, ...``), each rank's documents cut, in
    order, into micro-batches holding as many documents as fit when every one is padded to
    the micro-batch's longest (count × longest <= ``max_tokens``); micro-batch counts
    equalised to the maximum over ranks. A padded document occupies, and costs, the
    micro-batch's longest length.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = [
    "MicroBatches",
    "ffd",
    "grain",
    "karmarkar_karp",
    "padding",
    "verl",
]


@dataclass(frozen=True)
class MicroBatches:
    """One step packed for ``W`` ranks: document ``i`` goes to rank ``rank[i]``, micro-batch
    ``micro[i]`` of it; every rank runs ``num_micro`` micro-batches. ``padded[i]`` is the
    number of tokens document ``i`` occupies (its length unless it is padded)."""

    rank: np.ndarray
    micro: np.ndarray
    num_micro: int
    padded: np.ndarray

    def tokens(self, num_replicas: int) -> np.ndarray:
        """Tokens (padding included) of every micro-batch, shape ``(W, num_micro)``."""
        flat = self.rank * self.num_micro + self.micro
        out = np.bincount(flat, weights=self.padded, minlength=num_replicas * self.num_micro)
        return out.reshape(num_replicas, self.num_micro)


def _from_groups(
    groups: Sequence[Sequence[int]], owner: Sequence[int], slot: Sequence[int], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-document (rank, micro) arrays from micro-batches given as document lists, group
    ``g`` going to rank ``owner[g]``, micro-batch ``slot[g]``. Asserts that every document
    is placed exactly once."""
    rank = np.full(n, -1, np.int64)
    micro = np.full(n, -1, np.int64)
    for g, docs in enumerate(groups):
        idx = np.asarray(docs, dtype=np.int64)
        assert np.all(rank[idx] < 0), "a document is placed twice"
        rank[idx] = owner[g]
        micro[idx] = slot[g]
    assert np.all(rank >= 0), "a document is not placed"
    return rank, micro


# -- Karmarkar–Karp (largest differencing), k-way ---------------------------------------------


def karmarkar_karp(values: Sequence[float], k: int, equal_size: bool) -> list[list[int]]:
    """Split items of ``values`` into ``k`` groups by the largest differencing method.

    Each partial solution holds ``k`` groups, kept in descending order of their sums. With
    ``equal_size`` the items, in ascending order, are cut into runs of ``k`` consecutive
    items, one partial solution per run (one item per group), so that every merge keeps the
    counts equal (``len(values)`` must be a multiple of ``k``); otherwise each item starts
    its own partial solution. The two partial solutions of largest spread (largest minus
    smallest sum) are merged, the heaviest group of one with the lightest of the other and
    so on, until one is left. Returns ``k`` lists of item positions (possibly empty ones
    without ``equal_size``).
    """
    n = len(values)
    order = sorted(range(n), key=lambda i: (values[i], i))
    heap: list[tuple[float, int, list[float], list[list[int]]]] = []

    def push(sums: list[float], members: list[list[int]], tag: int) -> None:
        pairs = sorted(zip(sums, members, strict=True), key=lambda p: (-p[0], -len(p[1])))
        sums = [p[0] for p in pairs]
        members = [p[1] for p in pairs]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), tag, sums, members))

    if equal_size:
        if n % k:
            raise ValueError(f"{n} items do not split into {k} equal groups")
        for j in range(0, n, k):
            run = order[j : j + k]
            push([float(values[i]) for i in run], [[i] for i in run], j)
    else:
        for j, i in enumerate(order):
            push([float(values[i])] + [0.0] * (k - 1), [[i]] + [[] for _ in range(k - 1)], j)
    tag = n
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        sums = [sums_a[i] + sums_b[k - 1 - i] for i in range(k)]
        members = [members_a[i] + members_b[k - 1 - i] for i in range(k)]
        push(sums, members, tag)
        tag += 1
    return heap[0][3]


def verl(lengths: np.ndarray, costs: np.ndarray, num_replicas: int, max_tokens: int):
    """verl's balance across ranks plus ``rearrange_micro_batches`` (module docstring)."""
    n = lengths.shape[0]
    w = num_replicas
    shares = karmarkar_karp(costs.tolist(), w, equal_size=True)
    counts = [
        min(len(docs), -(-int(lengths[docs].sum()) // max_tokens)) if docs else 0 for docs in shares
    ]
    m = max(1, max(counts))  # the all-reduce MAX over ranks
    groups, owner, slot = [], [], []
    for r, docs in enumerate(shares):
        parts = karmarkar_karp(costs[docs].tolist(), m, equal_size=False)
        for j, part in enumerate(parts):
            groups.append([docs[i] for i in part])
            owner.append(r)
            slot.append(j)
    rank, micro = _from_groups(groups, owner, slot, n)
    return MicroBatches(rank, micro, m, lengths.astype(np.float64))


# -- first-fit decreasing ---------------------------------------------------------------------


@njit(cache=True)
def _first_fit(lengths: np.ndarray, order: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """First fit of ``lengths`` in ``order`` into bins of ``capacity``: each document's bin
    and the number of bins."""
    n = lengths.shape[0]
    free = np.empty(n, np.int64)
    where = np.empty(n, np.int64)
    bins = 0
    for t in range(n):
        i = order[t]
        b = 0
        while b < bins and free[b] < lengths[i]:
            b += 1
        if b == bins:
            free[b] = capacity
            bins += 1
        free[b] -= lengths[i]
        where[i] = b
    return where, bins


def ffd(lengths: np.ndarray, num_replicas: int, max_tokens: int) -> MicroBatches:
    """First-fit decreasing into bins of ``max_tokens``, bins dealt round-robin."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    where, bins = _first_fit(lengths, order, max_tokens)
    m = max(1, -(-bins // num_replicas))
    return MicroBatches(where % num_replicas, where // num_replicas, m, lengths.astype(float))


# -- Grain's online first fit into a bounded set of open rows ---------------------------------


@njit(cache=True)
def _grain_rows(lengths: np.ndarray, row_length: int, open_rows: int) -> tuple[np.ndarray, int]:
    """Online first fit in stream order into ``open_rows`` open rows, all emitted when a
    document fits in none: each document's row (in emission order) and the row count."""
    n = lengths.shape[0]
    row = np.empty(n, np.int64)
    used = np.zeros(open_rows, np.int64)
    base = 0  # rows emitted before the open set
    for i in range(n):
        k = 0
        while k < open_rows and used[k] + lengths[i] > row_length:
            k += 1
        if k == open_rows:  # emit every open row (all are non-empty here)
            base += open_rows
            used[:] = 0
            k = 0
        used[k] += lengths[i]
        row[i] = base + k
    tail = 0
    for k in range(open_rows):
        if used[k] > 0:
            tail += 1
    # Rows of the last set are emitted without the empty ones; first fit fills them in order.
    return row, base + tail


def grain(
    lengths: np.ndarray, num_replicas: int, max_tokens: int, row_length: int, open_rows: int = 8
) -> MicroBatches:
    """Grain's first-fit packer in stream order, rows grouped into micro-batches of
    ``max_tokens // row_length`` rows and dealt round-robin."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    rows, _ = _grain_rows(lengths, row_length, open_rows)
    group = rows // (max_tokens // row_length)
    total = int(group.max()) + 1 if group.size else 0
    m = max(1, -(-total // num_replicas))
    return MicroBatches(group % num_replicas, group // num_replicas, m, lengths.astype(float))


# -- padding to the longest -------------------------------------------------------------------


def padding(lengths: np.ndarray, num_replicas: int, max_tokens: int) -> MicroBatches:
    """DistributedSampler's strided split, micro-batches padded to their longest document
    (count × longest <= ``max_tokens``), cut in order; counts equalised."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    rank = np.arange(n, dtype=np.int64) % num_replicas
    micro = np.empty(n, np.int64)
    padded = np.empty(n, np.float64)
    m = 1
    for r in range(num_replicas):
        docs = np.arange(r, n, num_replicas)
        batch: list[int] = []
        longest = 0
        j = 0
        for i in docs.tolist():
            top = max(longest, int(lengths[i]))
            if batch and (len(batch) + 1) * top > max_tokens:
                padded[batch] = longest
                micro[batch] = j
                j += 1
                batch, top = [], int(lengths[i])
            batch.append(i)
            longest = top
        if batch:
            padded[batch] = longest
            micro[batch] = j
            j += 1
        m = max(m, j)
    return MicroBatches(rank, micro, m, padded)
