"""Elastic resume of chronica.jax.iterator: a state saved at W processes continues the epoch at
W' processes (and another global batch size), exactly as chronica.torch's samplers do.

Every rank of a world is an iterator built in this process with explicit ``num_replicas`` and
``rank`` arguments, as in test_jax.py. The elastic maths and its refusals are tested on core
objects in tests/core/test_elastic.py; these tests check the face: what the iterator yields
(shapes, masks, loss weights), its length, its messages, and parity with the torch samplers."""

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
tud = pytest.importorskip("chronica.torch.utils.data")

from elastic_checks import check_resume_exactly_once  # noqa: E402

import chronica.jax as cj  # noqa: E402
from chronica.core import Scheduler  # noqa: E402
from chronica.core.elastic import Segment, resume_plan  # noqa: E402

N, W, B = 203, 4, 16
BOUNDARIES = (4, 8, 16, 32, 64, 128, 256, 1024)


def _data(n=N, seed=0):
    lengths = np.random.default_rng(seed).lognormal(3, 1, n).astype(int) + 1
    return [np.arange(1, k + 1, dtype=np.int32) for k in lengths], lengths


def _iterators(data, w, b, epochs=2, **kw):
    return [
        cj.iterator(
            data,
            global_batch_size=b,
            num_replicas=w,
            rank=r,
            epochs=epochs,
            bucket_boundaries=BOUNDARIES,
            pad_value=-1,
            **kw,
        )
        for r in range(w)
    ]


def _samplers(data, w, b, **kw):
    lengths = np.array([len(x) for x in data])
    return [
        tud.DistributedBatchSampler(data, b, num_replicas=w, rank=r, sizes=lengths, **kw)
        for r in range(w)
    ]


def _valid(batch):
    return batch["indices"][batch["valid"]].tolist()


def _train(iterators, steps):
    """``steps`` batches of every rank: their real indices, rank after rank."""
    return [[_valid(next(it)) for _ in range(steps)] for it in iterators]


def _resume(data, state, w, b, **kw):
    iterators = _iterators(data, w, b, **kw)
    for it in iterators:
        it.set_state(json.loads(json.dumps(state)))  # states are plain JSON
    return iterators


def _remainder(iterators):
    """The resumed epoch's batches of every rank (``steps_per_epoch`` of them), checked for
    the iterator's usual static shapes, masks, valid rows and loss weights."""
    plan = iterators[0].plan()
    out = []
    for it in iterators:
        assert it.plan().indices.tobytes() == plan.indices.tobytes()
        assert len(it) == it.steps_per_epoch == plan.num_steps
        batches = [next(it) for _ in range(plan.num_steps)]
        for step, batch in enumerate(batches):
            real = plan.local(step, it.rank)
            assert batch["inputs"].shape[0] == it.rows
            assert batch["inputs"].shape[1] in BOUNDARIES
            assert batch["valid"].sum() == real.shape[0]
            np.testing.assert_array_equal(batch["indices"][: real.shape[0]], real)
            assert (batch["indices"][real.shape[0] :] == -1).all()
            np.testing.assert_array_equal(batch["mask"].sum(axis=1), batch["lengths"])
            assert batch["loss_weight"] == np.float32(plan.loss_weights[step, it.rank])
        out.append([_valid(batch) for batch in batches])
    return out


def _flat(per_rank):
    return [i for steps in per_rank for batch in steps for i in batch]


CASES = [
    # w2, b2, steps, options
    (2, 16, 5, dict()),  # fewer ranks, same global batch
    (3, 12, 5, dict()),  # fewer ranks, another batch
    (2, 10, 3, dict(drop_last=True)),
    (3, 9, 7, dict(shuffle=False)),
    (3, 24, 4, dict(shuffle="block", kind="guided")),
    (2, 8, 6, dict(exact=False, seed=3)),  # pool balancing
    (6, 24, 2, dict(kind="guided", drop_last=True)),  # more ranks
]


@pytest.mark.parametrize("w2,b2,steps,kw", CASES)
def test_remainder_covers_the_epoch_exactly_once_and_matches_torch(w2, b2, steps, kw):
    data, _ = _data()
    old = _iterators(data, W, B, **kw)
    trained = _train(old, steps)
    states = [it.get_state() for it in old]
    assert {(s["epoch"], s["step"], s["num_replicas"], s["batch_size"]) for s in states} == {
        (0, steps, W, B)
    }
    new = _resume(data, states[-1], w2, b2, **kw)
    plan = new[0].plan()
    # Any rank's state gives every new rank the same remainder.
    for state in states[:-1]:
        other = _resume(data, state, w2, b2, **kw)[0]
        assert other.plan().indices.tobytes() == plan.indices.tobytes()
    rest = _remainder(new)
    check_resume_exactly_once(N, _flat(trained), rest, plan, kw.get("drop_last", False))
    assert len({len(r) for r in rest}) == 1  # equal step counts on every rank
    # Cross-adapter parity: the torch samplers resumed from the same point yield the same
    # indices at every step of the remainder, on every rank.
    torch_old = _samplers(data, W, B, **kw)
    for sampler, ours in zip(torch_old, trained, strict=True):
        it = iter(sampler)
        assert [next(it) for _ in range(steps)] == ours
    torch_new = _samplers(data, w2, b2, **kw)
    for sampler, ours in zip(torch_new, rest, strict=True):
        sampler.load_state_dict(torch_old[0].state_dict())
        assert len(sampler) == len(ours)
        assert list(sampler) == ours
    # The core's plan of the remainder is what both adapters follow.
    core = Scheduler(new[0].scheduler.sizes, new[0].scheduler.config)
    expected = resume_plan(core, 0, [Segment(W, B, steps)])
    assert expected.indices.tobytes() == plan.indices.tobytes()
    # The next epoch is the ordinary one at the new world.
    fresh = _iterators(data, w2, b2, **kw)
    for resumed, other in zip(new, fresh, strict=True):
        assert resumed.epoch == 1 and len(resumed) == len(other)
        assert resumed.plan(1) is resumed.scheduler.plan_epoch(1)
        _train([other], len(other))
        assert [_valid(b) for b in resumed] == [_valid(b) for b in other]
        with pytest.raises(StopIteration):
            next(resumed)


def test_chain_of_worlds_4_2_3():
    data, _ = _data(257)
    kw = dict(kind="guided")
    a = _iterators(data, 4, 16, **kw)
    trained = _train(a, 3)
    b = _resume(data, a[3].get_state(), 2, 10, **kw)
    trained += _train(b, 4)
    states = [it.get_state() for it in b]
    assert states[0]["history"] == [[4, 16, 3]] and states[0]["step"] == 4
    # The resumed epoch saved at its own world continues byte for byte.
    for it, state in zip(b, states, strict=True):
        again = _iterators(data, 2, 10, **kw)[it.rank]
        again.set_state(state)
        assert again.plan().indices.tobytes() == it.plan().indices.tobytes()
        _same_batches(again, it, again.steps_per_epoch - 4)
    c = _resume(data, states[1], 3, 12, **kw)
    assert c[0].get_state()["history"] == [[4, 16, 3], [2, 10, 4]]
    rest = _remainder(c)
    check_resume_exactly_once(257, _flat(trained), rest, c[0].plan(), False)
    # The torch samplers chained through the same worlds yield the same batches.
    ta = _samplers(data, 4, 16, **kw)
    for s, ours in zip(ta, trained[:4], strict=True):
        it = iter(s)
        assert [next(it) for _ in range(3)] == ours
    tb = _samplers(data, 2, 10, **kw)
    for s, ours in zip(tb, trained[4:], strict=True):
        s.load_state_dict(ta[0].state_dict())
        it = iter(s)
        assert [next(it) for _ in range(4)] == ours
    for s, ours in zip(_samplers(data, 3, 12, **kw), rest, strict=True):
        s.load_state_dict(tb[0].state_dict())
        assert list(s) == ours


def _same_batches(a, b, steps):
    for _ in range(steps):
        x, y = next(a), next(b)
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
            assert np.asarray(x[key]).dtype == np.asarray(y[key]).dtype


def test_same_world_resume_is_unchanged_and_byte_identical():
    data, _ = _data(150)

    def make():
        return _iterators(data, 2, 8, epochs=2, seed=5)[1]

    full, first = make(), make()
    for _ in range(23):
        next(first)
        next(full)
    state = first.get_state()
    assert (state["epoch"], state["step"], state["history"]) == (1, 23 - len(full), [])
    resumed = make()
    resumed.set_state(state)
    assert len(resumed) == len(full) and resumed.epoch == full.epoch == 1
    _same_batches(resumed, full, 2 * len(full) - 23)
    # The state is rank-independent: another rank's state resumes this rank's next step.
    assert "rank" not in state
    other = _iterators(data, 2, 8, epochs=2, seed=5)[0]
    other.set_state(state)
    plan = other.scheduler.plan_epoch(1)
    assert _valid(next(other)) == plan.local(23 - len(full), 0).tolist()
    # States of the iterator's earlier formats (1, 2) are refused by version.
    for version in (1, 2):
        with pytest.raises(ValueError, match=f"state version {version} is not supported"):
            make().set_state({**state, "version": version})


def test_epoch_boundaries_load_at_any_world():
    data, _ = _data(120)
    kw = dict(shuffle="local")
    old = _iterators(data, 4, 8, epochs=3, **kw)
    before = old[0].get_state()
    _train(old, old[0].steps_per_epoch)
    after = old[0].get_state()  # after the epoch's last batch: (0, its steps)
    assert (after["epoch"], after["step"], after["history"]) == (0, len(old[0]), [])
    assert old[0].epoch == 1
    for state, epoch in ((before, 0), (after, 1)):
        new = _iterators(data, 3, 6, epochs=3, **kw)[2]
        new.set_state(state)
        plan = new.scheduler.plan_epoch(epoch)
        assert new.epoch == epoch and len(new) == plan.num_steps
        assert [_valid(next(new)) for _ in range(len(new))] == [
            p.tolist() for p in plan.rank_steps(2)
        ]


def test_steps_per_epoch_follows_the_remainder_then_the_ordinary_epoch():
    data, _ = _data(100)
    old = _iterators(data, 4, 16, epochs=None)
    _train(old, 3)
    new = _resume(data, old[0].get_state(), 2, 6, epochs=None)[0]
    remainder = new.plan()
    ordinary = new.scheduler.num_steps()
    assert remainder.num_steps != ordinary and len(new) == remainder.num_steps
    for _ in range(remainder.num_steps - 1):
        next(new)
    assert new.epoch == 0 and len(new) == remainder.num_steps
    mid = new.get_state()
    assert mid["history"] == [[4, 16, 3]]
    next(new)  # the remainder's last batch: the next one is the next epoch's first
    assert new.epoch == 1 and len(new) == ordinary
    end = new.get_state()  # the remainder's end: its steps, the history kept
    assert (end["epoch"], end["step"], end["history"]) == (0, remainder.num_steps, [[4, 16, 3]])
    assert _valid(next(new)) == new.scheduler.plan_epoch(1).local(0, 0).tolist()
    assert new.get_state()["history"] == [] and new.get_state()["epoch"] == 1
    assert new.plan() is new.scheduler.plan_epoch(1)
    # A state saved one batch before the remainder's end resumes at that world too.
    again = _iterators(data, 2, 6, epochs=None)[0]
    again.set_state(mid)
    assert _valid(next(again)) == remainder.local(remainder.num_steps - 1, 0).tolist()
    assert again.epoch == 1
    at_end = _iterators(data, 3, 6, epochs=None)[2]  # the end loads at any world too
    at_end.set_state(end)
    assert at_end.epoch == 1 and len(at_end) == at_end.scheduler.num_steps()
    assert _valid(next(at_end)) == at_end.scheduler.plan_epoch(1).local(0, 2).tolist()


def _mid_epoch_state(data, **kw):
    it = _iterators(data, 2, 8, **kw)[0]
    _train([it], 2)
    return it.get_state()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(seed=1), "configuration digest differs: seed: saved 0, now 1"),
        (dict(n=65), "num_samples: saved 64, now 65"),
        (dict(drop_last=True), "drop_last: saved False, now True"),
        (dict(kind="guided"), "kind: saved 'static', now 'guided'"),
    ],
)
def test_other_data_or_arguments_are_refused_by_name(change, match):
    data, _ = _data(64)
    state = _mid_epoch_state(data)
    n = change.pop("n", 64)
    kw = dict(global_batch_size=12, num_replicas=3, rank=0, bucket_boundaries=BOUNDARIES)
    new = cj.iterator(_data(n)[0], **kw, **change)
    with pytest.raises(ValueError, match=match) as error:
        new.set_state(state)
    assert "state was saved with different sizes or iterator arguments" in str(error.value)
    assert "only num_replicas and global_batch_size may change" in str(error.value)


def test_buckets_and_padding_are_not_part_of_the_state():
    # They shape the batches, not the plan: a state resumes under other ones, at any world.
    data, _ = _data(64)
    state = _mid_epoch_state(data)
    for w, b in ((2, 8), (3, 12)):
        new = cj.iterator(
            data,
            global_batch_size=b,
            num_replicas=w,
            rank=0,
            bucket_boundaries=(2048,),
            pad_value=7,
        )
        new.set_state(state)
        batch = next(new)
        assert batch["inputs"].shape[1] == 2048
        assert _valid(batch) == new.plan().local(0 if w == 3 else 2, 0).tolist()


@pytest.mark.parametrize(
    "kw,match",
    [(dict(shuffle="local"), r"shuffle='local' cannot continue an epoch.*Resume at")],
)
def test_mid_epoch_refusals_and_the_saved_world(kw, match):
    data, _ = _data(64)
    state = _mid_epoch_state(data, **kw)
    for w, b in ((3, 12), (2, 16)):  # another world; the same world with another batch
        new = _iterators(data, w, b, **kw)[0]
        with pytest.raises(ValueError, match=match):
            new.set_state(state)
    same = _iterators(data, 2, 8, **kw)[0]
    same.set_state(state)  # the saved world still resumes
    assert same.get_state() == state
    boundary = _iterators(data, 3, 12, **kw)[0]
    boundary.set_state({**state, "step": 0})  # nothing trained: the ordinary epoch
    assert len(boundary) == boundary.scheduler.num_steps()


@pytest.mark.parametrize("kw", [dict(), dict(kind="guided", drop_last=True, seed=3)])
def test_torch_sampler_state_resumes_in_jax_and_back(kw):
    # One state format for every adapter: a DistributedBatchSampler's mid-epoch state makes
    # the JAX iterator yield exactly the batches the sampler would have yielded next, and
    # the reverse, on every rank.
    data, _ = _data()
    for rank in range(W):
        sampler = _samplers(data, W, B, **kw)[rank]
        sampler.set_epoch(1)
        batches = iter(sampler)
        for _ in range(5):
            next(batches)
        state = json.loads(json.dumps(sampler.state_dict()))
        torch_next = list(batches)
        it = _iterators(data, W, B, **kw)[rank]
        it.set_state(state)
        assert it.epoch == 1 and it.get_state() == state
        assert [_valid(next(it)) for _ in range(len(torch_next))] == torch_next
        with pytest.raises(StopIteration):
            next(it)  # epochs=2: epoch 1 was the last
        # The reverse: the JAX iterator's state resumes the torch sampler.
        it = _iterators(data, W, B, **kw)[rank]
        for _ in range(len(it) + 3):  # into epoch 1
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        jax_next = [_valid(batch) for batch in it]
        other = _samplers(data, W, B, **kw)[rank]
        other.load_state_dict(state)
        other.set_epoch(state["epoch"])  # a training loop's call keeps the position
        assert (state["epoch"], state["step"]) == (1, 3) and list(other) == jax_next


def test_torch_sample_level_state_mid_step_resumes_the_rest_of_that_step():
    # A DistributedSampler hands out samples one by one, so its state may stop mid-step:
    # the JAX iterator then yields the rest of that step, then the following ones.
    data, lengths = _data()
    for rank in range(W):
        sampler = tud.DistributedSampler(data, W, rank, batch_size=B, sizes=lengths)
        indices = iter(sampler)
        for _ in range(3 * B // W + 2):  # 3 steps and 2 samples of the 4th
            next(indices)
        state = json.loads(json.dumps(sampler.state_dict()))
        assert (state["step"], state["offset"]) == (3, 2)
        it = _iterators(data, W, B)[rank]
        it.set_state(state)
        first = next(it)
        assert first["valid"].sum() == B // W - 2
        rest = [_valid(first)] + [_valid(next(it)) for _ in range(len(it) - 4)]
        assert [i for batch in rest for i in batch] == list(indices)
        assert it.epoch == 1
