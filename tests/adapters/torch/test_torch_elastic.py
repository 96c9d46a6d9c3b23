"""Elastic resume through the torch samplers' own API: a ``state_dict`` saved at W ranks
continues the epoch at W' ranks with ``load_state_dict``.

The elastic maths (exactly-once over chains of worlds, the global batches kept, every
refusal) is tested on core objects in tests/core/test_elastic.py; these tests check the
face: what the samplers yield, their lengths, loss weights and messages."""

import json

import numpy as np
import pytest
from elastic_checks import check_resume_exactly_once
from sized_dataset import Sized

from chronica.torch.utils.data import DistributedBatchSampler, DistributedSampler

MODES = [("static", True), ("static", False), ("guided", True)]


def _sizes(n):
    return np.random.default_rng(n).lognormal(3, 1, n)


def _batch_samplers(sizes, w, b, **kw):
    return [
        DistributedBatchSampler(Sized(sizes), b, num_replicas=w, rank=r, **kw) for r in range(w)
    ]


def _take(sampler, count):
    it = iter(sampler)
    return [next(it) for _ in range(count)]


def _run(n, w, b, w2, b2, steps, epoch=1, save_rank=0, **kw):
    """Train ``steps`` steps at (w, b), save one rank's state, finish the epoch at (w2, b2).
    Returns (consumed samples, remainder steps per new rank, new samplers)."""
    sizes = _sizes(n)
    old = _batch_samplers(sizes, w, b, **kw)
    consumed = []
    for sampler in old:
        sampler.set_epoch(epoch)
        consumed += [i for batch in _take(sampler, steps) for i in batch]
    states = [s.state_dict() for s in old]
    new = _batch_samplers(sizes, w2, b2, **kw)
    for sampler in new:
        sampler.load_state_dict(states[save_rank])
        sampler.set_epoch(epoch)  # the usual loop does this; it keeps the loaded position
    rest = [list(s) for s in new]
    return consumed, rest, new


# A case per mode and option the sampler passes on; every case of the maths is in
# tests/core/test_elastic.py.
CASES = [
    # n, w, b, w2, b2, steps, drop_last, shuffle, (kind, exact)
    (211, 4, 16, 6, 24, 5, False, True, MODES[0]),  # W' > W
    (211, 4, 16, 3, 12, 5, True, True, MODES[0]),  # W' < W, drop_last
    (211, 4, 16, 2, 16, 7, False, "stratified", MODES[0]),  # same B, fewer ranks
    (301, 5, 20, 4, 32, 6, False, True, MODES[1]),  # pool
    (301, 4, 32, 3, 24, 4, False, True, MODES[2]),  # guided
    (13, 4, 8, 6, 6, 1, False, True, MODES[0]),  # tiny: remainder smaller than the world
]


@pytest.mark.parametrize("n,w,b,w2,b2,steps,drop_last,shuffle,mode", CASES)
def test_the_samplers_resume_the_rest_of_the_epoch_exactly_once(
    n, w, b, w2, b2, steps, drop_last, shuffle, mode
):
    kind, exact = mode
    kw = dict(drop_last=drop_last, shuffle=shuffle, kind=kind, exact=exact)
    if shuffle == "stratified":
        kw["labels"] = np.arange(n) % 3
    consumed, rest, new = _run(n, w, b, w2, b2, steps, save_rank=w - 1, **kw)
    plan = new[0].plan()
    assert all(s.plan().indices.tobytes() == plan.indices.tobytes() for s in new)
    check_resume_exactly_once(n, consumed, rest, plan, drop_last)
    # Equal step counts, equal local batches at every step, global batch B' but the last.
    assert len({len(r) for r in rest}) == 1
    assert [len(s) for s in new] == [len(r) for r in rest]
    for step in zip(*rest, strict=True):
        assert len({len(batch) for batch in step}) == 1
    sums = plan.counts.sum(axis=1)
    assert np.all(sums[:-1] == b2) and (sums.size == 0 or 0 < sums[-1] <= b2)
    np.testing.assert_array_equal(new[0].loss_weights(), np.ones(plan.num_steps))
    # The next epoch is the ordinary one at the new world.
    fresh = _batch_samplers(_sizes(n), w2, b2, **kw)
    for resumed, other in zip(new, fresh, strict=True):
        resumed.set_epoch(2)
        other.set_epoch(2)
        assert list(resumed) == list(other)
        assert len(resumed) == len(other)


def test_every_rank_state_gives_the_same_remainder():
    n, w, b = 150, 3, 12
    sizes = _sizes(n)
    old = _batch_samplers(sizes, w, b)
    for s in old:
        _take(s, 4)
    plans = set()
    for state in (s.state_dict() for s in old):
        new = DistributedBatchSampler(Sized(sizes), 10, num_replicas=5, rank=2)
        new.load_state_dict(json.loads(json.dumps(state)))  # states are plain JSON
        plans.add(new.plan().indices.tobytes() + new.plan().bounds.tobytes())
    assert len(plans) == 1


def test_distributed_sampler_mid_step_save_replans_the_partial_step():
    n, w, b = 203, 4, 16
    sizes = _sizes(n)
    old = [DistributedSampler(Sized(sizes), w, r, batch_size=b) for r in range(w)]
    yielded, completed = [], []
    for sampler in old:
        head = _take(sampler, 4 * 3 + 2)  # three steps of 4 per rank, and 2 of the fourth
        yielded += head
        completed += head[:12]
    state = old[1].state_dict()
    assert (state["step"], state["offset"]) == (3, 2)
    new = [DistributedSampler(Sized(sizes), 3, r, batch_size=9) for r in range(3)]
    for sampler in new:
        sampler.load_state_dict(state)
    rest = [list(s) for s in new]
    assert [len(s) for s in new] == [len(r) for r in rest]
    plan = new[0].plan()
    check_resume_exactly_once(n, completed, [[r] for r in rest], plan, False)
    partial = set(yielded) - set(completed)  # yielded, but its step never completed
    assert partial and partial <= {i for r in rest for i in r}


def test_same_world_resume_is_unchanged_and_byte_identical():
    sizes = _sizes(300)

    def make():
        return DistributedSampler(Sized(sizes), 4, 1, batch_size=32, kind="guided")

    full = make()
    full.set_epoch(2)
    expected = list(full)
    first = make()
    first.set_epoch(2)
    head = _take(first, 19)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert len(resumed) == len(expected)
    assert head + list(resumed) == expected
    # States of the per-adapter formats before the common one (versions 1 and 2) are
    # refused by name rather than misread.
    with pytest.raises(ValueError, match="state version 2 is not supported"):
        make().load_state_dict({**first.state_dict(), "version": 2})


def test_chain_of_worlds_within_one_epoch():
    n, epoch = 257, 4
    sizes = _sizes(n)
    a = _batch_samplers(sizes, 4, 16, kind="guided")
    consumed = []
    for s in a:
        s.set_epoch(epoch)
        consumed += [i for batch in _take(s, 3) for i in batch]
    b = _batch_samplers(sizes, 2, 10, kind="guided")
    running = []
    for s in b:
        s.load_state_dict(a[3].state_dict())
        running.append(iter(s))
        consumed += [i for _ in range(4) for i in next(running[-1])]
    states = [s.state_dict() for s in b]
    state = states[0]
    assert state["history"] == [[4, 16, 3]] and state["step"] == 4
    # Resuming the resumed epoch at its own world continues it byte for byte.
    same = _batch_samplers(sizes, 2, 10, kind="guided")
    for s, saved, it in zip(same, states, running, strict=True):
        s.load_state_dict(saved)
        assert list(s) == list(it)
    c = _batch_samplers(sizes, 5, 15, kind="guided")
    for s in c:
        s.load_state_dict(state)
    assert c[0].state_dict()["history"] == [[4, 16, 3], [2, 10, 4]]
    rest = [list(s) for s in c]
    check_resume_exactly_once(n, consumed, rest, c[0].plan(), False)


def test_epoch_boundaries_resume_at_any_world_for_every_policy():
    sizes = _sizes(120)
    kw = dict(shuffle="local", groups=[0, 0, 1, 1])
    old = _batch_samplers(sizes, 4, 8, **kw)
    for s in old:
        s.set_epoch(1)
    before = old[0].state_dict()
    for s in old:
        list(s)
    after = old[0].state_dict()
    new = DistributedBatchSampler(Sized(sizes), 6, num_replicas=3, rank=0, shuffle="local")
    new.load_state_dict(before)  # nothing trained: the ordinary epoch at the new world
    assert list(new) == [p.tolist() for p in new.scheduler.plan_epoch(1).rank_steps(0)]
    new.load_state_dict(after)  # finished: nothing left, then the ordinary next epoch
    assert len(new) == 0 and list(new) == []
    new.set_epoch(2)
    assert len(list(new)) == new.scheduler.num_steps() > 0


def test_set_epoch_resets_the_saved_progress():
    sampler = DistributedSampler(range(40), 2, 0, batch_size=4)
    list(sampler)
    sampler.set_epoch(1)
    state = sampler.state_dict()
    assert (state["epoch"], state["step"], state["offset"]) == (1, 0, 0)
    other = DistributedSampler(range(40), 2, 0, batch_size=4)
    other.load_state_dict(state)
    assert len(list(other)) == 20


def _mid_epoch_state(sizes, **kw):
    sampler = DistributedBatchSampler(Sized(sizes), 8, num_replicas=2, rank=0, **kw)
    _take(sampler, 2)
    return sampler.state_dict()


def test_other_arguments_are_refused_in_the_samplers_words():
    state = _mid_epoch_state(_sizes(64))
    new = DistributedBatchSampler(Sized(_sizes(64)), 12, num_replicas=3, rank=0, seed=1)
    with pytest.raises(ValueError, match="digest differs: seed: saved 0, now 1") as error:
        new.load_state_dict(state)
    assert "state was saved with different sizes or sampler arguments" in str(error.value)
    assert "only num_replicas and batch_size may change" in str(error.value)
