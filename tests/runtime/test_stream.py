"""chronica.runtime.stream without any framework: RankStream's position and its one state
format (mid-epoch resume byte for byte in a fresh stream, set_epoch and rewind, elastic
resume, refusals), and dynamic jobs of two ranks over a real coordinator."""

import json
import threading
from collections import Counter

import msgpack
import numpy as np
import pytest
from attacks import attack
from kv_store import LocalStore
from workers import free_ports, scaled

from chronica.comm.coordinator import Coordinator
from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.elastic import Segment, resume_plan
from chronica.runtime import STATE_VERSION, DynamicOptions, KeyValueAgreement, RankStream
from chronica.runtime.micro import planned_micro_batches
from chronica.runtime.stream import state_format


def _sizes(n=203, seed=0):
    return np.random.default_rng(seed).lognormal(3, 1, n).astype(int) + 1


def _streams(world=4, batch=16, n=203, **config):
    scheduler = Scheduler(_sizes(n), ScheduleConfig(num_replicas=world, batch_size=batch, **config))
    return [RankStream(scheduler, rank) for rank in range(world)]


def test_batches_are_the_plan_and_the_state_does_not_depend_on_the_rank():
    streams = _streams()
    plan = streams[0].plan()
    for stream in streams:
        got = [b.indices.tolist() for b in stream.batches()]
        assert got == [plan.local(s, stream.rank).tolist() for s in range(plan.num_steps)]
    for stream in streams:
        stream.set_epoch(1)
        batches = stream.batches()
        for _ in range(5):
            next(batches)
    states = [stream.state() for stream in streams]
    assert all(state == states[0] for state in states)
    assert (states[0]["epoch"], states[0]["step"], states[0]["offset"]) == (1, 5, 0)


def test_any_ranks_state_resumes_every_rank_exactly():
    streams = _streams(drop_last=True)
    for stream in streams:
        stream.set_epoch(2)
    head = streams[3].batches()
    for _ in range(4):
        next(head)
    saved = streams[3].state()
    for stream in _streams(drop_last=True):
        expected = stream.plan(2)
        stream.load_state(saved)
        rest = [b.step for b in stream.batches()]
        assert rest == list(range(4, expected.num_steps))
        stream.load_state(saved)
        assert next(stream.batches()).indices.tolist() == expected.local(4, stream.rank).tolist()


def test_a_sample_level_face_resumes_mid_step():
    stream = _streams()[1]
    batches = stream.batches(whole=False)
    first = next(batches)
    stream.advance(first.indices.shape[0])
    second = next(batches)
    stream.advance(3)
    state = stream.state()
    assert (state["step"], state["offset"]) == (1, 3)
    again = _streams()[1]
    again.load_state(state)
    resumed = next(again.batches(whole=False))
    assert resumed.step == 1 and again.offset == 3  # the face skips the first 3 samples
    assert resumed.indices.tolist() == second.indices.tolist()
    stream.advance(second.indices.shape[0] - 3)  # the step is complete
    assert (stream.state()["step"], stream.state()["offset"]) == (2, 0)


def test_set_epoch_keeps_a_loaded_position_and_rewind_forgets_it():
    source = _streams()[0]
    batches = source.batches()
    for _ in range(3):
        next(batches)
    stream = _streams()[0]
    stream.load_state(source.state())
    stream.set_epoch(0)
    assert next(stream.batches()).step == 3
    stream.load_state(source.state())
    stream.rewind(0)
    assert next(stream.batches()).step == 0


def test_states_of_other_versions_and_positions_are_refused_by_name():
    stream = _streams()[0]
    state = stream.state()
    with pytest.raises(ValueError, match="state version 2 is not supported"):
        stream.load_state({**state, "version": 2})
    with pytest.raises(ValueError, match="step=99 is outside"):
        stream.load_state({**state, "step": 99})
    with pytest.raises(ValueError, match="offset"):
        stream.load_state({**state, "step": 1, "offset": 99})


def test_elastic_state_moves_to_another_world_with_every_sample_once():
    old = _streams(world=4, batch=16)
    trained = Counter()
    for stream in old:
        batches = stream.batches()
        for _ in range(5):
            trained.update(next(batches).indices.tolist())
    new = _streams(world=3, batch=12)
    rest = Counter()
    for stream in new:
        stream.load_state(old[0].state())
        for batch in stream.batches():
            rest.update(batch.indices.tolist())
    assert set(trained) | set(rest) == set(range(203))
    assert sum((trained & rest).values()) == 0
    assert max(trained.values()) == 1  # no padding inside the first five steps
    assert sum(rest.values()) == 203 - sum(trained.values()) + new[0].plan().num_padded


PACKING = Packing(64, row_length=32, tokens_per_step=600, long_documents="split")


@pytest.mark.parametrize(
    "config",
    [
        dict(),
        dict(drop_last=True, seed=4),
        dict(exact=False),
        dict(kind="guided", shuffle="block"),
        dict(batch=None, packing=PACKING),
    ],
    ids=["exact", "drop_last", "pool", "guided", "packed"],
)
def test_a_fresh_stream_resumes_mid_epoch_byte_for_byte(config):
    """Save after 5 steps of epoch 1, load the JSON state into a new stream: the rest of the
    epoch and the next one are the uninterrupted stream's bytes (indices, weights,
    micro-batches)."""

    batch = config.pop("batch", 15)

    def make():
        return _streams(world=3, batch=batch, **config)[2]

    def dump(batch):
        micro = [tuple(np.asarray(a).tobytes() for a in m[:4]) + (m[4],) for m in batch.micro]
        return batch.epoch, batch.step, batch.indices.tobytes(), batch.loss_weight, micro

    full = make()
    full.set_epoch(1)
    expected = [dump(b) for b in full.batches()]
    full.set_epoch(2)
    expected += [dump(b) for b in full.batches()]
    first = make()
    first.set_epoch(1)
    head = first.batches()
    assert [dump(next(head)) for _ in range(5)] == expected[:5]
    state = json.loads(json.dumps(first.state()))
    assert (state["version"], state["epoch"], state["step"]) == (STATE_VERSION, 1, 5)
    resumed = make()
    resumed.load_state(state)
    assert (resumed.epoch, resumed.step, resumed.offset) == (1, 5, 0)
    resumed.set_epoch(1)  # a training loop's call keeps the loaded position
    got = [dump(b) for b in resumed.batches()]
    resumed.set_epoch(2)
    got += [dump(b) for b in resumed.batches()]
    assert got == expected[5:]
    assert resumed.state() == full.state()


def test_a_packed_sample_level_face_counts_micro_batches_and_resumes_mid_step():
    def make():
        return _streams(world=2, batch=None, packing=PACKING)[1]

    stream = make()
    batches = stream.batches(whole=False)
    first = next(batches)
    stream.advance(len(first.micro))
    second = next(batches)
    assert len(second.micro) >= 2
    stream.advance(1)  # one micro-batch of step 1 handed out
    state = stream.state()
    assert (state["step"], state["offset"]) == (1, 1)
    again = make()
    again.load_state(state)
    resumed = next(again.batches(whole=False))
    assert resumed.step == 1 and again.offset == 1  # the face skips one micro-batch
    assert resumed.indices.tobytes() == second.indices.tobytes()
    with pytest.raises(ValueError, match="state offset"):
        make().load_state({**state, "offset": len(second.micro) + 1})


def test_set_epoch_to_another_epoch_resets_the_position_and_an_elastic_remainder():
    old = _streams(world=4, batch=16)[0]
    batches = old.batches()
    for _ in range(5):
        next(batches)
    stream = _streams(world=3, batch=12)[1]
    stream.load_state(old.state())
    assert stream.num_steps != stream.scheduler.num_steps(0)  # the remainder's
    stream.set_epoch(1)
    state = stream.state()
    assert (state["epoch"], state["step"], state["offset"], state["history"]) == (1, 0, 0, [])
    assert stream.num_steps == stream.scheduler.num_steps(1)
    assert stream.plan() is stream.scheduler.plan_epoch(1)
    got = [b.indices.tolist() for b in stream.batches()]
    assert got == [p.tolist() for p in stream.scheduler.plan_epoch(1).rank_steps(1)]


def test_an_elastic_resume_through_the_stream_follows_the_cores_remainder():
    """A state saved mid-step at 4 ranks resumes at 3: the partial step is trained again,
    the stream's plan is the core's ``resume_plan``, weights are ones, and a state saved in
    the remainder resumes at its own world byte for byte and at a third world exactly once."""
    old = _streams(world=4, batch=16)
    trained = Counter()
    for stream in old:
        batches = stream.batches(whole=False)
        for _ in range(3):
            batch = next(batches)
            trained.update(batch.indices.tolist())
            stream.advance(batch.indices.shape[0])
        next(batches)
        stream.advance(2)  # mid-step: those two samples do not count as trained
    saved = json.loads(json.dumps(old[1].state()))
    assert (saved["step"], saved["offset"]) == (3, 2)
    middle = _streams(world=3, batch=12)
    expected = resume_plan(middle[0].scheduler, 0, [Segment(4, 16, 3)])
    for stream in middle:
        stream.load_state(saved)
        assert (stream.step, stream.offset) == (0, 0)
        plan = stream.plan()
        assert plan.indices.tobytes() == expected.indices.tobytes()
        assert stream.num_steps == expected.num_steps
        np.testing.assert_array_equal(stream.loss_weights(), np.ones(expected.num_steps))
    running = [stream.batches() for stream in middle]
    for batches in running:
        for _ in range(4):
            trained.update(next(batches).indices.tolist())
    state = middle[0].state()
    assert state["history"] == [[4, 16, 3]] and state["step"] == 4
    again = _streams(world=3, batch=12)[2]
    again.load_state(state)
    assert [b.indices.tobytes() for b in again.batches()] == [
        b.indices.tobytes() for b in running[2]
    ]
    last = _streams(world=5, batch=10)
    rest = Counter()
    for stream in last:
        stream.load_state(state)
        assert stream.state()["history"] == [[4, 16, 3], [3, 12, 4]]
        for batch in stream.batches():
            rest.update(batch.indices.tolist())
    assert set(trained) | set(rest) == set(range(203))
    assert not set(trained) & set(rest)
    assert sum(rest.values()) - len(rest) == last[0].plan().num_padded


def test_a_state_of_other_data_or_arguments_is_refused_in_the_faces_words():
    state = _streams(world=2, batch=8)[0].state()
    other = _streams(world=3, batch=12, seed=1)[0]
    with pytest.raises(ValueError, match="configuration digest differs: seed: saved 0, now 1") as e:
        other.load_state(state)
    assert "state was saved with different sizes or stream arguments" in str(e.value)
    assert "only num_replicas and global_batch_size may change" in str(e.value)
    scheduler = Scheduler(_sizes(), ScheduleConfig(3, 12, seed=1))
    face = RankStream(scheduler, 0, names=state_format("iterator", batch="batch_size"))
    with pytest.raises(
        ValueError, match=r"or iterator arguments.*only num_replicas and batch_size"
    ):
        face.load_state(state)


def test_a_dynamic_stream_refuses_a_new_world_mid_epoch_but_loads_an_epoch_boundary():
    # Rank 1 starts no coordinator; nothing is asked of one before batches() runs.
    options = DynamicOptions(port=free_ports(2)[0], timeout=0.2)
    config = dict(kind="dynamic", window=4)
    old = RankStream(Scheduler(_sizes(), ScheduleConfig(2, 8, **config)), 1, dynamic=options)
    new = RankStream(Scheduler(_sizes(), ScheduleConfig(3, 12, **config)), 1, dynamic=options)
    try:
        state = {**old.state(), "step": 2}
        with pytest.raises(ValueError, match="kind='dynamic' cannot continue an epoch"):
            new.load_state(state)
        new.load_state({**state, "step": 0})
        assert (new.epoch, new.step, new.num_steps) == (0, 0, new.scheduler.num_steps(0))
    finally:
        old.close()
        new.close()


def test_a_dynamic_streams_weights_of_another_epoch_have_that_epochs_steps():
    # Packed steps cut a token budget, so epochs can differ in steps: 22 then 21 here.
    sizes = np.clip(np.random.default_rng(0).lognormal(4, 1.2, 300).astype(int), 1, 512)
    packing = Packing(256, row_length=128, tokens_per_step=1500, long_documents="split")
    scheduler = Scheduler(sizes, ScheduleConfig(2, None, kind="dynamic", window=4, packing=packing))
    assert scheduler.num_steps(0) != scheduler.num_steps(1)
    stream = RankStream(scheduler, 1, dynamic=DynamicOptions(port=free_ports(2)[0], timeout=0.2))
    try:
        assert stream.loss_weights(1).shape == (scheduler.num_steps(1),)
    finally:
        stream.close()


def _two_rank_job(sizes, config, seconds, epochs=2):
    """Run two ranks (threads) of a kind="dynamic" ``config`` for ``epochs``: rank 0's
    stream runs the ZeroMQ coordinator, both agree on every window through a shared
    key-value store, and each reports ``seconds(rank, batch)`` for every batch. Returns the
    two streams (still open) and every rank's batches, epoch by epoch."""
    store = LocalStore()
    options = DynamicOptions(port=free_ports(2)[0], timeout=30.0)

    def agree(r):
        # key_prefix numbers a process's streams of one configuration, and both ranks
        # live in this process here: name the job's prefix instead.
        return KeyValueAgreement(
            store.put, store.get, r, 2, prefix="job", timeout_ms=60_000, delete=store.delete
        )

    streams: list[RankStream | None] = [None, None]
    ready = threading.Barrier(2, timeout=scaled(60))
    got: list[list[list]] = [[], []]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            if r == 1:
                ready.wait()  # rank 0's coordinator listens first
            scheduler = Scheduler(sizes, config)
            stream = RankStream(scheduler, r, dynamic=options, agree=agree(r))
            streams[r] = stream
            if r == 0:
                ready.wait()
            for epoch in range(epochs):
                stream.set_epoch(epoch)
                got[r].append([])
                for batch in stream.batches():
                    got[r][epoch].append(batch)
                    stream.report(seconds(r, batch))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(120))
    if errors or any(t.is_alive() for t in threads):
        for stream in streams:
            if stream is not None:
                stream.close()
        raise AssertionError(f"a rank failed or hung: {errors}")
    return streams, got


def test_a_dynamic_job_of_two_ranks_splits_every_step_once_over_a_real_coordinator():
    """Variable batches, rank 1 reports 3x the compute time; every step holds exactly the
    static plan's samples."""
    sizes = _sizes(300, seed=1)
    config = ScheduleConfig(
        num_replicas=2, batch_size=16, kind="dynamic", variable_batch=True, window=4
    )

    def seconds(r, batch):
        return float(sizes[batch.indices].sum()) * 1e-6 * (3.0 if r == 1 else 1.0)

    streams, got = _two_rank_job(sizes, config, seconds)
    try:
        static = Scheduler(sizes, config)
        for epoch in range(2):
            plan = static.plan_epoch(epoch)
            assert len(got[0][epoch]) == len(got[1][epoch]) == plan.num_steps
            for step in range(plan.num_steps):
                whole = plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]]
                mine = [b.indices.tolist() for b in (got[0][epoch][step], got[1][epoch][step])]
                assert sorted(mine[0] + mine[1]) == sorted(whole)
                total = got[0][epoch][step].loss_weight + got[1][epoch][step].loss_weight
                assert total == pytest.approx(2.0)
        assert streams[0].session.windows_dynamic == streams[1].session.windows_dynamic > 0
        assert streams[0].session.windows_static == streams[1].session.windows_static
        slow_counts = [len(b.indices) for b in got[1][1]]
        assert np.mean(slow_counts) < 6  # about a quarter of 16 for a 3x slower rank
    finally:
        for stream in streams:
            stream.close()


def test_a_dynamic_packed_job_calibrates_the_cost_and_gives_a_slow_rank_fewer_tokens():
    """Packed micro-batches, kind="dynamic": rank 1 is 3x slower and the true cost has a
    quadratic term the prior lacks; the coordinator's windows re-pack every step's pieces
    (every token once, equal micro-batch counts, the caps kept) and, calibrated, give rank 1
    about a quarter of the work."""
    sizes = np.clip(_sizes(600, seed=2) * 4, 1, 256)
    packing = Packing(256, row_length=128, tokens_per_step=4000, long_documents="split")
    config = ScheduleConfig(2, None, kind="dynamic", window=4, packing=packing)

    def work(batch):
        lengths = np.concatenate([m.lengths for m in batch.micro]).astype(float)
        return 1e-5 * lengths.sum() + 4e-7 * (lengths**2).sum()

    streams, got = _two_rank_job(sizes, config, lambda r, b: work(b) * (3.0 if r == 1 else 1.0))
    try:
        static = Scheduler(sizes, config)
        for epoch in range(2):
            plan = static.plan_epoch(epoch)
            assert len(got[0][epoch]) == len(got[1][epoch]) == plan.num_steps
            for step in range(plan.num_steps):
                both = [got[0][epoch][step], got[1][epoch][step]]
                assert len(both[0].micro) == len(both[1].micro)  # equal micro-batch counts
                tokens = Counter()
                for batch in both:
                    for m in batch.micro:
                        assert m.lengths.sum() <= packing.max_tokens
                        for doc, start, length in zip(m.indices, m.starts, m.lengths, strict=True):
                            tokens.update((int(doc), t) for t in range(start, start + length))
                expected = Counter()
                span = slice(plan.bounds[step, 0], plan.bounds[step, -1])
                for doc, start, length in zip(
                    plan.indices[span],
                    plan.micro.starts[span],
                    plan.micro.lengths[span],
                    strict=True,
                ):
                    expected.update((int(doc), t) for t in range(start, start + length))
                assert tokens == expected  # every token of the step once
                assert sum(b.loss_weight for b in both) == pytest.approx(2.0)
        sessions = [s.session for s in streams]
        assert sessions[0].windows_dynamic == sessions[1].windows_dynamic > 0
        late = [work(b) for b in got[1][1][-4:]], [work(b) for b in got[0][1][-4:]]
        assert np.mean(late[0]) / np.mean(late[1]) < 0.45  # about 1/3 of the fast rank's
        calibration = streams[0].session.coordinator.planner.calibration
        model = calibration.model()
        assert model.c / model.b == pytest.approx(4e-7 / 1e-5, rel=0.05)
        speeds = calibration.speeds()
        assert speeds[0] / speeds[1] == pytest.approx(3.0, rel=0.05)
    finally:
        for stream in streams:
            stream.close()


def _split_a_micro_batch(message: dict, table) -> None:
    """Split the first micro-batch of two pieces or more of every step of ``message`` (one
    rank's packed plan) in two, each half with the weight its tokens imply: every
    per-rank check still passes, but the rank runs one micro-batch more than the others."""
    pieces = np.frombuffer(message["idx"], "<i8")
    counts = np.frombuffer(message["nm"], "<i8").copy()
    offsets = list(np.frombuffer(message["mo"], "<i8"))
    weights = list(np.frombuffer(message["mw"], "<f8"))
    j = 0
    for i in range(counts.shape[0]):
        for k in range(j, j + int(counts[i])):
            a, b = offsets[k], offsets[k + 1]
            if b - a >= 2:
                tokens = table.length[pieces[a:b]].astype(float)
                half = tokens[:1].sum() / tokens.sum()
                weights[k : k + 1] = [weights[k] * half, weights[k] * (1 - half)]
                offsets.insert(k + 1, a + 1)
                counts[i] += 1
                break
        j += int(counts[i])
    message["nm"] = counts.astype("<i8").tobytes()
    message["mo"] = np.array(offsets, "<i8").tobytes()
    message["mw"] = np.array(weights, "<f8").tobytes()


@attack("degraded", "a coordinator gives ranks unequal micro-batch counts (packed): static plan")
def test_a_packed_window_with_unequal_micro_batch_counts_falls_back_on_every_rank(monkeypatch):
    """Rank 1's packed plans hold one micro-batch more per step than rank 0's, each within
    the caps and weighted by its tokens: each rank's own checks pass, but unequal
    micro-batch counts would hang gradient accumulation. The counts are part of the token
    the ranks agree on, so every window takes the static plan on both ranks."""
    honest = Coordinator._part

    def part(self, plan, rank, seq):
        message = msgpack.unpackb(honest(self, plan, rank, seq))
        if rank == 1:
            _split_a_micro_batch(message, self.scheduler.pieces)
        return msgpack.packb(message, use_bin_type=True)

    monkeypatch.setattr(Coordinator, "_part", part)
    sizes = np.clip(_sizes(300, seed=2) * 4, 1, 256)
    packing = Packing(256, row_length=128, tokens_per_step=4000, long_documents="split")
    config = ScheduleConfig(2, None, kind="dynamic", window=4, packing=packing)
    streams, got = _two_rank_job(sizes, config, lambda r, b: 1e-3, epochs=1)
    try:
        static = Scheduler(sizes, config).plan_epoch(0)
        for r in range(2):
            assert [len(b.micro) for b in got[r][0]] == [
                len(planned_micro_batches(static, step, r)) for step in range(static.num_steps)
            ]
            session = streams[r].session
            assert session.windows_dynamic == 0 and session.plans_refused == 0
    finally:
        for stream in streams:
            stream.close()


def test_numpy_integers_plan_and_save_as_python_ints_do():
    numpy_config = ScheduleConfig(
        num_replicas=np.int64(4), batch_size=np.int32(16), seed=np.int64(3), window=np.int16(4)
    )
    python_config = ScheduleConfig(num_replicas=4, batch_size=16, seed=3, window=4)
    a = RankStream(Scheduler(_sizes(), numpy_config), np.int64(2))
    b = RankStream(Scheduler(_sizes(), python_config), 2)
    assert a.scheduler.digest == b.scheduler.digest
    assert [x.indices.tolist() for x in a.batches()] == [x.indices.tolist() for x in b.batches()]
    assert json.dumps(a.state()) == json.dumps(b.state())


def test_dynamic_without_an_agreement_opens_no_session_and_plans_statically(caplog):
    scheduler = Scheduler(_sizes(), ScheduleConfig(2, 8, kind="dynamic", window=4))
    with caplog.at_level("WARNING", logger="chronica"):
        stream = RankStream(scheduler, 1, dynamic=DynamicOptions(port=free_ports(2)[0]))
    assert stream.session is None and not stream.dynamic
    assert any("every window uses the static plan" in r.getMessage() for r in caplog.records)
    stream.close()
