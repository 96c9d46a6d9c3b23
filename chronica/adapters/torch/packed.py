"""Packed micro-batches for torch: the indices a packed ``DistributedBatchSampler`` yields,
the data set wrapper that carries them to the collate function, and the collate function.

``collate_packed`` builds what variable-length attention consumes: one flat token tensor
per micro-batch with ``cu_seqlens`` (flash-attention's varlen path), ``position_ids``
restarting at every document, and ``segment_ids`` (a document mask for SDPA or
``flex_attention``), ``labels`` (the tokens a causal model is trained to predict, -100
where it is not: prompt tokens of supervised fine-tuning, every document's first token),
plus the micro-batch's ``loss_weight`` and its place in the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from chronica.runtime.micro import MicroBatch

__all__ = [
    "IGNORED_LABEL",
    "PackedDataset",
    "PackedIndex",
    "collate_packed",
    "collate_pieces",
    "packed_indices",
]

IGNORED_LABEL = -100  # a label that carries no loss (transformers' and torch's ignore_index)


class PackedIndex(int):
    """A document index (an ``int``, so any data set indexes with it) that also says which
    tokens of the document this micro-batch trains (``start``, ``length``), in which row,
    and where the micro-batch stands: ``step``, ``micro`` of ``num_micro``, its
    ``loss_weight``. Pickles with its fields (DataLoader workers receive them).

    Args:
        index: the document.
        start: the first of its tokens this micro-batch trains.
        length: how many of its tokens it trains.
        row: the packed row they go to.
        step: the step of the micro-batch.
        micro: the micro-batch's number within the step.
        num_micro: the step's micro-batches on every rank.
        loss_weight: the micro-batch's loss weight (see ``collate_packed``).

    Example::

        >>> PackedIndex(7, 0, 128, 0, step=3, micro=1, num_micro=4, loss_weight=0.5) + 0
        7
    """

    start: int
    length: int
    row: int
    step: int
    micro: int
    num_micro: int
    loss_weight: float

    def __new__(
        cls,
        index: int,
        start: int,
        length: int,
        row: int,
        step: int,
        micro: int,
        num_micro: int,
        loss_weight: float,
    ) -> PackedIndex:
        out = super().__new__(cls, index)
        out.start, out.length, out.row = start, length, row
        out.step, out.micro, out.num_micro, out.loss_weight = step, micro, num_micro, loss_weight
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.start, self.length, self.row, self.step, self.micro, self.num_micro)
        return (PackedIndex, (int(self), *fields, self.loss_weight))


def packed_indices(micro: MicroBatch, step: int, number: int, count: int) -> list[int]:
    """Micro-batch ``number`` of ``count`` at ``step`` as ``PackedIndex`` values. An empty
    micro-batch gives one zero-length entry (of document 0), so that its place in the step
    still reaches the collate function.

    Args:
        micro: this rank's micro-batch (``chronica.runtime.MicroBatch``).
        step: the step it belongs to.
        number: its number within the step.
        count: the step's micro-batches on every rank.
    """
    meta = (step, number, count, micro.loss_weight)
    if micro.indices.shape[0] == 0:
        return [PackedIndex(0, 0, 0, 0, *meta)]
    return [
        PackedIndex(int(i), int(s), int(n), int(r), *meta)
        for i, s, n, r in zip(micro.indices, micro.starts, micro.lengths, micro.rows, strict=True)
    ]


class PackedDataset(Dataset):
    """Wraps a data set of token sequences so that each item reaches ``collate_packed``
    with its ``PackedIndex``: ``PackedDataset(docs)[i]`` is ``(docs[i], i)``; indexing with
    a plain ``int`` raises ``TypeError`` naming the fix.

    Args:
        dataset: the documents (anything indexable by an ``int``).

    Example::

        batches = DistributedBatchSampler(docs, 64, sizes=lengths, packing=Packing(4096))
        loader = DataLoader(PackedDataset(docs), batch_sampler=batches,
                            collate_fn=collate_packed)
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __repr__(self) -> str:
        return f"PackedDataset({type(self.dataset).__name__} of {len(self.dataset)})"

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: PackedIndex) -> tuple[Any, PackedIndex]:
        if not isinstance(index, PackedIndex):
            raise TypeError(
                "PackedDataset is indexed by a packed DistributedBatchSampler's PackedIndex "
                f"values, got {type(index).__name__}; pass the sampler as batch_sampler="
            )
        return self.dataset[index], index


def collate_packed(
    items: Sequence[tuple[Any, PackedIndex]],
    key: str = "input_ids",
    pad_to: int | None = None,
    pad_value: int = 0,
) -> dict[str, Any]:
    """One micro-batch from ``PackedDataset`` items: each document is a 1-D token sequence
    (a tensor, array or list) or a mapping holding one under ``key``.

    Returns ``input_ids`` (the micro-batch's tokens, document after document, row after
    row, ``int64``), ``position_ids`` (restarting at 0 in every document), ``segment_ids``
    (the document's number within the micro-batch, from 0), ``cu_seqlens`` (``int32``, the
    cumulative lengths from 0, flash-attention's varlen argument), ``max_seqlen``,
    ``num_tokens``, ``indices`` (the documents, ``int64``), ``labels`` (``int64``, aligned
    with ``input_ids``, unshifted as transformers' models take them: a mapping document's
    ``labels`` field where it has one, of its tokens' length, -100 on the tokens that carry
    no loss, else its tokens; -100 on the first token of every piece of a document, which
    no token of the micro-batch predicts, and on the padding), ``loss_weight``, ``step``,
    ``micro``, ``num_micro`` and ``last`` (the step's last micro-batch: time for the
    optimizer). ``pad_to`` (e.g. ``max_tokens``, for one static shape) pads the tokens with
    ``pad_value`` and gives the padding ``segment_ids`` of -1 and its own ``cu_seqlens``
    entry. An empty micro-batch has ``num_tokens`` 0 and ``loss_weight`` 0.
    The tensors are contiguous, non-overlapping views of one buffer, built with a few
    whole-array operations per micro-batch (not per document), so that a ``DataLoader``
    worker hands the micro-batch to the training process as one shared-memory block.

    Args:
        items: ``PackedDataset`` items, ``(document, PackedIndex)`` pairs.
        key: the field holding the tokens when documents are mappings.
        pad_to: pad the tokens to this many (one static shape), or ``None``.
        pad_value: the token of the padding.

    Example::

        loader = DataLoader(PackedDataset(docs), batch_sampler=batches,
                            collate_fn=functools.partial(collate_packed, pad_to=4096))
    """
    if not items:
        raise ValueError("collate_packed got an empty micro-batch; use a packed sampler")
    for _, index in items:
        if not isinstance(index, PackedIndex):
            raise TypeError("collate_packed needs PackedDataset items ((document, PackedIndex))")
    head = items[0][1]
    pieces = ((item, int(i), i.start, i.length) for item, i in items)
    place = (head.step, head.micro, head.num_micro, head.loss_weight)
    return collate_pieces(pieces, place, key, pad_to, pad_value)


def collate_pieces(
    pieces: Iterable[tuple[Any, int, int, int]],
    place: tuple[int, int, int, float],
    key: str = "input_ids",
    pad_to: int | None = None,
    pad_value: int = 0,
) -> dict[str, Any]:
    """``collate_packed``'s micro-batch from its documents' pieces directly, without
    ``PackedIndex`` values (a stream's micro-batch holds its records and ids as arrays).

    Each document costs a few attribute checks and a view of its tokens; the tensors are
    built once per micro-batch (one concatenation and a few whole-array operations), so a
    micro-batch of many short documents costs little more than one of a few long ones.

    Args:
        pieces: ``(document, index, start, length)`` per document, in the micro-batch's
            order; a piece of ``length`` 0 is skipped (an empty micro-batch's placeholder).
        place: ``(step, micro, num_micro, loss_weight)`` of the micro-batch.
        key: the field holding the tokens when documents are mappings.
        pad_to: pad the tokens to this many (one static shape), or ``None``.
        pad_value: the token of the padding.
    """
    tokens: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    lengths: list[int] = []
    docs: list[int] = []
    labelled = False
    for item, doc, start, length in pieces:
        if length == 0:
            continue
        mapping = isinstance(item, Mapping)
        values = _array(item[key] if mapping else item)
        if values.ndim != 1 or values.shape[0] < start + length:
            raise ValueError(
                f"document {doc} has {tuple(values.shape)} tokens but its size says "
                f"at least {start + length}; sizes must be the documents' lengths"
            )
        piece = values[start : start + length]
        label = piece
        if mapping and item.get("labels") is not None:
            own = _array(item["labels"])
            if own.shape != values.shape:
                raise ValueError(
                    f"document {doc} has {tuple(own.shape)} labels for "
                    f"{tuple(values.shape)} tokens; labels are aligned with {key!r} "
                    f"(unshifted, {IGNORED_LABEL} where a token carries no loss)"
                )
            label, labelled = own[start : start + length], True
        tokens.append(piece)
        targets.append(label)
        lengths.append(length)
        docs.append(doc)
    count = sum(lengths)
    if pad_to is not None and count > pad_to:
        raise ValueError(f"pad_to={pad_to} is below the micro-batch's {count} tokens")
    pad = 0 if pad_to is None else pad_to - count
    seqlens = np.array(lengths + [pad] if pad else lengths, dtype=np.int64)
    size, cells = count + pad, seqlens.shape[0] + 1
    # One buffer holds every tensor of the micro-batch (disjoint views), so that a
    # DataLoader worker hands it over as one shared-memory block, not seven.
    buffer = torch.empty(4 * size + len(docs) + (cells + 1) // 2, dtype=torch.int64)
    whole = buffer.numpy()
    input_ids, label_ids, position_ids, segment_ids = whole[: 4 * size].reshape(4, size)
    whole[4 * size : 4 * size + len(docs)] = docs
    bounds = whole[4 * size + len(docs) :].view(np.int32)[:cells]
    bounds[0] = 0
    np.cumsum(seqlens, out=bounds[1:], dtype=np.int32)
    starts = np.repeat(bounds[:-1].astype(np.int64), seqlens)
    input_ids[count:] = pad_value
    if tokens:
        np.concatenate(tokens, out=input_ids[:count], casting="unsafe")
    label_ids[count:] = IGNORED_LABEL
    if labelled:
        np.concatenate(targets, out=label_ids[:count], casting="unsafe")
    else:
        label_ids[:count] = input_ids[:count]
    # nothing in the micro-batch predicts a piece's first token
    label_ids[bounds[: len(lengths)]] = IGNORED_LABEL
    np.subtract(np.arange(size, dtype=np.int64), starts, out=position_ids)
    segment_ids[:] = np.repeat(np.arange(cells - 1, dtype=np.int64), seqlens)
    if pad:
        segment_ids[count:] = -1
    views = buffer[: 4 * size].view(4, size)
    tail = buffer[4 * size :]
    step, micro, num_micro, loss_weight = place
    return {
        "input_ids": views[0],
        "position_ids": views[2],
        "segment_ids": views[3],
        "cu_seqlens": tail[len(docs) :].view(torch.int32)[:cells],
        "max_seqlen": int(seqlens.max(initial=0)),
        "num_tokens": count,
        "indices": tail[: len(docs)],
        "labels": views[1],
        "loss_weight": float(loss_weight),
        "step": step,
        "micro": micro,
        "num_micro": num_micro,
        "last": micro == num_micro - 1,
    }


def _array(values: Any) -> np.ndarray:
    """A document's tokens or labels (a tensor, array or list) as an array (a view where
    it can be)."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)
