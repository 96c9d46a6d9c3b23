"""chronica.core.elastic on core objects alone (Scheduler + ScheduleConfig, no framework):
the rest of an epoch at another world or batch size covers it exactly once, states round
trip through ``state_fields``/``load_state``, and what cannot be resumed is refused by name.

The adapters' own tests (tests/adapters/torch/test_torch_elastic.py, tests/adapters/jax) check
only that their faces resume through their own API; the maths is checked here."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from elastic_checks import check_resume_exactly_once
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.elastic import (
    Resumption,
    Segment,
    StateFormat,
    check_elastic,
    check_fingerprint,
    fingerprint,
    load_state,
    parse_segments,
    remaining_samples,
    resume_plan,
    state_fields,
)

MODES = [("static", True), ("static", False), ("guided", True)]
VERSION = 3
NAMES = StateFormat(
    versions=(VERSION,), name="state", owner="sampler", position="step", batch="global_batch_size"
)


def _sizes(n):
    return np.random.default_rng(n).lognormal(3, 1, n)


def _scheduler(n, world, batch, sizes=None, **kw):
    return Scheduler(_sizes(n) if sizes is None else sizes, ScheduleConfig(world, batch, **kw))


def _state(scheduler, epoch, step, history=()):
    """What a face saves after ``step`` completed steps of ``epoch`` (``history``: the
    worlds the epoch ran at before)."""
    return {
        "version": VERSION,
        "epoch": epoch,
        "digest": scheduler.digest,
        **state_fields(scheduler, history, step),
    }


def _trained(plan, step):
    """The samples of ``plan``'s first ``step`` steps, every rank together."""
    return plan.indices[: plan.bounds[step, 0]] if step < plan.num_steps else plan.indices


CASES = [
    # n, w, b, w2, b2, steps, drop_last, shuffle, (kind, exact)
    (211, 4, 16, 6, 24, 5, False, True, MODES[0]),  # W' > W
    (211, 4, 16, 3, 12, 5, True, True, MODES[0]),  # W' < W, drop_last
    (211, 4, 16, 2, 16, 7, False, "stratified", MODES[0]),  # same B, fewer ranks
    (97, 3, 9, 5, 10, 4, False, False, MODES[0]),  # no shuffle, N prime
    (97, 3, 9, 7, 7, 2, True, "block", MODES[0]),
    (301, 5, 20, 4, 32, 6, False, True, MODES[1]),  # pool
    (301, 5, 20, 8, 8, 3, True, True, MODES[1]),
    (301, 4, 32, 3, 24, 4, False, True, MODES[2]),  # guided
    (301, 4, 32, 6, 36, 9, True, True, MODES[2]),  # guided, all but the last step
    (13, 4, 8, 6, 6, 1, False, True, MODES[0]),  # tiny: remainder smaller than the world
]


@pytest.mark.parametrize("n,w,b,w2,b2,steps,drop_last,shuffle,mode", CASES)
def test_the_rest_of_the_epoch_at_another_world_covers_it_exactly_once(
    n, w, b, w2, b2, steps, drop_last, shuffle, mode
):
    kw = dict(drop_last=drop_last, shuffle=shuffle, kind=mode[0], exact=mode[1])
    labels = np.arange(n) % 3 if shuffle == "stratified" else None
    old = Scheduler(_sizes(n), ScheduleConfig(w, b, **kw), labels=labels)
    new = Scheduler(_sizes(n), ScheduleConfig(w2, b2, **kw), labels=labels)
    epoch = 1
    plan = resume_plan(new, epoch, [Segment(w, b, steps)])
    assert plan is not None and plan.epoch == epoch and plan.num_replicas == w2
    rest = [plan.rank_steps(r) for r in range(w2)]
    check_resume_exactly_once(
        n, _trained(old.plan_epoch(epoch), steps).tolist(), rest, plan, drop_last
    )
    # Equal local batches on every rank at every step, global batch B' but the last.
    assert np.all(plan.counts == plan.counts[:, :1])
    sums = plan.counts.sum(axis=1)
    assert np.all(sums[:-1] == b2) and (sums.size == 0 or 0 < sums[-1] <= b2)
    np.testing.assert_array_equal(plan.loss_weights, np.ones((plan.num_steps, w2)))
    # The remainder's samples, in training order, are what the plan is made of.
    left = remaining_samples(new, epoch, [Segment(w, b, steps)])
    assert len(left) == len(set(left.tolist()))  # each sample once
    assert set(plan.indices.tolist()) <= set(left.tolist())
    assert len(left) - len(set(plan.indices.tolist())) == plan.num_dropped


def test_the_remainder_is_byte_identical_for_every_rank_and_after_a_restart():
    segments = [Segment(3, 12, 4)]
    plans = [resume_plan(_scheduler(150, 5, 10), 0, segments) for _ in range(3)]
    assert len({p.indices.tobytes() + p.bounds.tobytes() for p in plans}) == 1


def test_exact_mode_keeps_the_global_batches_of_the_new_world():
    # 6 steps of 16 = 96 samples trained, a multiple of B' = 24: the remainder's full global
    # batches are those an uninterrupted (W', B') run forms at the same positions.
    n, epoch = 400, 3
    new = _scheduler(n, 6, 24)
    plan = resume_plan(new, epoch, [Segment(4, 16, 6)])
    fresh = new.plan_epoch(epoch)
    offset = 96 // 24
    for s in range(plan.num_steps - 1):  # the tail pads differently
        ours = plan.indices[plan.bounds[s, 0] : plan.bounds[s, -1]]
        theirs = fresh.indices[fresh.bounds[offset + s, 0] : fresh.bounds[offset + s, -1]]
        np.testing.assert_array_equal(ours, theirs)  # same samples, same balanced split
    assert plan.num_steps > 10


def test_nothing_trained_is_the_ordinary_epoch_and_a_finished_epoch_leaves_nothing():
    new = _scheduler(120, 3, 6, shuffle="local", groups=[0, 0, 1])
    assert resume_plan(new, 1, [Segment(4, 8, 0)]) is None
    done = resume_plan(new, 1, [Segment(4, 8, _scheduler(120, 4, 8).num_steps(1))])
    assert done is not None and done.num_steps == 0 and done.indices.shape == (0,)


ROWS = Packing(64, row_length=32)  # every document below fits a row: one piece each


@pytest.mark.parametrize(
    ("w", "b", "w2", "b2", "packing"),
    [
        (3, 12, 2, 12, ROWS),  # documents per step
        (2, None, 4, None, Packing(64, row_length=32, tokens_per_step=400)),  # a token budget
    ],
)
def test_a_packed_epoch_continues_at_another_world_with_every_document_once(w, b, w2, b2, packing):
    sizes = np.clip(np.random.default_rng(0).lognormal(3, 1, 200).astype(int), 1, 32)
    old = Scheduler(sizes, ScheduleConfig(w, b, packing=packing))
    new = Scheduler(sizes, ScheduleConfig(w2, b2, packing=packing))
    state = _state(old, 0, 3)
    resumed = load_state(json.loads(json.dumps(state)), new, new.digest, NAMES)
    plan = resumed.plan
    assert plan.micro is not None and resumed.history == (Segment(w, b, 3),)
    rest = [[plan.indices.tolist()]]
    check_resume_exactly_once(200, _trained(old.plan_epoch(0), 3).tolist(), rest, plan, False)


def test_a_packed_state_whose_batch_is_no_multiple_of_the_world_resumes_at_another():
    sizes = np.clip(np.random.default_rng(0).lognormal(3, 1, 200).astype(int), 1, 32)
    old = Scheduler(sizes, ScheduleConfig(3, 10, packing=ROWS))
    new = Scheduler(sizes, ScheduleConfig(2, 10, packing=ROWS))
    resumed = load_state(_state(old, 0, 2), new, new.digest, NAMES)
    assert resumed.plan is not None


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(0, 80),
    worlds=st.lists(
        st.tuples(st.integers(1, 5), st.integers(1, 4), st.floats(0, 1)), min_size=2, max_size=3
    ),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([True, False, "block"]),
    mode=st.sampled_from(MODES),
    epoch=st.integers(0, 3),
)
def test_property_exactly_once_over_a_chain_of_worlds(n, worlds, drop_last, shuffle, mode, epoch):
    """Train a fraction of the epoch at each world in turn, then finish it at the last one."""
    sizes = _sizes(n)
    kw = dict(shuffle=shuffle, drop_last=drop_last, kind=mode[0], exact=mode[1])
    w, k, _ = worlds[0]
    plan = Scheduler(sizes, ScheduleConfig(w, w * k, **kw)).plan_epoch(epoch)
    segments, parts = [], []
    for (w, k, fraction), (w2, k2, _) in itertools.pairwise(worlds):
        counts = plan.counts
        assert np.all(counts == counts[:, :1])  # equal local batches and step counts
        step = round(fraction * plan.num_steps)
        parts.append(_trained(plan, step))
        if step == plan.num_steps and (step or segments):  # finished: nothing is left
            break
        segments.append(Segment(w, w * k, step))
        new = Scheduler(sizes, ScheduleConfig(w2, w2 * k2, **kw))
        rest = resume_plan(new, epoch, segments)
        again = resume_plan(new, epoch, segments)
        assert rest is again is None or rest.indices.tobytes() == again.indices.tobytes()
        if rest is None:  # nothing trained yet: the ordinary epoch, no history
            assert segments == [Segment(w, w * k, 0)]
            rest, segments = new.plan_epoch(epoch), []
        plan = rest
    else:
        assert np.all(plan.counts == plan.counts[:, :1])
        parts.append(plan.indices)
        assert len(parts[-1]) - len(set(parts[-1].tolist())) == plan.num_padded
    seen = [set(part.tolist()) for part in parts]
    assert sum(len(part) for part in seen) == len(set().union(*seen))  # disjoint
    assert len(set().union(*seen)) == n - plan.num_dropped
    assert drop_last or plan.num_dropped == 0


# -- states ------------------------------------------------------------------------------


def test_a_state_at_the_same_world_resumes_its_position_after_a_json_round_trip():
    scheduler = _scheduler(203, 4, 16, kind="guided")
    state = json.loads(json.dumps(_state(scheduler, 2, 5)))
    resumed = load_state(state, scheduler, scheduler.digest, NAMES)
    assert resumed == Resumption(2, (), None, 5, True)


def test_a_state_at_another_world_plans_the_remainder_from_its_start():
    old, new = _scheduler(203, 4, 16), _scheduler(203, 3, 12)
    state = json.loads(json.dumps(_state(old, 1, 5)))
    assert state["fingerprint"] == fingerprint(new)  # only the world differs
    resumed = load_state(state, new, new.digest, NAMES)
    assert (resumed.epoch, resumed.history, resumed.position) == (1, (Segment(4, 16, 5),), 0)
    assert not resumed.same_world
    expected = resume_plan(new, 1, [Segment(4, 16, 5)])
    assert resumed.plan.indices.tobytes() == expected.indices.tobytes()
    assert resumed.plan.bounds.tobytes() == expected.bounds.tobytes()


def test_a_resumed_epoch_saves_its_history_and_resumes_again_at_its_own_or_a_third_world():
    a, b, c = _scheduler(257, 4, 16), _scheduler(257, 2, 10), _scheduler(257, 5, 15)
    first = load_state(_state(a, 4, 3), b, b.digest, NAMES)
    saved = _state(b, 4, 4, first.history)
    assert saved["history"] == [[4, 16, 3]] and saved["step"] == 4
    again = load_state(json.loads(json.dumps(saved)), b, b.digest, NAMES)
    assert (again.history, again.position, again.same_world) == (first.history, 4, True)
    assert again.plan.indices.tobytes() == first.plan.indices.tobytes()
    chained = load_state(saved, c, c.digest, NAMES)
    assert chained.history == (Segment(4, 16, 3), Segment(2, 10, 4))
    trained = [*_trained(a.plan_epoch(4), 3).tolist(), *_trained(first.plan, 4).tolist()]
    rest = [chained.plan.rank_steps(r) for r in range(5)]
    check_resume_exactly_once(257, trained, rest, chained.plan, False)


def test_a_state_at_an_epoch_boundary_loads_at_any_world_for_every_policy():
    kw = dict(shuffle="local")
    old = _scheduler(120, 4, 8, groups=[0, 0, 1, 1], **kw)
    new = _scheduler(120, 3, 6, **kw)
    before = load_state(_state(old, 1, 0), new, new.digest, NAMES)
    assert (before.epoch, before.plan, before.position) == (1, None, 0)
    after = load_state(_state(old, 1, old.num_steps(1)), new, new.digest, NAMES)
    assert after.plan is not None and after.plan.num_steps == 0


def test_the_fingerprint_is_everything_but_the_world():
    a, b = _scheduler(64, 2, 8, seed=3), _scheduler(64, 4, 32, seed=3)
    assert fingerprint(a) == fingerprint(b) and a.digest != b.digest
    assert fingerprint(a)["num_samples"] == 64
    assert not {"num_replicas", "batch_size", "groups", "dynamic"} & set(fingerprint(a))
    json.dumps(fingerprint(a))  # JSON-ready
    check_fingerprint(fingerprint(a), b)


# -- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(seed=1), "configuration digest differs: seed: saved 0, now 1"),
        (dict(sizes=np.ones(64)), "digest differs: sizes"),
        (dict(n=65), "num_samples: saved 64, now 65"),
        (dict(drop_last=True), "drop_last: saved False, now True"),
        (dict(kind="guided"), "kind: saved"),
    ],
)
def test_other_data_or_arguments_are_refused_naming_the_field(change, match):
    state = _state(_scheduler(64, 2, 8), 0, 2)
    n = change.pop("n", 64)
    new = _scheduler(n, 3, 12, sizes=change.pop("sizes", None), **change)
    with pytest.raises(ValueError, match=match) as error:
        load_state(state, new, new.digest, NAMES)
    message = str(error.value)
    assert "state was saved with different sizes or sampler arguments" in message
    assert "only num_replicas and global_batch_size may change" in message


def test_a_state_without_fingerprint_or_with_a_bad_one_is_refused():
    old, new = _scheduler(64, 2, 8), _scheduler(64, 3, 12)
    state = _state(old, 0, 2)
    del state["fingerprint"]
    with pytest.raises(ValueError, match="another configuration digest and no fingerprint"):
        load_state(state, new, new.digest, NAMES)
    with pytest.raises(ValueError, match="fingerprint must be a mapping, got list"):
        load_state({**_state(old, 0, 2), "fingerprint": []}, new, new.digest, NAMES)


def test_the_same_world_under_another_digest_is_refused():
    # The same world and batch size, but the node map (groups=) differs: not a resume.
    old = _scheduler(64, 2, 8, groups=[0, 1])
    new = _scheduler(64, 2, 8)
    with pytest.raises(ValueError, match="digest differs in groups= or the kind='dynamic'"):
        load_state(_state(old, 0, 2), new, new.digest, NAMES)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("version", 2, "state version 2 is not supported"),
        ("version", None, "state version None is not supported"),
        ("epoch", -1, r"state epoch=-1, step=2 are invalid"),
        ("step", True, r"state epoch=0, step=True are invalid"),
        ("step", 99, "state step=99 is outside the epoch's 8 steps at 2 ranks with batch 8"),
        ("history", [[3, 5, 1]], r"saved world cannot be planned: batch_size=5 .* multiple"),
        ("history", [[3, 6]], r"state history entry \[3, 6\] is not \[num_replicas"),
        ("history", {"a": 1}, "state history must be a list, got dict"),
        ("num_replicas", 0, "state segment num_replicas=0"),
    ],
)
def test_bad_state_fields_are_refused_naming_the_field(field, value, match):
    old, new = _scheduler(64, 2, 8), _scheduler(64, 3, 12)
    with pytest.raises(ValueError, match=match):
        load_state({**_state(old, 0, 2), field: value}, new, new.digest, NAMES)


def test_a_state_that_is_not_a_dict_is_refused():
    new = _scheduler(64, 3, 12)
    with pytest.raises(ValueError, match="state version None is not supported"):
        load_state([("version", VERSION)], new, new.digest, NAMES)


def test_a_node_partitioned_shuffle_refuses_a_new_world_mid_epoch_but_resumes_the_saved_one():
    old = _scheduler(64, 2, 8, shuffle="local")
    state = _state(old, 0, 2)
    for world, batch in ((3, 12), (2, 16)):  # another world; the same world, another batch
        new = _scheduler(64, world, batch, shuffle="local")
        with pytest.raises(
            ValueError,
            match=r"shuffle='local' cannot continue an epoch.*\(2 ranks, batch 8\).*epoch boundary",
        ):
            load_state(state, new, new.digest, NAMES)
    assert load_state(state, old, old.digest, NAMES) == Resumption(0, (), None, 2, True)


def test_kind_dynamic_refuses_a_new_world_mid_epoch():
    kw = dict(kind="dynamic", window=4)
    old, new = _scheduler(64, 2, 8, **kw), _scheduler(64, 3, 12, **kw)
    with pytest.raises(ValueError, match="kind='dynamic' cannot continue an epoch"):
        load_state(_state(old, 0, 2), new, new.digest, NAMES)
    assert load_state(_state(old, 0, 0), new, new.digest, NAMES).plan is None  # a boundary
    with pytest.raises(ValueError, match="kind='dynamic' cannot continue"):
        check_elastic(new.config)
    check_elastic(_scheduler(64, 3, 12).config)  # static, global shuffle: fine


def test_segments_are_validated_and_a_resume_needs_one():
    assert parse_segments([[4, 16, 3], (2, None, 0)]) == [Segment(4, 16, 3), Segment(2, None, 0)]
    scheduler = _scheduler(64, 3, 12)
    for call in (resume_plan, remaining_samples):
        with pytest.raises(ValueError, match="needs at least one saved segment"):
            call(scheduler, 0, [])
    with pytest.raises(ValueError, match="state step=9 is outside"):
        resume_plan(scheduler, 0, [Segment(2, 8, 9)])
    with pytest.raises(ValueError, match=r"num_replicas=2, batch_size=0, step=1 is invalid"):
        resume_plan(scheduler, 0, [Segment(2, 0, 1)])
    # A batch that does not fit the saved world is the configuration's to refuse.
    with pytest.raises(ValueError, match=r"saved world cannot be planned: batch_size=7"):
        resume_plan(scheduler, 0, [Segment(2, 7, 1)])
