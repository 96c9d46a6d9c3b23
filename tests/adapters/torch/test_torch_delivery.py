"""What a training loop receives is what the sampler accounts for: a packed batch sampler's
``len`` holds for every epoch, a ``DataLoader`` with workers (which prefetches) resumes from
the batches the loop received, and an epoch iterated again without ``set_epoch`` is refused."""

from __future__ import annotations

import gc
import logging
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from chronica import Packing
from chronica.adapters.torch.consumers import advanced
from chronica.adapters.torch.packed_length import LOOKAHEAD
from chronica.torch.utils.data import (
    DistributedBatchSampler,
    DistributedSampler,
    collate_packed,
)

LENGTHS = np.random.default_rng(0).integers(5, 120, size=200)


def _packed(rank: int, **packing) -> DistributedBatchSampler:
    options = {"max_tokens": 256, **packing}
    return DistributedBatchSampler(
        range(200), 20, 2, rank, sizes=LENGTHS, packing=Packing(**options)
    )


def _epoch_counts(sampler: DistributedBatchSampler, epochs: int) -> list[int]:
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append(int(sampler.plan().micro.num_micro.sum()))
    return out


def test_advanced_moves_through_steps():
    assert advanced((0, 0), [4, 4, 2], 0) == (0, 0)
    assert advanced((0, 1), [4, 4, 2], 5) == (1, 2)
    assert advanced((1, 0), [4, 4, 2], 4) == (2, 0)
    assert advanced((0, 0), [4, 4, 2], 99) == (3, 0)


def test_packed_len_is_promised_once_and_every_epoch_yields_it():
    counts = _epoch_counts(_packed(0), LOOKAHEAD)
    assert len(set(counts)) > 1  # the epochs' own counts differ
    samplers = [_packed(rank) for rank in range(2)]
    promised = [len(s) for s in samplers]  # read before set_epoch, as Lightning does
    assert promised == [max(counts)] * 2
    for epoch in range(3):
        seen: Counter = Counter()
        for sampler in samplers:
            sampler.set_epoch(epoch)
            assert len(sampler) == promised[0]
            micro = [
                collate_packed([(torch.arange(i.start + i.length), i) for i in b]) for b in sampler
            ]
            assert len(micro) == promised[0]
            last = [m for m in micro if m["last"]]
            assert len(last) == sampler.plan().num_steps  # every step's update happens
            assert micro[-1]["last"] and micro[-1]["num_tokens"] > 0
            padding = [m for m in micro if m["num_tokens"] == 0]
            assert all(m["loss_weight"] == 0 and not m["last"] for m in padding)
            seen.update(int(i) for m in micro for i in m["indices"])
        assert sorted(seen) == list(range(200)) and set(seen.values()) == {1}


def test_an_epoch_longer_than_promised_is_refused_before_it_starts():
    sampler = _packed(0)
    counts = _epoch_counts(sampler, 40)
    sampler.set_epoch(0)
    promised = len(sampler)
    longer = next(e for e, count in enumerate(counts) if count > promised)
    sampler.set_epoch(longer)
    with pytest.raises(ValueError, match=r"Packing\(micro_batches=\d+\)"):
        next(iter(sampler))


def test_a_fixed_micro_batch_count_needs_no_padding():
    sampler = _packed(0, micro_batches=4)
    assert len(sampler) == 40
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert len(list(sampler)) == 40


@pytest.mark.parametrize("batches", [False, True])
def test_a_dataloader_with_workers_resumes_from_what_the_loop_received(batches):
    data = TensorDataset(torch.arange(120))
    sizes = np.random.default_rng(4).lognormal(3, 1, 120)

    def loader():
        if batches:
            sampler = DistributedBatchSampler(data, 12, 2, 1, sizes=sizes)
            return DataLoader(data, batch_sampler=sampler, num_workers=2), sampler
        sampler = DistributedSampler(data, 2, 1, batch_size=12, sizes=sizes)
        return DataLoader(data, batch_size=3, sampler=sampler, num_workers=2), sampler

    whole, sampler = loader()
    sampler.set_epoch(1)
    expected = [b.tolist() for (b,) in whole]
    first, sampler = loader()
    sampler.set_epoch(1)
    received = []
    for (batch,) in first:
        received.append(batch.tolist())
        if len(received) == 5:
            state = sampler.state_dict()  # the workers have fetched more by now
            break
    resumed, sampler = loader()
    sampler.load_state_dict(state)
    assert received + [b.tolist() for (b,) in resumed] == expected


def test_a_state_after_the_prefetching_loader_was_dropped_mid_epoch_is_refused():
    data = TensorDataset(torch.arange(60))
    sampler = DistributedSampler(data, 2, 0, batch_size=6, sizes=np.arange(1, 61))
    for _ in DataLoader(data, batch_size=3, sampler=sampler, num_workers=2):
        break
    gc.collect()  # the loader's iterator, and the count of batches it handed out, are gone
    with pytest.raises(RuntimeError, match="dropped mid-epoch"):
        sampler.state_dict()
    sampler.set_epoch(1)  # a new epoch starts afresh
    assert sampler.state_dict()["step"] == 0


def test_an_epoch_iterated_again_without_set_epoch_is_refused_under_a_dataloader(caplog):
    data = TensorDataset(torch.arange(40))
    sampler = DistributedSampler(data, 2, 0, batch_size=8, sizes=np.arange(1, 41))
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    first = [b.tolist() for (b,) in loader]
    with pytest.raises(RuntimeError, match=r"without set_epoch.*set_epoch\(epoch\)"):
        next(iter(loader))
    sampler.set_epoch(1)
    assert [b.tolist() for (b,) in loader] != first
    sampler.set_epoch(1)  # the same epoch again, asked for: allowed
    list(loader)
    with caplog.at_level(logging.WARNING, "chronica"):
        list(sampler)  # iterated directly (a test, a look): a warning
    assert "without set_epoch" in caplog.text
