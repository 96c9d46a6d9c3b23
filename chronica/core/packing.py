"""Token budgets and packing: each rank's share of a step as micro-batches under a token cap.

A *document* is a sample whose size is its length in tokens. With ``Packing`` a step's
documents are not dealt out in equal counts: every rank's share is cut into the same number
of micro-batches (gradient accumulation), each holding at most ``max_tokens`` tokens laid out
as ``max_tokens // row_length`` rows of ``row_length`` tokens with several documents per row.
Documents never attend across their boundaries, so a micro-batch costs the sum of its
documents' costs ``a + b·L + c·L²``.

``pack_step`` decides one step: the fewest micro-batches per rank at which every document
fits, plus one more for as long as that lowers the slowest rank's time by 1% (the cap, not
the costs, held it back: typically a fast rank whose fair share of the tokens does not fit),
or exactly ``Packing.micro_batches`` where the documents fit; every document to a
rank, a micro-batch and a row, so that the slowest rank's predicted time (its cost over its
speed) is as small as the kernel finds and a rank's micro-batches carry similar costs:

1. LPT under capacities: documents in descending cost order (ties by position), each to
   the rank whose predicted time after taking it is lowest among those with a row it fits
   in; within the rank, to the cheapest micro-batch with such a row, and there to the
   fullest row it fits in (best fit).
2. Refinement: while the slowest rank is more than 1e-7 above the mean time and can give
   a document to another rank, or trade one for a cheaper one, so that the larger of the
   two new times falls, make the best such move. Trades are looked for among the four
   lightest ranks (one for one; while the slowest rank is more than 1e-5 above the mean,
   also one for two of one row), then, as long, among every rank (one for one, steps of at
   most 16384 documents). Trades keep each document's row slot, so
   the cap holds throughout.

If a document fits nowhere, the same count is tried again with every document in the
fullest row of its rank it fits in (best fit: tighter, micro-batches less even); if that
fails too, the step takes one more micro-batch per rank and starts again.
The result depends on the lengths, costs and speeds only (deterministic on every machine).

Loss normalisation: ``micro_weights`` gives each micro-batch the factor that turns its mean
loss (per token or per document) into its share of the global batch's mean, so that summing
the micro-batches' gradients and averaging over ranks gives the global-mean gradient.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from chronica.core.balance import _argsort_descending
from chronica.core.checks import check_int

__all__ = [
    "LONG_DOCUMENTS",
    "LOSS_NORMALISATIONS",
    "PackedEpoch",
    "PackedStep",
    "Packing",
    "Pieces",
    "micro_weights",
    "pack_epoch",
    "pack_step",
    "pack_steps",
    "pieces",
    "step_starts",
]

LONG_DOCUMENTS = ("error", "split", "truncate")
LOSS_NORMALISATIONS = ("token", "sample")
# Trades that gain less than this fraction of the top time are not worth an iteration.
_REL_TOL = 1e-9
# One more micro-batch per rank than the tokens need is taken while it lowers the slowest
# rank's time by at least this much (relative) and that time is this far above the bound.
_MICRO_GAIN = 0.01
# Refinement stops once the slowest rank is this close to the mean time (relative).
_CLOSE_ENOUGH = 1e-7
# Ranks a trade partner is looked for among first (the lightest ones).
_PARTNERS = 4
# Steps up to this many documents search every rank for a trade when the lightest fail.
_WIDE_SEARCH_MAX = 16384
# Trades of two documents for one, and searches of every rank, only while the slowest rank
# is this far above the mean time (relative): below it their cost buys only rounding.
_WORTH_MORE = 1e-5


@dataclass(frozen=True)
class Packing:
    """How steps are cut into token-capped, packed micro-batches. Validated on construction.

    ``max_tokens``: the hard cap of tokens in one micro-batch (memory). ``row_length``: the
    length of a packed row (default ``max_tokens``: one row, flat packing as flash-attention's
    variable-length path consumes); a micro-batch holds ``max_tokens // row_length`` rows.
    ``tokens_per_step``: a global token budget per step (the step's documents are the next
    ones of the epoch's order up to about that many tokens); ``None`` keeps the configuration's
    ``batch_size`` documents per step. ``micro_batches``: a fixed count per rank and step
    (more are taken only where the documents do not fit); ``None``: the fewest that fit.
    ``long_documents``: what a document longer than a row does: ``"error"`` (default),
    ``"split"`` into row-long pieces trained as separate sequences, or ``"truncate"`` to
    its first ``row_length`` tokens. ``loss``: ``"token"`` (mean over every token of the
    global batch, the language-model default) or ``"sample"`` (mean over documents).
    """

    max_tokens: int
    row_length: int | None = None
    tokens_per_step: int | None = None
    micro_batches: int | None = None
    long_documents: str = "error"
    loss: str = "token"

    def __post_init__(self) -> None:
        hint = " (tokens in one micro-batch: the memory cap)"
        object.__setattr__(
            self, "max_tokens", check_int("max_tokens", self.max_tokens, 1, hint=hint)
        )
        if self.row_length is None:
            object.__setattr__(self, "row_length", self.max_tokens)
        object.__setattr__(
            self,
            "row_length",
            check_int("row_length", self.row_length, 1, self.max_tokens, hint=" (<= max_tokens)"),
        )
        if self.tokens_per_step is not None:
            object.__setattr__(
                self, "tokens_per_step", check_int("tokens_per_step", self.tokens_per_step, 1)
            )
        if self.micro_batches is not None:
            object.__setattr__(
                self, "micro_batches", check_int("micro_batches", self.micro_batches, 1)
            )
        if self.long_documents not in LONG_DOCUMENTS:
            raise ValueError(
                f"long_documents={self.long_documents!r} must be one of {LONG_DOCUMENTS}"
            )
        if self.loss not in LOSS_NORMALISATIONS:
            raise ValueError(f"loss={self.loss!r} must be one of {LOSS_NORMALISATIONS}")

    @property
    def rows(self) -> int:
        """Packed rows in one micro-batch."""
        assert self.row_length is not None
        return self.max_tokens // self.row_length

    @property
    def length(self) -> int:
        """The row length (``row_length`` with its default filled in)."""
        assert self.row_length is not None
        return self.row_length

    def to_tuple(self) -> tuple[object, ...]:
        """Every field, JSON-ready (part of the configuration digest)."""
        return (
            self.max_tokens,
            self.row_length,
            self.tokens_per_step,
            self.micro_batches,
            self.long_documents,
            self.loss,
        )


@dataclass(frozen=True)
class Pieces:
    """The sequences documents are trained as: piece ``p`` is tokens ``start[p] ..
    start[p] + length[p]`` of document ``doc[p]``; document ``d``'s pieces are ``first[d] ..
    first[d + 1] - 1``, in order. Without splitting or truncation every document is one
    piece of its own length."""

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    first: np.ndarray

    def of(self, docs: np.ndarray) -> np.ndarray:
        """The pieces of ``docs`` (document indices), document after document."""
        counts = self.first[docs + 1] - self.first[docs]
        offsets = np.repeat(self.first[docs] - np.cumsum(counts) + counts, counts)
        return offsets + np.arange(int(counts.sum()), dtype=np.int64)


def pieces(sizes: np.ndarray, packing: Packing) -> Pieces:
    """The pieces of documents of lengths ``sizes`` (whole numbers of tokens) under
    ``packing.long_documents``; ``ValueError`` names the first document too long for a row
    (``"error"``) or the first size that is not a whole number."""
    whole = np.floor(sizes)
    if (whole != sizes).any():
        bad = int(np.flatnonzero(whole != sizes)[0])
        raise ValueError(
            f"sizes[{bad}] is {sizes[bad]}; with packing= sizes are document lengths in "
            "tokens (whole numbers)"
        )
    lengths = sizes.astype(np.int64)
    limit = packing.length
    long = lengths > limit
    n = lengths.shape[0]
    if not long.any() or packing.long_documents == "truncate":
        counts = np.ones(n, dtype=np.int64)
        doc = np.arange(n, dtype=np.int64)
        start = np.zeros(n, dtype=np.int64)
        length = np.minimum(lengths, limit)
    elif packing.long_documents == "error":
        culprit = int(np.flatnonzero(long)[0])
        raise ValueError(
            f"document {culprit} has {lengths[culprit]} tokens, more than a row holds "
            f"(row_length={limit}); raise max_tokens/row_length or pass "
            "Packing(long_documents='split') or 'truncate'"
        )
    else:
        counts = np.maximum(1, -(-lengths // limit))
        doc = np.repeat(np.arange(n, dtype=np.int64), counts)
        first_piece = np.cumsum(counts) - counts
        within = np.arange(doc.shape[0], dtype=np.int64) - np.repeat(first_piece, counts)
        start = within * limit
        length = np.minimum(lengths[doc] - start, limit)
    first = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
    out = Pieces(doc, start, length, first)
    for array in (out.doc, out.start, out.length, out.first):
        array.setflags(write=False)
    return out


def step_starts(
    tokens: np.ndarray, batch_size: int | None, tokens_per_step: int | None
) -> np.ndarray:
    """Where each step starts in a stream of documents with ``tokens`` tokens each, plus the
    stream's end: ``batch_size`` documents per step, or (``tokens_per_step`` given) the next
    documents up to that many tokens (at least one document per step). A trailing partial
    step is kept; the caller drops it for ``drop_last``."""
    n = tokens.shape[0]
    if tokens_per_step is None:
        if batch_size is None:
            raise ValueError("packing needs batch_size= (documents per step) or tokens_per_step=")
        return np.append(np.arange(0, n, batch_size, dtype=np.int64), n)
    return np.append(_budget_starts(tokens.astype(np.int64), tokens_per_step), n)


@njit(cache=True)
def _budget_starts(tokens: np.ndarray, budget: int) -> np.ndarray:
    starts = np.empty(tokens.shape[0] + 1, np.int64)
    count = 0
    used = 0
    for i in range(tokens.shape[0]):
        if i == 0 or used + tokens[i] > budget:
            starts[count] = i
            count += 1
            used = 0
        used += tokens[i]
    return starts[:count]


@dataclass(frozen=True)
class PackedStep:
    """One step packed for ``num_replicas`` ranks: document ``i`` (in the step's order) goes
    to rank ``rank[i]``, micro-batch ``micro[i]`` of that rank, row ``row[i]`` of it.
    Every rank runs ``num_micro`` micro-batches; ``loads[r]`` is rank ``r``'s predicted cost
    (its time is ``loads[r] / speeds[r]``); no micro-batch holds more than ``max_tokens``
    tokens and no row more than ``row_length``."""

    rank: np.ndarray
    micro: np.ndarray
    row: np.ndarray
    num_micro: int
    loads: np.ndarray

    def order(self) -> np.ndarray:
        """Positions of the step's documents rank after rank, micro-batch after micro-batch,
        row after row (step order within a row)."""
        return np.lexsort((self.row, self.micro, self.rank))


def pack_step(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_replicas: int,
    packing: Packing,
    speeds: np.ndarray | None = None,
    num_micro: int | None = None,
) -> PackedStep:
    """Pack one step's documents (token ``lengths`` at most ``packing.row_length`` each,
    predicted ``costs``, finite and non-negative) for ``num_replicas`` ranks of relative
    ``speeds`` (positive; default equal); ``num_micro`` micro-batches per rank at least
    (default ``packing.micro_batches``, else the fewest the tokens need). See the module
    docstring."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    w = check_int("num_replicas", num_replicas, 1)
    speed = np.ones(w) if speeds is None else np.ascontiguousarray(speeds, dtype=np.float64)
    if costs.shape != lengths.shape or not (np.isfinite(costs).all() and (costs >= 0).all()):
        raise ValueError(
            f"costs must be finite and >= 0, one per document ({lengths.shape[0]}); use a "
            "CostModel of the lengths"
        )
    if speed.shape != (w,) or not (np.isfinite(speed).all() and (speed > 0).all()):
        raise ValueError(f"speeds must be {w} finite numbers > 0 (one per rank), got {speeds!r}")
    if lengths.shape[0] and int(lengths.max()) > packing.length:
        raise ValueError(
            f"a document of {int(lengths.max())} tokens is longer than row_length="
            f"{packing.length}; cut documents with chronica.core.packing.pieces first"
        )
    fewest = max(1, math.ceil(int(lengths.sum()) / (w * packing.rows * packing.length)))
    m = max(fewest, num_micro or packing.micro_batches or 1)
    order = _argsort_descending(costs)
    rank = np.empty(lengths.shape[0], np.int64)
    micro = np.empty_like(rank)
    row = np.empty_like(rank)
    loads = np.zeros(w)
    rows, length = packing.rows, packing.length

    def attempt(count: int) -> bool:
        # Even micro-batches first, then packed as tightly as it goes.
        return _pack(
            lengths, costs, order, speed, count, rows, length, False, rank, micro, row, loads
        ) or _pack(lengths, costs, order, speed, count, rows, length, True, rank, micro, row, loads)

    # One micro-batch per document always fits, so the loop ends.
    while not attempt(m):
        m += 1
    best = PackedStep(rank.copy(), micro.copy(), row.copy(), m, loads.copy())
    if num_micro or packing.micro_batches or not lengths.shape[0]:
        return best
    # Free counts: while the token cap, not the costs, keeps the slowest rank more than 1%
    # above what any split allows, one more micro-batch per rank is worth its overhead.
    bound = max(costs.sum() / speed.sum(), costs.max() / speed.max())
    top = float((loads / speed).max())
    while top > bound * (1 + _MICRO_GAIN) and m < lengths.shape[0]:
        m += 1
        if not attempt(m) or float((loads / speed).max()) > top * (1 - _MICRO_GAIN):
            break
        best = PackedStep(rank.copy(), micro.copy(), row.copy(), m, loads.copy())
        top = float((loads / speed).max())
    return best


@njit(cache=True)
def _fit_row(free: np.ndarray, length: int) -> int:
    """The fullest row of ``free`` (free tokens per row) that ``length`` fits in, or -1."""
    best = -1
    for k in range(free.shape[0]):
        if free[k] >= length and (best < 0 or free[k] < free[best]):
            best = k
    return best


@njit(cache=True)
def _fit_micro(
    free: np.ndarray, micro_loads: np.ndarray, length: int, tight: bool
) -> tuple[int, int]:
    """Where in one rank (``free``: rows per micro-batch) ``length`` goes: the cheapest
    micro-batch with a row it fits in, and there the fullest such row; with ``tight``, the
    fullest row of any micro-batch (best fit). ``(-1, -1)`` if it fits nowhere."""
    best_m, best_k = -1, -1
    for m in range(free.shape[0]):
        if tight:
            k = _fit_row(free[m], length)
            if k >= 0 and (best_m < 0 or free[m, k] < free[best_m, best_k]):
                best_m, best_k = m, k
            continue
        if best_m >= 0 and micro_loads[m] >= micro_loads[best_m]:
            continue
        k = _fit_row(free[m], length)
        if k >= 0:
            best_m, best_k = m, k
    return best_m, best_k


@njit(cache=True)
def _room(free: np.ndarray) -> int:
    """The largest free space of any row of one rank."""
    top = 0
    for m in range(free.shape[0]):
        for k in range(free.shape[1]):
            top = max(top, free[m, k])
    return top


@njit(cache=True)
def _pack(
    lengths: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    num_micro: int,
    rows: int,
    row_length: int,
    tight: bool,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
) -> bool:
    """LPT under row capacities, then refinement; ``False`` if a document fits nowhere."""
    w = speeds.shape[0]
    n = lengths.shape[0]
    free = np.full((w, num_micro, rows), row_length, np.int64)
    micro_loads = np.zeros((w, num_micro))
    room = np.full(w, row_length, np.int64)
    loads[:] = 0.0
    for t in range(n):
        i = order[t]
        best = -1
        best_time = np.inf
        for r in range(w):
            if room[r] >= lengths[i]:
                time = (loads[r] + costs[i]) / speeds[r]
                if time < best_time:
                    best, best_time = r, time
        if best < 0:
            return False
        m, k = _fit_micro(free[best], micro_loads[best], lengths[i], tight)
        rank[i], micro[i], row[i] = best, m, k
        free[best, m, k] -= lengths[i]
        micro_loads[best, m] += costs[i]
        loads[best] += costs[i]
        room[best] = _room(free[best])
    _refine(lengths, costs, speeds, tight, free, micro_loads, room, rank, micro, row, loads)
    return True


@njit(cache=True)
def _refine(
    lengths: np.ndarray,
    costs: np.ndarray,
    speeds: np.ndarray,
    tight: bool,
    free: np.ndarray,
    micro_loads: np.ndarray,
    room: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
) -> None:
    w = speeds.shape[0]
    n = lengths.shape[0]
    if w < 2 or n == 0:
        return
    mean = loads.sum() / speeds.sum()
    bound = mean * (1.0 + _CLOSE_ENOUGH)
    for _ in range(4 * n + 16):
        times = loads / speeds
        a = int(np.argmax(times))
        top = times[a]
        if top <= bound:
            return
        # The best move of one document of ``a`` to another rank with room for it.
        gain, move_i, move_b = top * _REL_TOL, -1, -1
        for i in range(n):
            if rank[i] != a:
                continue
            after_a = (loads[a] - costs[i]) / speeds[a]
            for b in range(w):
                if b == a or room[b] < lengths[i]:
                    continue
                new_top = max(after_a, (loads[b] + costs[i]) / speeds[b])
                if top - new_top > gain:
                    gain, move_i, move_b = top - new_top, i, b
        if move_i >= 0:
            i, b = move_i, move_b
            free[a, micro[i], row[i]] += lengths[i]
            micro_loads[a, micro[i]] -= costs[i]
            m, k = _fit_micro(free[b], micro_loads[b], lengths[i], tight)
            rank[i], micro[i], row[i] = b, m, k
            free[b, m, k] -= lengths[i]
            micro_loads[b, m] += costs[i]
            loads[a] -= costs[i]
            loads[b] += costs[i]
            room[a] = _room(free[a])
            room[b] = _room(free[b])
            continue
        # No move helps: trade a document of ``a`` for one cheaper document, or two of one
        # row, of another rank, each side taking the other's row slot. The lightest ranks
        # are searched first, then (for steps small enough) every rank.
        partner = np.zeros(w, np.bool_)
        partner[np.argsort(times, kind="mergesort")[:_PARTNERS]] = True
        partner[a] = False
        trade = _best_trade(
            lengths, costs, speeds, free, rank, micro, row, loads, a, partner, False, gain
        )
        worth = top > mean * (1.0 + _WORTH_MORE)
        if trade[0] < 0 and worth:
            trade = _best_trade(
                lengths, costs, speeds, free, rank, micro, row, loads, a, partner, True, gain
            )
        if trade[0] < 0 and worth and w > _PARTNERS + 1 and n <= _WIDE_SEARCH_MAX:
            partner[:] = True
            partner[a] = False
            trade = _best_trade(
                lengths, costs, speeds, free, rank, micro, row, loads, a, partner, False, gain
            )
        i, j, k = trade
        if i < 0:
            return
        b = rank[j]
        taken = lengths[j] + (lengths[k] if k >= 0 else 0)
        given = costs[j] + (costs[k] if k >= 0 else 0.0)
        d = costs[i] - given
        free[a, micro[i], row[i]] += lengths[i] - taken
        free[b, micro[j], row[j]] += taken - lengths[i]
        micro_loads[a, micro[i]] -= d
        micro_loads[b, micro[j]] += d
        slot_micro, slot_row = micro[i], row[i]
        rank[i], micro[i], row[i] = b, micro[j], row[j]
        rank[j], micro[j], row[j] = a, slot_micro, slot_row
        if k >= 0:
            rank[k], micro[k], row[k] = a, slot_micro, slot_row
        loads[a] -= d
        loads[b] += d
        room[a] = _room(free[a])
        room[b] = _room(free[b])


@njit(cache=True)
def _best_trade(
    lengths: np.ndarray,
    costs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
    a: int,
    partner: np.ndarray,
    pairs: bool,
    gain: float,
) -> tuple[int, int, int]:
    """The trade of a document ``i`` of rank ``a`` for document ``j`` (and, with
    ``pairs``, maybe ``k`` of the same row; else -1) of a ``partner`` rank that lowers the
    larger of the two ranks' times most, by more than ``gain``: ``(i, j, k)``, ``i = -1``
    if none. ``i`` takes the row slot of ``j`` (and ``k``); they take the slot of ``i``."""
    n = lengths.shape[0]
    top = loads[a] / speeds[a]
    mine = np.empty(n, np.int64)
    theirs = np.empty(n, np.int64)
    keys = np.empty(n, np.int64)
    num_mine = num_theirs = 0
    m, r = free.shape[1], free.shape[2]
    for i in range(n):
        if rank[i] == a:
            mine[num_mine] = i
            num_mine += 1
        elif partner[rank[i]]:
            theirs[num_theirs] = i
            keys[num_theirs] = (rank[i] * m + micro[i]) * r + row[i]
            num_theirs += 1
    grouped = theirs[:num_theirs]
    if pairs:
        # Their documents row by row, so that the pairs of one row are neighbours.
        by_row = np.argsort(keys[:num_theirs], kind="mergesort")
        grouped, keys = grouped[by_row], keys[:num_theirs][by_row]
    else:
        keys = np.arange(num_theirs)  # every document a group of its own
    best_i, best_j, best_k = -1, -1, -1
    for i in mine[:num_mine]:
        slot_a = free[a, micro[i], row[i]] + lengths[i]
        start = 0
        while start < num_theirs:
            stop = start + 1
            while stop < num_theirs and keys[stop] == keys[start]:
                stop += 1
            first = grouped[start]
            b = rank[first]
            slot_b = free[b, micro[first], row[first]]
            for x in range(start, stop):
                j = grouped[x]
                # y == x: j alone; with ``pairs``, also j with a later document of its row.
                for y in range(x, stop if pairs else x + 1):
                    k = -1 if y == x else grouped[y]
                    taken = lengths[j] + (lengths[k] if k >= 0 else 0)
                    given = costs[j] + (costs[k] if k >= 0 else 0.0)
                    if given >= costs[i] or taken > slot_a or lengths[i] > slot_b + taken:
                        continue
                    d = costs[i] - given
                    new_top = max((loads[a] - d) / speeds[a], (loads[b] + d) / speeds[b])
                    if top - new_top > gain:
                        gain, best_i, best_j, best_k = top - new_top, i, j, k
            start = stop
    return best_i, best_j, best_k


def micro_weights(tokens: np.ndarray, docs: np.ndarray, num_replicas: int, loss: str) -> np.ndarray:
    """The loss weight of every micro-batch of one step: ``tokens``/``docs`` hold each
    micro-batch's token and document (piece) counts, any shape. Multiplying a micro-batch's
    mean loss (over its tokens for ``loss="token"``, over its documents for ``"sample"``)
    by its weight, summing over a rank's micro-batches and averaging over ``num_replicas``
    ranks gives the mean over the whole step; an empty micro-batch weighs 0."""
    share = np.asarray(tokens if loss == "token" else docs, dtype=np.float64)
    total = share.sum()
    return share * num_replicas / total if total > 0 else np.zeros_like(share)


@dataclass(frozen=True)
class PackedEpoch:
    """The parts of a packed ``EpochPlan``: step-major ``indices`` (rank after rank, then
    micro-batch and row), ``bounds`` ``(steps, W + 1)``, ``loads`` ``(steps, W)``, the
    ``layout`` arrays of ``chronica.core.plan.MicroLayout`` and the documents
    ``num_dropped`` by ``drop_last``."""

    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray
    layout: dict[str, np.ndarray]
    num_dropped: int


def pack_epoch(
    streams: list[np.ndarray],
    owner_ranks: Sequence[np.ndarray],
    num_replicas: int,
    table: Pieces,
    piece_costs: np.ndarray,
    packing: Packing,
    batch_size: int | None,
    drop_last: bool,
    progress: Callable[[int, int], None] | None = None,
) -> PackedEpoch:
    """Cut every owner's document ``streams[o]`` (trained by ranks ``owner_ranks[o]``) into
    the same number of steps and pack each step for its ranks, every rank running the same
    number of micro-batches in a step.

    Steps take ``batch_size·ranks/W`` documents of an owner's stream, or its share
    ``tokens_per_step·ranks/W`` of the token budget; owners whose streams would give
    different step counts (a token budget over node partitions) cut theirs into the largest
    count of steps of near-equal tokens. ``drop_last`` drops a last step smaller than a full
    one (in tokens: smaller than half the budget). A document's pieces stay in one step.
    ``progress(done, total)`` is called after every step."""
    doc_tokens = (
        np.add.reduceat(table.length, table.first[:-1]) if table.doc.shape[0] else table.length
    )
    cuts = [
        _owner_steps(doc_tokens[s], batch_size, packing.tokens_per_step, r.shape[0] / num_replicas)
        for s, r in zip(streams, owner_ranks, strict=True)
    ]
    steps = max(c.shape[0] - 1 for c in cuts)
    if len({c.shape[0] for c in cuts}) > 1:
        cuts = [_even_steps(doc_tokens[s], steps) for s in streams]
    dropped = 0
    if drop_last and steps and _partial(streams, cuts, doc_tokens, batch_size, packing):
        steps -= 1
        dropped = sum(int(s.shape[0] - c[steps]) for s, c in zip(streams, cuts, strict=True))
    step_pieces = [
        [table.of(stream[cut[s] : cut[s + 1]]) for stream, cut in zip(streams, cuts, strict=True)]
        for s in range(steps)
    ]
    packed = pack_steps(
        step_pieces, owner_ranks, num_replicas, table, piece_costs, packing, progress=progress
    )
    return dataclasses.replace(packed, num_dropped=dropped)


def pack_steps(
    step_pieces: list[list[np.ndarray]],
    owner_ranks: Sequence[np.ndarray],
    num_replicas: int,
    table: Pieces,
    piece_costs: np.ndarray,
    packing: Packing,
    speeds: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PackedEpoch:
    """Pack consecutive steps: ``step_pieces[s][o]`` are the pieces owner ``o`` trains at
    step ``s`` (on its ranks ``owner_ranks[o]``, of relative ``speeds``, default equal),
    every rank running the step's largest micro-batch count. ``progress(done, total)`` is
    called after every step; ``num_dropped`` is 0."""
    steps = len(step_pieces)
    speed = np.ones(num_replicas) if speeds is None else np.asarray(speeds, dtype=np.float64)
    parts: list[list[np.ndarray]] = [[], [], [], [], []]  # piece, rank, micro, row, step
    num_micro = np.zeros(steps, np.int64)
    loads = np.zeros((steps, num_replicas))
    for s, owned_pieces in enumerate(step_pieces):
        packed = []
        for owned, ranks in zip(owned_pieces, owner_ranks, strict=True):
            lengths = table.length[owned]
            step = pack_step(lengths, piece_costs[owned], ranks.shape[0], packing, speed[ranks])
            packed.append((owned, lengths, step))
        m = max(step.num_micro for _, _, step in packed)
        for (owned, lengths, step), ranks in zip(packed, owner_ranks, strict=True):
            if step.num_micro < m:
                costs = piece_costs[owned]
                step = pack_step(lengths, costs, ranks.shape[0], packing, speed[ranks], m)
            loads[s, ranks] = step.loads
            columns = (owned, ranks[step.rank], step.micro, step.row)
            for part, values in zip(parts[:4], columns, strict=True):
                part.append(values)
            parts[4].append(np.full(owned.shape[0], s, np.int64))
        num_micro[s] = m
        if progress is not None:
            progress(s + 1, steps)
    piece, rank, micro, row, step_of = (
        np.concatenate(p) if p else np.empty(0, np.int64) for p in parts
    )
    order = np.lexsort((np.arange(piece.shape[0]), row, micro, rank, step_of))
    piece, rank, micro, row, step_of = (x[order] for x in (piece, rank, micro, row, step_of))
    first = np.concatenate([[0], np.cumsum(num_micro * num_replicas)]).astype(np.int64)
    slot = first[step_of] + rank * num_micro[step_of] + micro
    total = int(first[-1])
    tokens = np.bincount(slot, weights=table.length[piece], minlength=total)
    docs = np.bincount(slot, minlength=total).astype(np.float64)
    weights = np.empty(total)
    for s in range(steps):
        span = slice(first[s], first[s + 1])
        weights[span] = micro_weights(tokens[span], docs[span], num_replicas, packing.loss)
    bounds_micro = np.concatenate([[0], np.cumsum(docs.astype(np.int64))]).astype(np.int64)
    rank_starts = first[:-1, None] + np.arange(num_replicas + 1)[None, :] * num_micro[:, None]
    layout = {
        "pieces": piece,
        "starts": table.start[piece],
        "lengths": table.length[piece],
        "rows": row,
        "num_micro": num_micro,
        "first": first,
        "bounds": bounds_micro,
        "weights": weights,
    }
    return PackedEpoch(table.doc[piece], bounds_micro[rank_starts], loads, layout, 0)


def _owner_steps(
    tokens: np.ndarray, batch_size: int | None, budget: int | None, share: float
) -> np.ndarray:
    """Step starts of one owner's stream (plus its end) for its ``share`` of the world."""
    if budget is None:
        assert batch_size is not None
        return step_starts(tokens, max(1, round(batch_size * share)), None)
    return step_starts(tokens, None, max(1, int(budget * share)))


def _even_steps(tokens: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` consecutive steps of near-equal tokens over a stream (plus its end)."""
    cumulative = np.cumsum(tokens)
    total = cumulative[-1] if cumulative.shape[0] else 0
    targets = total * np.arange(steps) / max(steps, 1)
    starts = np.searchsorted(cumulative, targets, side="right")
    starts[0] = 0
    return np.append(np.maximum.accumulate(starts), tokens.shape[0]).astype(np.int64)


def _partial(
    streams: list[np.ndarray],
    cuts: list[np.ndarray],
    doc_tokens: np.ndarray,
    batch_size: int | None,
    packing: Packing,
) -> bool:
    """Whether the last step is smaller than a full one (``drop_last`` drops it)."""
    last = [s[c[-2] : c[-1]] for s, c in zip(streams, cuts, strict=True)]
    if packing.tokens_per_step is None:
        return sum(x.shape[0] for x in last) < (batch_size or 0)
    return 2 * sum(int(doc_tokens[x].sum()) for x in last) < packing.tokens_per_step
