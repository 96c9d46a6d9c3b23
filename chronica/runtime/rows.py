"""Dense packed rows of one micro-batch, for the faces that hand out static shapes (numpy only).

A packed plan (``ScheduleConfig(packing=...)``) gives every micro-batch as a list of entries
(``chronica.runtime.MicroBatch``): tokens ``starts[i] .. starts[i] + lengths[i]`` of document
``indices[i]`` go into row ``rows[i]``, the rows filled in the order of the entries. The
JAX iterator and the ``tf.data`` face both lay those entries out as ``rows`` dense rows of
``row_length`` tokens (the MaxText/Grain convention); this module is that layout, shared, so
that both faces yield the same arrays for the same plan:

- ``tokens[r, c]``: the token at column ``c`` of row ``r``, ``pad_value`` past the row's
  documents;
- ``segment_ids[r, c]``: ``1, 2, ...`` numbering the documents (pieces) of row ``r`` in
  order, ``0`` on padding (an attention mask is ``segment_ids[:, :, None] ==
  segment_ids[:, None, :]`` with padding excluded);
- ``positions[r, c]``: the token's position in its piece, restarting at ``0`` in every
  piece (a piece of a split document is trained as its own sequence), ``0`` on padding.

``row_layout`` computes where every token goes from the micro-batch alone (no token is
read); ``RowLayout.fill`` copies documents' tokens into rows (the JAX face, which reads
records one by one), ``RowLayout.token_index`` gives the flat index of every slot in a
concatenation of all documents (the ``tf.data`` face, which gathers in the graph).
``packed_names`` maps a record's fields to the names a packed micro-batch carries them
under, with the checks both faces make.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.runtime.micro import MicroBatch

__all__ = [
    "PACKED_KEYS",
    "TOKENS",
    "RowLayout",
    "check_document_lengths",
    "check_field_lengths",
    "packed_dtype",
    "packed_names",
    "row_layout",
]

TOKENS = "tokens"
# What a packed micro-batch holds besides its packed fields (every face yields these).
PACKED_KEYS = ("segment_ids", "positions", "loss_weight", "step", "micro", "num_micro")


@dataclass(frozen=True)
class RowLayout:
    """Where the tokens of one micro-batch go in ``rows`` dense rows of ``row_length``.

    ``slots[k]`` is the flat slot (``row · row_length + column``) of the ``k``-th token of
    the micro-batch, counting entry after entry (the entries of ``micro``) and, within an
    entry, token after token; ``segment_ids`` and ``positions`` are ``int32`` arrays of
    shape ``(rows, row_length)`` as the module docstring says. ``num_tokens`` counts the
    real (non-padding) slots. Guarantees: no two tokens share a slot, no row holds more than
    ``row_length`` tokens, and the entries of one row appear in it in the entries' order,
    back to back from column 0. Built by ``row_layout``.

    Args:
        micro: the micro-batch laid out.
        rows: rows of the micro-batch (``Packing.rows``).
        row_length: tokens per row (``Packing.length``).
        slots: the flat slot of every token, entry after entry.
        segment_ids: ``1, 2, ...`` per piece of a row, 0 on padding.
        positions: each token's position in its piece, 0 on padding.

    Example::

        >>> layout = row_layout(micro, rows=2, row_length=128)
        >>> tokens = layout.fill([docs[i] for i in micro.indices], pad_value=0)
    """

    micro: MicroBatch
    rows: int
    row_length: int
    slots: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Real tokens in the micro-batch (the slots that are not padding)."""
        return int(self.slots.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """``bool`` ``(rows, row_length)``: ``True`` on real tokens, ``False`` on padding."""
        return self.segment_ids > 0

    def fill(
        self,
        documents: Sequence[Any],
        pad_value: Any = 0,
        dtype: Any = None,
        field: str = TOKENS,
        trailing: tuple[int, ...] | None = None,
    ) -> np.ndarray:
        """The dense rows of the entries' tokens: ``documents[i]`` is the whole document of
        entry ``i`` (``micro.indices[i]``), an array-like whose first axis is its tokens
        (trailing axes, if any, are kept: shape ``(rows, row_length, *trailing)``). Padding
        holds ``pad_value``; ``dtype`` defaults to the documents'. ``ValueError`` when a
        document is shorter than its entry says (sizes must be the documents' lengths) or
        documents differ beyond their first axis (or from ``trailing``, the trailing shape
        every document must have, which also shapes an empty micro-batch's rows); ``field``
        names them in the message. Give ``dtype`` and ``trailing`` for one shape and dtype
        whatever the micro-batch holds.

        Args:
            documents: the whole document of every entry, in the entries' order.
            pad_value: what padding slots hold.
            dtype: the rows' dtype (default: the documents').
            field: the field's name, for messages.
            trailing: the trailing shape every document must have.
        """
        micro = self.micro
        if len(documents) != micro.indices.shape[0]:
            raise ValueError(
                f"got {len(documents)} documents for a micro-batch of "
                f"{micro.indices.shape[0]} entries"
            )
        pieces = []
        for document, index, start, length in zip(
            documents, micro.indices, micro.starts, micro.lengths, strict=True
        ):
            values = np.asarray(document)
            if values.ndim < 1:
                raise ValueError(
                    f"document {int(index)} is a scalar; with packing= every document is a "
                    "sequence of tokens along its first axis"
                )
            _check_length(int(index), values.shape[0], int(start) + int(length), field)
            pieces.append(values[int(start) : int(start) + int(length)])
        shapes = {p.shape[1:] for p in pieces}
        if trailing is not None:
            shapes.add(tuple(trailing))
        if len(shapes) > 1:
            raise ValueError(
                f"field {field!r}: documents differ beyond their first (token) axis: "
                f"{sorted(shapes)}"
            )
        tail = shapes.pop() if shapes else ()
        if dtype is None:
            dtype = np.result_type(*pieces) if pieces else np.asarray(pad_value).dtype
        out = np.full((self.rows * self.row_length, *tail), pad_value, dtype=dtype)
        if pieces:
            out[self.slots] = np.concatenate(pieces, axis=0)
        return out.reshape(self.rows, self.row_length, *tail)

    def token_index(self, splits: np.ndarray) -> np.ndarray:
        """``int64`` ``(rows, row_length)``: for every slot, the index of its token in the
        concatenation of all documents in which document ``d`` is ``splits[d] ..
        splits[d + 1]`` (``splits`` has one more entry than there are documents), ``-1`` on
        padding. ``ValueError`` when a document is shorter than its entry says.

        Args:
            splits: int64 offsets of the documents in the concatenation (``N + 1`` entries).
        """
        micro = self.micro
        out = np.full(self.rows * self.row_length, -1, dtype=np.int64)
        if micro.indices.shape[0]:
            first = splits[micro.indices]
            available = splits[micro.indices + 1] - first
            needed = micro.starts + micro.lengths
            short = np.flatnonzero(available < needed)
            if short.shape[0]:
                i = int(short[0])
                _check_length(int(micro.indices[i]), int(available[i]), int(needed[i]))
            lengths = micro.lengths
            begin = np.cumsum(lengths) - lengths
            within = np.arange(self.num_tokens, dtype=np.int64) - np.repeat(begin, lengths)
            out[self.slots] = np.repeat(first + micro.starts, lengths) + within
        return out.reshape(self.rows, self.row_length)


def row_layout(micro: MicroBatch, rows: int, row_length: int) -> RowLayout:
    """The ``RowLayout`` of ``micro`` in ``rows`` rows of ``row_length`` tokens (a packed
    plan's ``Packing.rows`` and ``Packing.length``). ``ValueError`` if an entry's row is
    outside ``[0, rows)`` or a row's entries exceed ``row_length`` tokens (a micro-batch of
    another packing).

    Args:
        micro: the micro-batch (``chronica.runtime.MicroBatch``).
        rows: rows of a micro-batch (``>= 1``).
        row_length: tokens per row (``>= 1``).

    Example::

        >>> layout = row_layout(micro, packing.rows, packing.length)
        >>> layout.segment_ids  # (rows, row_length): 1, 2, ... per piece, 0 on padding
    """
    rows = check_int("rows", rows, 1, hint=" (Packing.rows)")
    row_length = check_int("row_length", row_length, 1, hint=" (Packing.length)")
    lengths = np.asarray(micro.lengths, dtype=np.int64)
    row_of = np.asarray(micro.rows, dtype=np.int64)
    n = lengths.shape[0]
    segment_ids = np.zeros(rows * row_length, dtype=np.int32)
    positions = np.zeros(rows * row_length, dtype=np.int32)
    if n and (row_of.min() < 0 or row_of.max() >= rows):
        raise ValueError(f"a micro-batch entry is in row {int(row_of.max())}, outside {rows} rows")
    # Entries grouped by row, in their order within a row.
    order = np.argsort(row_of, kind="stable")
    r, length = row_of[order], lengths[order]
    end = np.cumsum(length)
    begin = end - length
    new_row = np.ones(n, dtype=bool)
    new_row[1:] = r[1:] != r[:-1]
    column = begin - np.maximum.accumulate(np.where(new_row, begin, 0))
    if n and int((column + length).max()) > row_length:
        raise ValueError(
            f"a row of the micro-batch holds {int((column + length).max())} tokens, more than "
            f"row_length={row_length}"
        )
    real = (length > 0).astype(np.int64)
    counted = np.cumsum(real)
    segment = counted - np.maximum.accumulate(np.where(new_row, counted - real, 0))
    start_slot = np.empty(n, dtype=np.int64)
    start_slot[order] = r * row_length + column
    entry_segment = np.empty(n, dtype=np.int64)
    entry_segment[order] = segment
    total = int(lengths.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    slots = np.repeat(start_slot, lengths) + within
    segment_ids[slots] = np.repeat(entry_segment, lengths)
    positions[slots] = within
    for array in (slots, segment_ids, positions):
        array.setflags(write=False)
    return RowLayout(
        micro,
        rows,
        row_length,
        slots,
        segment_ids.reshape(rows, row_length),
        positions.reshape(rows, row_length),
    )


def packed_names(
    fields: Iterable[str] | None, token_field: str, reserved: Iterable[str] = ()
) -> dict[str, str]:
    """What a packed micro-batch calls each field of a record: the record's ``fields`` (its
    keys; ``None`` for a record that is one token sequence, returned as ``{token_field:
    "tokens"}``), the token field ``token_field`` as ``"tokens"`` and every other field under
    its own name (each is packed per token like the tokens). ``ValueError`` when the token
    field is missing or another field's name is one a packed micro-batch uses itself
    (``"tokens"``, ``PACKED_KEYS`` and the face's ``reserved`` names).

    Args:
        fields: the records' field names, or ``None`` for token-sequence records.
        token_field: the field holding the tokens.
        reserved: more names the face's micro-batches use.

    Example::

        >>> packed_names(["ids", "loss_mask"], token_field="ids")
        {'ids': 'tokens', 'loss_mask': 'loss_mask'}
    """
    if fields is None:
        return {token_field: TOKENS}
    names = list(fields)
    if token_field not in names:
        raise ValueError(
            f"token_field={token_field!r} is not a field of the records (fields: {names}); "
            "pass token_field= naming the field that holds the token sequence"
        )
    taken = {TOKENS, *PACKED_KEYS, *reserved}
    out = {}
    for name in names:
        if name == token_field:
            out[name] = TOKENS
        elif name in taken:
            raise ValueError(
                f"field {name!r} clashes with a key of packed micro-batches "
                f"({', '.join(sorted(taken))}); rename or drop it"
            )
        else:
            out[name] = name
    return out


def packed_dtype(name: str, field: str, dtype: Any, ndim: int) -> np.dtype:
    """The dtype a field of records is packed as (``name``: its key in the micro-batch, from
    ``packed_names``): ``int32`` for the tokens, which must be integers, its own ``dtype``
    otherwise. ``ValueError`` for a field that is not a sequence (``ndim`` 0: a scalar such
    as a label, which has no tokens to pack) or tokens that are not integers.

    Args:
        name: the field's key in the micro-batch.
        field: the field's name in the records, for messages.
        dtype: the field's dtype in the records.
        ndim: the field's number of axes in a record.

    Example::

        >>> packed_dtype("tokens", "ids", np.int64, 1)
        dtype('int32')
    """
    if ndim < 1:
        raise ValueError(
            f"field {field!r} is a scalar; with packing= every field of a record is packed "
            "per token (a sequence along its first axis): drop it from the records first"
        )
    dtype = np.dtype(dtype)
    if name != TOKENS:
        return dtype
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(
            f"the tokens (field {field!r}) have dtype {dtype}; packed tokens are int32 ids: "
            "give integer token sequences"
        )
    return np.dtype(np.int32)


def check_field_lengths(
    field: str, lengths: Any, tokens: Any, token_field: str, documents: Any = None
) -> None:
    """``ValueError`` naming the first record whose ``field`` has another length
    (``lengths``) than its tokens (``tokens``, the lengths of ``token_field``): every packed
    field is a per-token sequence as long as the tokens.

    Args:
        field: the field checked, for the message.
        lengths: the field's length in every record.
        tokens: the token field's length in every record.
        token_field: the token field's name, for the message.
        documents: the records' numbers (default ``0, 1, ...``).

    Example::

        >>> check_field_lengths("mask", [3, 4], [3, 5], "tokens")  # ValueError: record 1
    """
    lengths, tokens = np.asarray(lengths), np.asarray(tokens)
    differ = np.flatnonzero(lengths != tokens)
    if differ.shape[0]:
        i = int(differ[0])
        document = i if documents is None else int(np.asarray(documents)[i])
        raise ValueError(
            f"field {field!r} of record {document} has {int(lengths[i])} entries but "
            f"{int(tokens[i])} tokens; with packing= every field is a per-token sequence as "
            f"long as the tokens ({token_field!r})"
        )


def check_document_lengths(lengths: np.ndarray, sizes: np.ndarray, field: str = TOKENS) -> None:
    """``ValueError`` naming the first document whose ``field`` has fewer tokens
    (``lengths``) than its size says (``sizes``: with packing, document lengths in tokens).

    Args:
        lengths: every document's token count, read from the records.
        sizes: the sizes the plan was made with.
        field: the token field's name, for the message.

    Example::

        >>> check_document_lengths(np.array([5, 3]), np.array([5, 4]))  # ValueError: document 1
    """
    short = np.flatnonzero(np.asarray(lengths) < np.asarray(sizes))
    if short.shape[0]:
        i = int(short[0])
        _check_length(i, int(lengths[i]), int(sizes[i]), field)


def _check_length(document: int, available: int, needed: int, field: str = TOKENS) -> None:
    if available < needed:
        raise ValueError(
            f"document {document} has {available} {field} but its size says at least "
            f"{needed}; with packing= sizes must be the documents' lengths in tokens"
        )
