"""``collate_packed`` (whole-array assembly) against a per-document reference written with
one torch operation per document, as the function was first written: the same tensors,
dtypes and fields on random micro-batches of every document form it accepts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from chronica.adapters.torch.packed import IGNORED_LABEL, PackedIndex, collate_packed


def _reference(items, key="input_ids", pad_to=None, pad_value=0):
    """One document at a time: slice, cast, mask its first label, then concatenate."""
    tokens, labels, lengths, docs = [], [], [], []
    for item, index in items:
        if index.length == 0:
            continue
        mapping = isinstance(item, dict)
        values = torch.as_tensor(np.asarray(item[key] if mapping else item))
        targets = values
        if mapping and item.get("labels") is not None:
            targets = torch.as_tensor(np.asarray(item["labels"]))
        piece = slice(index.start, index.start + index.length)
        tokens.append(values[piece].to(torch.int64))
        labels.append(targets[piece].to(torch.int64, copy=True))
        labels[-1][0] = IGNORED_LABEL
        lengths.append(index.length)
        docs.append(int(index))
    count = sum(lengths)
    empty = torch.empty(0, dtype=torch.int64)
    input_ids = torch.cat(tokens) if tokens else empty
    label_ids = torch.cat(labels) if labels else empty
    position_ids = torch.cat([torch.arange(n) for n in lengths]) if lengths else empty
    segment_ids = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64)
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
    cu_seqlens[1:] = torch.cumsum(torch.tensor(seqlens, dtype=torch.int32), 0)
    head = items[0][1]
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "segment_ids": segment_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max(seqlens, default=0),
        "num_tokens": count,
        "indices": torch.tensor(docs, dtype=torch.int64),
        "labels": label_ids,
        "loss_weight": float(head.loss_weight),
        "step": head.step,
        "micro": head.micro,
        "num_micro": head.num_micro,
        "last": head.micro == head.num_micro - 1,
    }


def _document(rng: np.random.Generator, size: int):
    """A document of ``size`` tokens in one of the forms ``collate_packed`` accepts."""
    values = rng.integers(0, 30000, size)
    form = int(rng.integers(6))
    if form == 0:
        return values.astype(np.int32)
    if form == 1:
        return values.astype(np.uint16)
    if form == 2:
        return torch.from_numpy(values)
    if form == 3:
        return values.tolist()
    labels = np.where(rng.random(size) < 0.3, IGNORED_LABEL, values)
    return {"input_ids": values.astype(np.int32), "labels": labels if form == 4 else None}


def _micro_batch(rng: np.random.Generator) -> list[tuple[object, PackedIndex]]:
    count = int(rng.integers(0, 12))
    place = (int(rng.integers(5)), 1, 3, float(rng.random()))
    if count == 0:  # an empty micro-batch's placeholder
        return [(None, PackedIndex(0, 0, 0, 0, *place))]
    items = []
    for _ in range(count):
        size = int(rng.integers(1, 300))
        start = int(rng.integers(0, size))
        length = int(rng.integers(1, size - start + 1))
        index = PackedIndex(int(rng.integers(1000)), start, length, 0, *place)
        items.append((_document(rng, size), index))
    return items


@pytest.mark.parametrize("seed", range(40))
def test_collate_packed_matches_the_per_document_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    items = _micro_batch(rng)
    tokens = sum(i.length for _, i in items)
    pad_to = None if seed % 3 else tokens + int(rng.integers(0, 50))
    pad_value = int(rng.integers(0, 3))
    got = collate_packed(items, pad_to=pad_to, pad_value=pad_value)
    want = _reference(items, pad_to=pad_to, pad_value=pad_value)
    assert got.keys() == want.keys()
    for name, expected in want.items():
        if isinstance(expected, torch.Tensor):
            assert got[name].dtype == expected.dtype, name
            assert torch.equal(got[name], expected), name
        else:
            assert got[name] == expected and type(got[name]) is type(expected), name


def test_collate_packed_copies_the_tokens() -> None:
    """The tensors own their memory: changing them leaves the documents alone (a stream's
    records are views of a mapped shard)."""
    document = np.arange(10, dtype=np.int64)
    out = collate_packed([(document, PackedIndex(0, 0, 10, 0, 0, 0, 1, 1.0))])
    out["input_ids"][:] = -1
    assert document.tolist() == list(range(10))


def test_collate_packed_tensors_share_one_buffer_without_overlap() -> None:
    """One storage per micro-batch (one shared-memory block from a worker), each tensor
    its own region of it."""
    rng = np.random.default_rng(5)
    items = [
        (rng.integers(0, 99, n), PackedIndex(i, 0, n, 0, 0, 0, 2, 1.0))
        for i, n in enumerate((7, 3, 12))
    ]
    out = collate_packed(items, pad_to=30)
    tensors = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    assert len(storages) == 1
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors.values()
    )
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert all(t.is_contiguous() for t in tensors.values())
