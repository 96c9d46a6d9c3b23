"""Context-parallel layouts: one micro-batch's documents over a group of ``size`` ranks.

Under context parallelism (CP) the ranks of a group hold parts of the same micro-batch and
attend across them (all-gather of keys and values, or a ring). A document that stays *whole*
lives on one rank of the group; a *sharded* document is cut into ``2 * size`` equal chunks
and rank ``c`` holds chunks ``c`` and ``2 * size - 1 - c`` (head-tail, or zigzag): with
causal attention, query ``t`` attends to ``t + 1`` keys, so an early chunk is cheap and a
late one dear, and each head-tail pair costs the same. Sharded documents must be a multiple
of ``2 * size`` tokens (``Packing(pad_multiple=2 * size)`` pads them so).

``context_layout`` lays out one micro-batch and returns, per rank of the group, a
``ContextShard``: which tokens of the micro-batch it holds (in its local order), their
positions within their documents, the local ``cu_seqlens`` of its query segments and, per
segment, the document it belongs to (whose keys, gathered from the group, it attends to),
plus the permutation that restores the micro-batch's order from the group's local tokens
laid end to end. Every token of every document is held by exactly one rank.

Example::

    >>> shards = context_layout([8, 3], sharded=[True, False], owner=[0, 1], size=2)
    >>> shards[0].tokens.tolist(), shards[1].tokens.tolist()
    ([0, 1, 6, 7], [2, 3, 4, 5, 8, 9, 10])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_int

__all__ = ["ContextShard", "causal_work", "context_layout", "restore_order"]


@dataclass(frozen=True)
class ContextShard:
    """What one rank of a context-parallel group holds of a micro-batch.

    Args:
        tokens: ``int64`` positions in the micro-batch (documents end to end, in batch order)
            of the rank's tokens, in its local order.
        position_ids: ``int64`` every local token's position within its document.
        documents: ``int64`` every local token's document (index into the micro-batch).
        cu_seqlens: ``int32`` offsets of the local query segments (a whole document, or one
            chunk of a sharded one), ``[0, ..., tokens.size]``.
        segment_documents: ``int64`` the document of every segment: a segment's queries
            attend, causally, to that document's keys (gathered from the group when the
            document is sharded).

    Example::

        >>> shard = context_layout([4], sharded=[True], owner=[0], size=2)[1]
        >>> shard.tokens.tolist(), shard.cu_seqlens.tolist(), shard.position_ids.tolist()
        ([1, 2], [0, 1, 2], [1, 2])
    """

    tokens: np.ndarray
    position_ids: np.ndarray
    documents: np.ndarray
    cu_seqlens: np.ndarray
    segment_documents: np.ndarray


def context_layout(lengths: Any, *, sharded: Any, owner: Any, size: int) -> list[ContextShard]:
    """Lay one micro-batch's documents out over a context-parallel group of ``size`` ranks:
    sharded documents in head-tail chunks on every rank, whole ones on their ``owner``.

    Args:
        lengths: tokens per document of the micro-batch, in batch order.
        sharded: per document, whether it is split over the group (its length a multiple of
            ``2 * size``).
        owner: per document, the group rank a whole document lives on (ignored where
            sharded), ``0 .. size - 1``.
        size: the ranks of the group, ``>= 1``.

    Example::

        >>> [s.segment_documents.tolist() for s in
        ...  context_layout([4, 2], sharded=[True, False], owner=[0, 0], size=2)]
        [[0, 0, 1], [0, 0]]
    """
    g = check_int("size", size, 1)
    length = np.asarray(lengths, dtype=np.int64)
    split = np.asarray(sharded, dtype=np.bool_)
    home = np.asarray(owner, dtype=np.int64)
    n = length.shape[0]
    if split.shape != (n,) or home.shape != (n,):
        raise ValueError(f"sharded and owner need one entry per document ({n})")
    if np.any(split & (length % (2 * g) != 0)):
        bad = int(np.flatnonzero(split & (length % (2 * g) != 0))[0])
        raise ValueError(
            f"document {bad} of {int(length[bad])} tokens cannot be cut into {2 * g} equal "
            f"chunks; pad sharded documents to a multiple of 2 * size (Packing(pad_multiple="
            f"{2 * g}))"
        )
    if np.any(~split & ((home < 0) | (home >= g))):
        raise ValueError(f"owner must name a rank 0 .. {g - 1} for every whole document")
    starts = np.concatenate(([0], np.cumsum(length)[:-1])) if n else length
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(g)]  # (doc, first, last)
    for d in range(n):
        if not split[d]:
            pieces[int(home[d])].append((d, 0, int(length[d])))
            continue
        chunk = int(length[d]) // (2 * g)
        for c in range(g):
            for k in (c, 2 * g - 1 - c):
                pieces[c].append((d, k * chunk, (k + 1) * chunk))
    return [_shard(parts, starts) for parts in pieces]


def _shard(parts: list[tuple[int, int, int]], starts: np.ndarray) -> ContextShard:
    spans = [np.arange(first, last, dtype=np.int64) for _, first, last in parts]
    positions = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    documents = np.repeat(
        np.array([d for d, _, _ in parts], np.int64), [s.size for s in spans]
    ).astype(np.int64)
    sizes = np.array([s.size for s in spans], np.int64)
    return ContextShard(
        tokens=starts[documents] + positions if documents.size else positions,
        position_ids=positions,
        documents=documents,
        cu_seqlens=np.concatenate(([0], np.cumsum(sizes))).astype(np.int32),
        segment_documents=np.array([d for d, _, _ in parts], np.int64),
    )


def restore_order(shards: list[ContextShard]) -> np.ndarray:
    """The permutation that puts the group's local tokens, laid end to end rank after rank,
    back in the micro-batch's order: ``gathered[restore_order(shards)]``.

    Args:
        shards: ``context_layout``'s result.

    Example::

        >>> restore_order(context_layout([4], sharded=[True], owner=[0], size=2)).tolist()
        [0, 2, 3, 1]
    """
    everything = np.concatenate([s.tokens for s in shards])
    return np.argsort(everything, kind="stable")


def causal_work(shard: ContextShard) -> int:
    """The keys the shard's queries attend to under causal attention within documents
    (query at position ``p`` sees ``p + 1`` keys): its attention work.

    Args:
        shard: one rank's ``ContextShard``.

    Example::

        >>> [causal_work(s) for s in context_layout([8], sharded=[True], owner=[0], size=2)]
        [18, 18]
    """
    return int((shard.position_ids + 1).sum())
