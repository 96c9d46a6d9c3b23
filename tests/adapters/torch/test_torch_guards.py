"""The torch samplers' attributes as torch and the training libraries read them, and the loud
errors and warnings for the mistakes that would silently undo chronica's plan."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from chronica import Packing
from chronica.torch.distributed import ScheduledOptimizer
from chronica.torch.utils.data import Dataset, DistributedBatchSampler, DistributedSampler

SIZES = np.random.default_rng(0).lognormal(3, 1, 100)


class QuickStart(Dataset):
    """Written as the quick start writes it: ``__sizeof__(self, index)`` without a default."""

    def __len__(self):
        return len(SIZES)

    def __getitem__(self, index):
        return index

    def __sizeof__(self, index):
        return SIZES[index]


def test_samplers_carry_torchs_attribute_meanings():
    sampler = DistributedSampler(QuickStart(), 4, 1, batch_size=16)
    assert isinstance(sampler, torch.utils.data.DistributedSampler)  # what Lightning looks for
    assert (sampler.batch_size, sampler.global_batch_size, sampler.local_batch_size) == (16, 16, 4)
    batches = DistributedBatchSampler(QuickStart(), 16, 4, 1, drop_last=True)
    assert (batches.batch_size, batches.global_batch_size, batches.drop_last) == (4, 16, True)
    batches.sampler.set_epoch(3)  # what Lightning and accelerate call
    assert batches.epoch == batches.sampler.epoch == 3
    steps = list(batches)  # 100 samples, 16 per step: a short last step, even with drop_last
    assert all(len(b) == batches.batch_size for b in steps[:-1]) and len(steps[-1]) == 1
    assert list(batches.sampler) == [i for b in steps for i in b]
    assert len(batches.sampler) == sum(map(len, steps))
    packed = DistributedBatchSampler(
        QuickStart(), 16, 4, 1, sizes=SIZES.astype(int) + 1, packing=Packing(max_tokens=256)
    )
    assert packed.batch_size is None  # micro-batches of varying sizes
    assert len(list(packed.sampler)) == len(packed.sampler)


@pytest.mark.parametrize("loader_batch,fits", [(8, True), (4, True), (16, False), (3, False)])
def test_a_loader_batch_that_does_not_fit_the_local_batch_is_refused(loader_batch, fits):
    sampler = DistributedSampler(QuickStart(), 2, 0, batch_size=16)  # 8 per rank and step
    loader = DataLoader(QuickStart(), batch_size=loader_batch, sampler=sampler)
    if fits:
        assert sum(len(b) for b in loader) == len(sampler)
    else:
        with pytest.raises(ValueError, match=r"use DataLoader\(batch_size=8\)"):
            next(iter(loader))


def test_quick_start_sizeof_keeps_getsizeof_working():
    assert sys.getsizeof(QuickStart()) > 0
    sampler = DistributedSampler(QuickStart(), 2, 0, batch_size=4)
    np.testing.assert_array_equal(sampler.scheduler.sizes, SIZES)

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __sizeof__(self, index):
            return 1

    with pytest.warns(UserWarning, match=r"sys\.getsizeof\(dataset\) raise a TypeError"):
        DistributedSampler(Plain(), 2, 0, batch_size=4)


def test_forgotten_sizes_are_a_warning_naming_the_fix():
    with pytest.warns(UserWarning, match="every sample weighs 1.*Pass sizes="):
        DistributedSampler(range(40), 2, 0, batch_size=8)


def test_a_batch_sampler_rebuilt_around_another_sampler_is_refused():
    other = torch.utils.data.DistributedSampler(range(40), 2, 0)
    with pytest.raises(ValueError, match=r"Trainer\(use_distributed_sampler=False\)"):
        DistributedBatchSampler(other, batch_size=8, drop_last=False)


def test_a_foreign_distributed_sampler_around_chronicas_is_refused():
    class Wrapper(torch.utils.data.DistributedSampler):
        """Shards what another sampler yields, as Lightning's sampler wrapper does."""

        def __init__(self, sampler):
            super().__init__(range(len(sampler)), 2, 0, shuffle=False)
            self.inner = sampler

        def __iter__(self):
            order = list(self.inner)
            return (order[i] for i in super().__iter__())

    sampler = DistributedSampler(QuickStart(), 2, 0, batch_size=8)
    with pytest.raises(ValueError, match="a second time"):
        list(Wrapper(sampler))


def test_scheduled_optimizer_refuses_a_ddp_model(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")  # one rank: its own store, on a port the OS picks
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        with pytest.raises(ValueError, match=r"model\.module"):
            ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    finally:
        dist.destroy_process_group()
