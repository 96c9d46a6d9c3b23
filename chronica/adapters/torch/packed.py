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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from chronica.runtime.micro import MicroBatch

__all__ = ["IGNORED_LABEL", "PackedDataset", "PackedIndex", "collate_packed", "packed_indices"]

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
    tokens, labels, lengths, docs = [], [], [], []
    for item, index in items:
        if not isinstance(index, PackedIndex):
            raise TypeError("collate_packed needs PackedDataset items ((document, PackedIndex))")
        if index.length == 0:
            continue
        mapping = isinstance(item, Mapping)
        values = _sequence(item[key] if mapping else item)
        if values.ndim != 1 or values.shape[0] < index.start + index.length:
            raise ValueError(
                f"document {int(index)} has {tuple(values.shape)} tokens but its size says "
                f"at least {index.start + index.length}; sizes must be the documents' lengths"
            )
        targets = values
        if mapping and item.get("labels") is not None:
            targets = _sequence(item["labels"])
            if targets.shape != values.shape:
                raise ValueError(
                    f"document {int(index)} has {tuple(targets.shape)} labels for "
                    f"{tuple(values.shape)} tokens; labels are aligned with {key!r} "
                    f"(unshifted, {IGNORED_LABEL} where a token carries no loss)"
                )
        piece = slice(index.start, index.start + index.length)
        tokens.append(values[piece].to(torch.int64))
        labels.append(targets[piece].to(torch.int64, copy=True))
        labels[-1][0] = IGNORED_LABEL  # nothing in the micro-batch predicts a piece's first
        lengths.append(index.length)
        docs.append(int(index))
    count = sum(lengths)
    if pad_to is not None and count > pad_to:
        raise ValueError(f"pad_to={pad_to} is below the micro-batch's {count} tokens")
    input_ids = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.int64)
    label_ids = torch.cat(labels) if labels else input_ids
    position_ids = torch.cat([torch.arange(n) for n in lengths]) if lengths else input_ids
    segment_ids = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.as_tensor(lengths, dtype=torch.int64)
    )
    seqlens = list(lengths)
    if pad_to is not None and pad_to > count:
        pad = pad_to - count
        input_ids = torch.cat([input_ids, torch.full((pad,), pad_value, dtype=torch.int64)])
        label_ids = torch.cat([label_ids, torch.full((pad,), IGNORED_LABEL, dtype=torch.int64)])
        position_ids = torch.cat([position_ids, torch.arange(pad)])
        segment_ids = torch.cat([segment_ids, torch.full((pad,), -1, dtype=torch.int64)])
        seqlens.append(pad)
    cu_seqlens = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    if seqlens:
        cu_seqlens[1:] = torch.cumsum(torch.as_tensor(seqlens, dtype=torch.int32), 0)
    head = items[0][1]
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "segment_ids": segment_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max(seqlens, default=0),
        "num_tokens": count,
        "indices": torch.as_tensor(docs, dtype=torch.int64),
        "labels": label_ids,
        "loss_weight": float(head.loss_weight),
        "step": head.step,
        "micro": head.micro,
        "num_micro": head.num_micro,
        "last": head.micro == head.num_micro - 1,
    }


def _sequence(values: Any) -> torch.Tensor:
    """A document's tokens or labels (a tensor, array or list) as a tensor."""
    return torch.as_tensor(np.asarray(values) if isinstance(values, list) else values)
