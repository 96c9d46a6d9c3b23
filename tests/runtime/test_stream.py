"""The per-rank runtime without any framework: RankStream's position and state, the
agreements, argument assembly, and a dynamic job of two ranks over a real coordinator."""

import json
import threading
from collections import Counter

import msgpack
import numpy as np
import pytest
from attacks import attack
from workers import free_ports

from chronica.comm.coordinator import Coordinator
from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.multiset import HASH_WORDS, MODULUS
from chronica.runtime import DynamicOptions, KeyValueAgreement, RankStream
from chronica.runtime.agreement import NO_PLAN, key_value_agreement
from chronica.runtime.micro import planned_micro_batches
from chronica.runtime.request import open_stream


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


def _store():
    values: dict[str, str] = {}
    changed = threading.Condition()

    def put(key, value):
        with changed:
            assert key not in values, f"{key} written twice"
            values[key] = value
            changed.notify_all()

    def get(key, timeout_ms):
        with changed:
            if not changed.wait_for(lambda: key in values, timeout_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED {key}")
            return values[key]

    def delete(key):
        with changed:
            values.pop(key, None)

    return values, put, get, delete


def _agree_in_threads(agreements, rounds):
    """Every rank votes ``rounds`` (per round, every rank's token and imbalance words);
    returns each rank's answers and the keys its imbalance was asked for."""
    results = [[] for _ in agreements]
    keys = [[] for _ in agreements]

    def run(i):
        for tokens, words in rounds:

            def imbalance(key, i=i, words=words):
                keys[i].append(key.tolist())
                return np.array(words[i], np.int64)

            results[i].append(agreements[i](tokens[i], imbalance))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(agreements))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, keys


def test_key_value_agreement_gives_every_rank_the_same_answer():
    """A window is used only if every token is the same one, not NO_PLAN, and the
    imbalances sum to 0 modulo the prime; every rank gets the same answer, and the same
    fresh key, drawn by rank 0, in every vote."""
    values, put, get, delete = _store()
    world = 3
    agreements = [
        KeyValueAgreement(put, get, r, world, prefix="job", timeout_ms=30_000, delete=delete)
        for r in range(world)
    ]
    a, b, c = (7, 1, 2, 3), (7, 1, 2, 4), (1 << 61, 5, 0, (1 << 62) - 1)
    # Tokens with a's sum but not a's chunks: the squares tell them apart.
    low, high = (5, 1, 2, 3), (9, 1, 2, 3)
    zero = [[0] * HASH_WORDS] * world
    split = [[MODULUS - 1] * HASH_WORDS, [1] * HASH_WORDS, [0] * HASH_WORDS]
    off = [[1] + [0] * (HASH_WORDS - 1), [0] * HASH_WORDS, [0] * HASH_WORDS]
    rounds = [
        ((a, a, a), zero),
        ((a, NO_PLAN, a), zero),
        ((a, b, a), zero),
        ((NO_PLAN,) * 3, zero),
        ((c, c, c), split),
        ((a, a, a), off),
        ((low, a, high), zero),
    ]
    results, keys = _agree_in_threads(agreements, rounds)
    expected = [True, False, False, False, True, False, False]
    assert results == [expected] * world
    assert keys[0] == keys[1] == keys[2]
    assert len({tuple(k) for k in keys[0]}) == len(rounds)  # a fresh key for every vote
    # Each rank dropped its key of a round once every rank had read it (two per vote).
    assert sorted(values) == [f"job/{2 * len(rounds) - 1}/{r}" for r in range(world)]


def test_a_rank_that_never_answers_is_named_in_a_time_out():
    _, put, get, delete = _store()
    alone = KeyValueAgreement(put, get, 0, 2, prefix="job", timeout_ms=50, delete=delete)
    with pytest.raises(TimeoutError, match="rank 1 did not take part in agreement round 0"):
        alone((5, 0, 0, 0), lambda key: np.zeros(HASH_WORDS, np.int64))


def test_key_value_agreement_factory_keys_by_digest_and_needs_a_store():
    _, put, get, delete = _store()
    scheduler = Scheduler(_sizes(), ScheduleConfig(num_replicas=2, batch_size=8))
    assert key_value_agreement(0, 1.0, lambda world: None)(scheduler) is None
    built = key_value_agreement(1, 1.0, lambda world: (put, get, delete))(scheduler)
    assert isinstance(built, KeyValueAgreement)
    assert built.prefix.startswith(f"chronica/agree/{scheduler.digest[:16]}/")
    assert (built.rank, built.world, built.timeout_ms) == (1, 2, 60_000)


def _two_rank_job(sizes, config, seconds, epochs=2):
    """Run two ranks (threads) of a kind="dynamic" ``config`` for ``epochs``: rank 0's
    stream runs the ZeroMQ coordinator, both agree on every window through a shared
    key-value store, and each reports ``seconds(rank, batch)`` for every batch. Returns the
    two streams (still open) and every rank's batches, epoch by epoch."""
    _, put, get, delete = _store()
    options = DynamicOptions(port=free_ports(2)[0], timeout=30.0)

    def agree(r):
        # key_prefix numbers a process's streams of one configuration, and both ranks
        # live in this process here: name the job's prefix instead.
        return lambda scheduler: KeyValueAgreement(
            put, get, r, 2, prefix="job", timeout_ms=60_000, delete=delete
        )

    streams: list[RankStream | None] = [None, None]
    ready = threading.Barrier(2, timeout=60)
    got: list[list[list]] = [[], []]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            if r == 1:
                ready.wait()  # rank 0's coordinator listens first
            stream = open_stream(sizes, config, r, dynamic=options, agree=agree(r))
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
        t.join(timeout=120)
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
    a = open_stream(_sizes(), numpy_config, np.int64(2))
    b = open_stream(_sizes(), python_config, 2)
    assert a.scheduler.digest == b.scheduler.digest
    assert [x.indices.tolist() for x in a.batches()] == [x.indices.tolist() for x in b.batches()]
    assert json.dumps(a.state()) == json.dumps(b.state())
