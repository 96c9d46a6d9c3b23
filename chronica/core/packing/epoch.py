"""Epoch assembly of packed plans: steps cut from every owner's document stream, each
packed by ``pack_step`` for the owner's ranks, every rank running the same number of
micro-batches in a step, with the loss weights and layout of ``chronica.core.plan``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from chronica.core.packing.documents import Pieces
from chronica.core.packing.options import Packing
from chronica.core.packing.outliers import OutlierDelay, delay_outliers
from chronica.core.packing.step import in_pipeline_order, pack_step
from chronica.core.packing.weights import micro_weights

__all__ = ["PackedEpoch", "pack_epoch", "pack_steps", "step_starts"]


def step_starts(
    tokens: np.ndarray, batch_size: int | None, tokens_per_step: int | None
) -> np.ndarray:
    """Where each step starts in a stream of documents with ``tokens`` tokens each, plus the
    stream's end: ``batch_size`` documents per step, or (``tokens_per_step`` given) the next
    documents up to that many tokens (at least one document per step). A trailing partial
    step is kept; the caller drops it for ``drop_last``.

    Args:
        tokens: tokens of every document, in stream order.
        batch_size: documents per step (used when ``tokens_per_step`` is ``None``).
        tokens_per_step: a token budget per step, or ``None``.

    Example::

        >>> step_starts(np.array([3, 3, 3, 1, 5]), None, 6).tolist()
        [0, 2, 4, 5]
        >>> step_starts(np.array([3, 3, 3, 1, 5]), 2, None).tolist()
        [0, 2, 4, 5]
    """
    n = tokens.shape[0]
    if tokens_per_step is None:
        if batch_size is None:
            raise ValueError("packing needs batch_size= (documents per step) or tokens_per_step=")
        return np.append(np.arange(0, n, batch_size, dtype=np.int64), n)
    return np.append(_budget_starts(tokens.astype(np.int64), tokens_per_step), n)


@njit(cache=True, nogil=True)
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
class PackedEpoch:
    """The parts of a packed ``EpochPlan``: step-major ``indices`` (rank after rank, then
    micro-batch and row), ``bounds`` ``(steps, W + 1)``, ``loads`` ``(steps, W)``, the
    ``layout`` arrays of ``chronica.core.plan.MicroLayout`` and the documents
    ``num_dropped`` by ``drop_last``. Built by ``pack_epoch`` and ``pack_steps``.

    Args:
        indices: ``int64`` document numbers, step after step, rank after rank, then
            micro-batch and row.
        bounds: ``int64`` ``(steps, W + 1)``, where every rank's documents start in
            ``indices``.
        loads: ``float64`` ``(steps, W)``, every rank's predicted cost.
        layout: the arrays of ``chronica.core.plan.MicroLayout``.
        num_dropped: documents dropped by ``drop_last``.

    Example: ``pack_epoch(...).indices[bounds[s, r]:bounds[s, r + 1]]`` are rank ``r``'s
    documents at step ``s``.
    """

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
    With ``packing.outliers`` each owner's outliers wait for a later step
    (``chronica.core.packing.outliers``); ``layout["delays"]`` then holds every entry's
    document's delay in steps.
    ``progress(done, total)`` is called after every step.

    Args:
        streams: every owner's document numbers, in training order.
        owner_ranks: every owner's ranks (ascending).
        num_replicas: the world's ranks ``W``.
        table: the documents' pieces (``pieces``).
        piece_costs: predicted cost of every piece.
        packing: the token cap, rows, budget and loss rule.
        batch_size: documents per global step (used without ``tokens_per_step``).
        drop_last: drop a trailing partial step.
        progress: ``progress(done, total)`` after every step, or ``None``.

    Example::

        >>> from chronica.core.packing import pieces
        >>> sizes = np.array([3.0, 1.0, 2.0, 2.0])
        >>> packing = Packing(max_tokens=4)
        >>> table = pieces(sizes, packing)
        >>> epoch = pack_epoch([np.arange(4)], [np.arange(2)], 2, table, sizes, packing, 4,
        ...                    False)
        >>> epoch.bounds.tolist()
        [[0, 2, 4]]
    """
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
    step_docs = [
        [stream[cut[s] : cut[s + 1]] for stream, cut in zip(streams, cuts, strict=True)]
        for s in range(steps)
    ]
    delays = None
    if packing.outliers is not None:
        step_docs, delays = _delayed(step_docs, owner_ranks, table, piece_costs, packing.outliers)
    step_pieces = [[table.of(docs) for docs in owned] for owned in step_docs]
    packed = pack_steps(
        step_pieces, owner_ranks, num_replicas, table, piece_costs, packing, progress=progress
    )
    if delays is not None:
        # Every entry's document's delay, aligned with the plan (MicroLayout.delays).
        layout = {**packed.layout, "delays": delays[packed.indices]}
        packed = dataclasses.replace(packed, layout=layout)
    return dataclasses.replace(packed, num_dropped=dropped)


def _delayed(
    step_docs: list[list[np.ndarray]],
    owner_ranks: Sequence[np.ndarray],
    table: Pieces,
    piece_costs: np.ndarray,
    delay: OutlierDelay,
) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """Every owner's steps with its outliers delayed (``delay_outliers``) and every
    document's delay in steps (0 for documents not planned)."""
    num_docs = table.first.shape[0] - 1
    costs = np.zeros(num_docs)
    weights = np.zeros(num_docs)
    if table.doc.shape[0]:
        costs = np.add.reduceat(piece_costs, table.first[:-1])
        weights = np.maximum.reduceat(piece_costs, table.first[:-1])
    delays = np.zeros(num_docs, np.int64)
    out: list[list[np.ndarray]] = [[] for _ in step_docs]
    for o, ranks in enumerate(owner_ranks):
        steps, waited = delay_outliers(
            [owned[o] for owned in step_docs], costs, weights, ranks.shape[0], delay
        )
        for s, docs in enumerate(steps):
            out[s].append(docs)
            delays[docs] = waited[s]
    return out, delays


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
    called after every step; ``num_dropped`` is 0.

    Args:
        step_pieces: ``step_pieces[s][o]``, the pieces owner ``o`` trains at step ``s``.
        owner_ranks: every owner's ranks (ascending).
        num_replicas: the world's ranks ``W``.
        table: the documents' pieces.
        piece_costs: predicted cost of every piece.
        packing: the token cap, rows and loss rule.
        speeds: relative speed per rank (default: equal).
        progress: ``progress(done, total)`` after every step, or ``None``.

    Example::

        >>> from chronica.core.packing import pieces
        >>> table = pieces(np.array([3.0, 1.0]), Packing(max_tokens=4))
        >>> packed = pack_steps([[np.arange(2)]], [np.arange(2)], 2, table,
        ...                     np.array([3.0, 1.0]), Packing(max_tokens=4))
        >>> packed.indices.tolist(), packed.loads.tolist()
        ([0, 1], [[3.0, 1.0]])
    """
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
            step = in_pipeline_order(step, speed[ranks], packing)
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
