"""Document pieces: the sequences documents are trained as under ``Packing.long_documents``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chronica.core.packing.options import Packing

__all__ = ["Pieces", "pieces"]


@dataclass(frozen=True)
class Pieces:
    """The sequences documents are trained as: piece ``p`` is tokens ``start[p] ..
    start[p] + length[p]`` of document ``doc[p]``; document ``d``'s pieces are ``first[d] ..
    first[d + 1] - 1``, in order. Without splitting or truncation every document is one
    piece of its own length. Built by ``pieces``; the arrays are read-only.

    Args:
        doc: ``int64``, the document of every piece.
        start: ``int64``, the piece's first token within its document.
        length: ``int64``, the piece's tokens.
        first: ``int64``, one more than documents: document ``d``'s first piece.

    Example::

        >>> table = pieces(np.array([5.0, 2.0]), Packing(max_tokens=4, long_documents="split"))
        >>> table.doc.tolist(), table.start.tolist(), table.length.tolist()
        ([0, 0, 1], [0, 4, 0], [4, 1, 2])
        >>> table.of(np.array([1, 0])).tolist()
        [2, 0, 1]
    """

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    first: np.ndarray

    def of(self, docs: np.ndarray) -> np.ndarray:
        """The pieces of ``docs``, document after document, each document's in order.

        Args:
            docs: integer document indices (any order, repeats allowed).
        """
        counts = self.first[docs + 1] - self.first[docs]
        offsets = np.repeat(self.first[docs] - np.cumsum(counts) + counts, counts)
        return offsets + np.arange(int(counts.sum()), dtype=np.int64)


def pieces(sizes: np.ndarray, packing: Packing) -> Pieces:
    """The pieces of documents of lengths ``sizes`` under ``packing.long_documents``: one per
    document of at most a row (``"truncate"`` cuts the rest off), or row-long pieces of a
    longer document (``"split"``). ``ValueError`` names the first document too long for a
    row (``"error"``) or the first size that is not a whole number.

    Args:
        sizes: document lengths in tokens (whole numbers, any numeric dtype).
        packing: the row length and the ``long_documents`` rule.

    Example::

        >>> pieces(np.array([5.0, 2.0]), Packing(max_tokens=4, long_documents="truncate")).length
        array([4, 2])
    """
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
