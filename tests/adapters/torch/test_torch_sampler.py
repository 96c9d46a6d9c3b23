import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sized_dataset import Sized
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchSampler
from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

from chronica.torch.utils.data import DistributedBatchSampler, DistributedSampler


@given(n=st.integers(0, 40), w=st.integers(1, 6), drop_last=st.booleans())
def test_torch_semantics_without_shuffle(n, w, drop_last):
    for r in range(w):
        ours = DistributedSampler(range(n), w, r, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(range(n), w, r, shuffle=False, drop_last=drop_last)
        assert len(ours) == len(theirs)
        assert list(ours) == list(theirs)


@given(n=st.integers(1, 60), w=st.integers(1, 5), k=st.integers(1, 4), drop_last=st.booleans())
def test_torch_semantics_with_balancing_and_uniform_sizes(n, w, k, drop_last):
    for r in range(w):
        ours = DistributedSampler(range(n), w, r, False, drop_last=drop_last, batch_size=w * k)
        theirs = TorchSampler(range(n), w, r, shuffle=False, drop_last=drop_last)
        assert len(ours) == len(theirs)
        assert list(ours) == list(theirs)


@given(n=st.integers(1, 60), w=st.integers(1, 5), drop_last=st.booleans(), epoch=st.integers(0, 5))
def test_shuffled_lengths_and_coverage_match_torch(n, w, drop_last, epoch):
    sizes = np.random.default_rng(n).lognormal(3, 1, n)
    ours = [
        DistributedSampler(Sized(sizes), w, r, drop_last=drop_last, batch_size=2 * w)
        for r in range(w)
    ]
    theirs = [TorchSampler(range(n), w, r, drop_last=drop_last) for r in range(w)]
    for a, b in zip(ours, theirs, strict=True):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
    got = Counter(i for s in ours for i in s)
    expect = Counter(i for s in theirs for i in s)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert sum(got.values()) == sum(expect.values())
    assert sorted(got.values()) == sorted(expect.values())  # same amount of repetition


def test_padding_wraps_when_fewer_samples_than_ranks():
    streams = [list(DistributedSampler(range(3), 8, r, batch_size=8)) for r in range(8)]
    assert all(len(s) == 1 for s in streams)
    assert set(i for s in streams for i in s) == {0, 1, 2}


@pytest.mark.parametrize("rank", [-1, 4])
def test_bad_rank_is_a_value_error(rank):
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(10), num_replicas=4, rank=rank)


def test_a_world_of_a_million_ranks_is_refused_at_once():
    with pytest.raises(ValueError, match=r"num_replicas=1048576 must be an int in \[1, 65536\]"):
        DistributedSampler(range(1000), num_replicas=1 << 20, rank=0, batch_size=1 << 21)


def test_one_process_without_a_process_group_is_a_world_of_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    sampler = DistributedSampler(range(10), batch_size=4, sizes=np.arange(1, 11))
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert sorted(sampler) == list(range(10))


def test_a_launched_process_without_its_process_group_names_init_process_group(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE=2 .*init_process_group"):
        DistributedSampler(range(10))


def test_sizes_argument_and_bad_sizes():
    with pytest.raises(ValueError, match="sizes has 2 entries but the data set has 3"):
        DistributedSampler(range(3), 1, 0, sizes=[1, 2])
    with pytest.raises(ValueError, match="multiple of num_replicas"):
        DistributedSampler(range(30), 4, 0, batch_size=30)


def test_sizeof_default_keeps_getsizeof_working():
    assert sys.getsizeof(Sized([1, 2])) > 0


def _consume(sampler, count):
    it = iter(sampler)
    return [next(it) for _ in range(count)]


@pytest.mark.parametrize("kind,exact", [("static", True), ("static", False), ("guided", True)])
def test_mid_epoch_resume_continues_exactly(kind, exact):
    sizes = np.random.default_rng(0).lognormal(4, 1, 500)

    def make():
        return DistributedSampler(Sized(sizes), 4, 2, batch_size=32, kind=kind, exact=exact)

    full = make()
    full.set_epoch(3)
    expected = list(full)
    first = make()
    first.set_epoch(3)
    head = _consume(first, 37)
    state = first.state_dict()
    resumed = make()  # a restarted process builds the sampler anew
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    # The following epoch starts from the beginning again.
    resumed.set_epoch(4)
    assert len(list(resumed)) == len(expected)


def test_batch_sampler_resume_and_loader():
    sizes = np.random.default_rng(1).lognormal(4, 1, 300)
    batches = DistributedBatchSampler(Sized(sizes), 24, num_replicas=3, rank=1)
    loader = DataLoader(Sized(sizes), batch_sampler=batches)
    steps = [b.tolist() for b in loader]
    assert len(steps) == len(batches) == batches.plan().num_steps
    assert all(len(s) == 8 for s in steps[:-1])
    again = DistributedBatchSampler(Sized(sizes), 24, num_replicas=3, rank=1)
    head = _consume(again, 5)
    state = again.state_dict()
    fresh = DistributedBatchSampler(Sized(sizes), 24, num_replicas=3, rank=1)
    fresh.load_state_dict(state)
    assert head + list(fresh) == steps
    np.testing.assert_array_equal(fresh.loss_weights(), np.ones(len(steps)))


def test_state_from_other_configuration_is_refused():
    a = DistributedSampler(range(100), 4, 0, batch_size=16)
    b = DistributedSampler(range(100), 4, 0, batch_size=16, seed=1)
    with pytest.raises(ValueError, match="digest differs"):
        b.load_state_dict(a.state_dict())


def test_stats_report_balance_and_padding():
    sizes = np.random.default_rng(2).lognormal(5, 1, 2048)
    stats = DistributedSampler(Sized(sizes), 8, 0, batch_size=256).stats()
    assert 1.0 <= stats.load_ratio_mean < 1.001
    assert stats.num_steps == 8 and stats.num_padded == 0
    assert 0.0 < stats.padding_fraction < 1.0


@pytest.mark.parametrize("world", [2, 3])
def test_real_gloo_job_covers_every_sample_once(tmp_path: Path, world: int):
    outs = [tmp_path / f"rank{rank}.json" for rank in range(world)]
    worker = str(HELPERS / "dist_worker.py")
    with torch_rendezvous(world) as meeting:
        env = base_env(ROOT, WORLD_SIZE=str(world), **meeting)
        run_workers(
            [[sys.executable, worker, str(out)] for out in outs],
            [{**env, "RANK": str(rank), "OMP_NUM_THREADS": "1"} for rank in range(world)],
            timeout=120,
        )
    results = [json.loads(out.read_text()) for out in outs]
    n = 203
    per_rank = -(-n // world)
    for epoch in range(2):
        steps = [r["epochs"][epoch] for r in results]
        assert len({len(s) for s in steps}) == 1  # equal step counts
        for step in zip(*steps, strict=True):
            assert len({len(b) for b in step}) == 1  # equal local batch sizes
        seen = Counter(i for s in steps for b in s for i in b)
        assert set(seen) == set(range(n))
        assert sum(seen.values()) == per_rank * world  # torch's padding, nothing else
    assert all(r["len"] == per_rank for r in results)
    assert results[0]["epochs"][0] != results[0]["epochs"][1]
    assert torch.distributed.is_available()


def test_partitioned_sampler_stays_on_its_node(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    sizes = np.random.default_rng(3).lognormal(4, 1, 400)
    labels = np.arange(400) % 5
    samplers = [
        DistributedSampler(Sized(sizes), 4, r, shuffle="local", batch_size=16, labels=labels)
        for r in range(4)
    ]
    base = samplers[0].scheduler.base_partitions()
    assert [b.shape[0] for b in base] == [200, 200]
    for epoch in range(2):
        for r, sampler in enumerate(samplers):
            sampler.set_epoch(epoch)
            assert set(sampler) <= set(base[r // 2].tolist())
    assert samplers[0].movement(1).total_samples == 0
    skew = samplers[0].label_skew()
    assert 0.0 <= skew.batch_mean <= skew.batch_max <= 1.0
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
        DistributedSampler(range(8), 4, 0, shuffle="local")


def test_numpy_integer_arguments_are_accepted_as_torch_accepts_them():
    kw = dict(batch_size=8, seed=3)
    ours = DistributedSampler(
        range(100), np.int64(4), np.int64(1), **{k: np.int64(v) for k, v in kw.items()}
    )
    same = DistributedSampler(range(100), 4, 1, **kw)
    assert list(ours) == list(same)
    assert json.dumps(ours.state_dict()) == json.dumps(same.state_dict())
