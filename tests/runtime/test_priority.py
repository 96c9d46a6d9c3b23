"""The gradient task queue (chronica.core.priority) and the dispatcher machinery
(chronica.runtime.dispatcher) without any framework: layout, reassembly, credit, order."""

import gc
import json
import random
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.priority import (
    GradientQueue,
    bucket_layout,
    build_layout,
    fifo_order,
    simulate_order,
)
from chronica.runtime.dispatcher import AutoTuner, Dispatcher, SchedulingOptions
from chronica.runtime.timeline import Exposure, Timeline, read_exposure, timeline_path

tensors = st.lists(st.tuples(st.integers(0, 300), st.sampled_from([1, 2, 4, 8])), max_size=12)


def _layout(spec, part):
    numel = np.array([n for n, _ in spec], dtype=np.int64)
    itemsize = np.array([s for _, s in spec], dtype=np.int64)
    return build_layout(numel, itemsize, part)


@given(spec=tensors, part=st.integers(1, 600))
def test_partitions_reassemble_every_tensor_exactly(spec, part):
    layout = _layout(spec, part)
    rng = np.random.default_rng(0)
    originals = [rng.standard_normal(n) for n, _ in spec]
    # Pack each partition as a transport buffer would, then scatter it back.
    buffers = [
        np.concatenate([originals[t][a:b] for t, a, b in layout.segments(p)] or [np.zeros(0)])
        for p in range(layout.num_partitions)
    ]
    rebuilt = [np.full(n, np.nan) for n, _ in spec]
    for p, buf in enumerate(buffers):
        offset = 0
        for t, a, b in layout.segments(p):
            assert np.isnan(rebuilt[t][a:b]).all()  # no element in two partitions
            rebuilt[t][a:b] = buf[offset : offset + b - a]
            offset += b - a
    for got, want in zip(rebuilt, originals, strict=True):
        np.testing.assert_array_equal(got, want)
    for p in range(layout.num_partitions):
        segs = layout.segments(p)
        sizes = {spec[t][1] for t, _, _ in segs}
        assert len(sizes) == 1  # one dtype per partition
        if len(segs) > 1 or layout.part_bytes[p] <= part:
            assert layout.part_bytes[p] <= max(part, spec[segs[0][0]][1])
        assert [t for t, _, _ in segs] == sorted(t for t, _, _ in segs)


def test_cut_big_and_fuse_small():
    layout = build_layout(np.array([10, 10, 1000, 10]), np.array([4, 4, 4, 4]), 1024)
    assert [layout.segments(p) for p in range(layout.num_partitions)] == [
        [(0, 0, 10), (1, 0, 10)],
        [(2, 0, 250)],
        [(2, 250, 500)],
        [(2, 500, 750)],
        [(2, 750, 1000)],
        [(3, 0, 10)],
    ]
    with pytest.raises(ValueError, match="partition_bytes"):
        build_layout(np.array([1]), np.array([4]), 0)


def _drive(queue, ready_order, rng):
    """Mark tensors ready in ``ready_order``, completing in-flight work at random moments."""
    issued, flight, pending = [], [], list(ready_order)
    largest = int(queue.layout.part_bytes.max(initial=0))
    while pending or flight or not queue.done_dispatching:
        choice = rng.random()
        if pending and choice < 0.5:
            queue.mark_ready(pending.pop(0))
        elif flight and choice < 0.8:
            queue.complete(flight.pop(0))
        while (p := queue.next_dispatch()) is not None:
            issued.append(p)
            flight.append(p)
            assert queue.in_flight <= queue.credit_bytes + largest
        if not pending and not flight and not queue.done_dispatching:
            raise AssertionError("stuck")
    return issued


@given(spec=tensors, cap=st.integers(1, 900), first=st.integers(1, 900))
def test_buckets_hold_whole_tensors_fused_from_the_last_one(spec, cap, first):
    numel = np.array([n for n, _ in spec], dtype=np.int64)
    itemsize = np.array([s for _, s in spec], dtype=np.int64)
    layout = bucket_layout(numel, itemsize, cap, first)
    segs = [layout.segments(p) for p in range(layout.num_partitions)]
    assert [t for part in segs for t, _, _ in part] == list(range(len(spec)))  # in order, once
    assert all(a == 0 and b == numel[t] for part in segs for t, a, b in part)  # never cut
    for p, part in enumerate(segs):
        assert len({itemsize[t] for t, _, _ in part}) == 1
        limit = first if p == len(segs) - 1 else cap  # the last bucket is ready first
        # filled from the back, DDP's way: below the limit until its first tensor joined
        assert layout.part_bytes[p] - numel[part[0][0]] * itemsize[part[0][0]] < limit
        if p > 0 and itemsize[segs[p - 1][-1][0]] == itemsize[part[0][0]]:
            assert layout.part_bytes[p] >= limit  # closed because it reached its limit


def test_exposure_medians_bound_and_verdict():
    bucketed = Exposure.from_steps(
        [(0.1, 0.01, 0.0), (0.3, 0.03, 0.0), (0.2, 0.02, 0.0)], "bucketed"
    )
    assert (bucketed.steps, bucketed.step_time, bucketed.after_backward) == (3, 0.2, 0.02)
    assert bucketed.exposed == 0.02 and bucketed.saving_bound == pytest.approx(0.1)
    assert "would save at most 10.0% of step time" in bucketed.verdict
    scheduled = Exposure.from_steps([(0.2, 0.05, 0.01)], "scheduled", decision="told")
    assert scheduled.exposed == 0.01 and scheduled.decision == "told"
    assert "hides about 20.0% here" in scheduled.verdict
    assert "no step measured" in Exposure.from_steps([], "bucketed").verdict


def test_timeline_finished_when_collected_and_exposure_read_back(tmp_path):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), pid=1)
    timeline.step(1.0, 1.2, 0.05, 0.0, "bucketed")
    timeline.step(1.2, 1.4, 0.04, 0.01, "scheduled")
    timeline.step(1.4, 1.7, 0.06, 0.02, "scheduled")
    del timeline  # never closed: the finalizer terminates the JSON array
    gc.collect()
    events = json.loads(path.read_text())
    assert [e["tid"] for e in events if e["ph"] == "X"] == ["step"] * 3
    exposure = read_exposure(path)  # the mode the run ended in
    assert (exposure.mode, exposure.steps) == ("scheduled", 2)
    assert exposure.step_time == pytest.approx(0.25)
    assert exposure.forward_wait == pytest.approx(0.015)


@given(spec=tensors, part=st.integers(1, 600), credit=st.integers(1, 2000), seed=st.integers(0, 99))
def test_credit_bound_and_order_identical_whatever_the_timing(spec, part, credit, seed):
    layout = _layout(spec, part)
    ready = np.random.default_rng(seed).permutation(layout.num_tensors)
    order = fifo_order(layout, np.argsort(ready).astype(float))
    runs = []
    for rank in range(3):  # "ranks": different readiness orders and completion timing
        queue = GradientQueue(layout, order, credit)
        perm = np.random.default_rng(seed + rank).permutation(layout.num_tensors).tolist()
        runs.append(_drive(queue, perm, random.Random(rank)))
        assert queue.in_flight == 0
        assert queue.max_in_flight <= credit + int(layout.part_bytes.max(initial=0))
    assert runs[0] == runs[1] == runs[2] == order.tolist()


def _reference_order(ready, nbytes, credit):
    """Tick-by-tick ByteScheduler: completions, arrivals, then highest priority under credit."""
    order, queued, flight, link_free, t = [], [], [], 0, 0
    while len(order) < len(ready):
        flight = [(end, b) for end, b in flight if end > t]
        queued += [p for p in range(len(ready)) if ready[p] == t]
        while queued and sum(b for _, b in flight) < credit:
            p = min(queued)
            queued.remove(p)
            link_free = max(t, link_free) + nbytes[p]
            flight.append((link_free, nbytes[p]))
            order.append(p)
        t += 1
    return order


@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=10),
    data=st.data(),
    credit=st.integers(1, 60),
)
@settings(max_examples=60)
def test_simulated_priority_order_matches_tick_reference(sizes, data, credit):
    ready = data.draw(st.lists(st.integers(0, 40), min_size=len(sizes), max_size=len(sizes)))
    layout = build_layout(np.array(sizes), np.ones(len(sizes), np.int64), max(sizes))
    got = simulate_order(layout, np.array(ready, float), credit, bytes_per_second=1.0)
    want = _reference_order(
        [max(ready[t] for t, _, _ in layout.segments(p)) for p in range(layout.num_partitions)],
        layout.part_bytes.tolist(),
        credit,
    )
    assert got.tolist() == want


def test_simulated_order_limits():
    layout = build_layout(np.full(6, 100), np.full(6, 4), 400)
    backward = np.arange(6, 0, -1, dtype=float)  # last layer ready first
    # An infinitely fast link sends in readiness order; a slow one sends the first partition
    # to become ready, then strictly by priority.
    assert simulate_order(layout, backward, 400, 1e12).tolist() == [5, 4, 3, 2, 1, 0]
    assert simulate_order(layout, backward, 400, 1e-3).tolist() == [5, 0, 1, 2, 3, 4]
    assert fifo_order(layout, backward).tolist() == [5, 4, 3, 2, 1, 0]


def test_dispatcher_threads_bound_credit_and_keep_order(tmp_path):
    layout = build_layout(np.full(20, 256), np.full(20, 4), 1024)
    order = np.arange(layout.num_partitions)
    queue = GradientQueue(layout, order, credit_bytes=2048)
    lock, flight, peaks, started, completed = threading.Lock(), [0], [0], [], []

    def start(p):
        with lock:
            flight[0] += int(layout.part_bytes[p])
            peaks[0] = max(peaks[0], flight[0])
            started.append(p)
        return p

    def wait(p, handle):
        time.sleep(0.001 * (p % 3))
        with lock:
            flight[0] -= int(layout.part_bytes[p])

    trace = tmp_path / "t.json"
    dispatcher = Dispatcher(start, wait, completed.append, Timeline(str(trace), pid=3))
    for _ in range(2):
        dispatcher.begin(queue, [f"p{i}" for i in range(layout.num_partitions)])
        for t in reversed(range(layout.num_tensors)):
            dispatcher.ready(t)
        dispatcher.wait_all()
    stats = dispatcher.stats()
    dispatcher.close()
    assert started == completed == order.tolist() * 2
    assert peaks[0] <= 2048 + 1024 and dispatcher.max_in_flight <= 2048 + 1024
    assert stats.bytes_per_second > 0 and np.isfinite(stats.tensor_ready).all()
    events = json.loads(trace.read_text())
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 2 * 2 * layout.num_partitions
    assert {e["tid"] for e in spans} == {"queue", "communication"}
    assert all(e["pid"] == 3 and e["dur"] >= 0 for e in spans)


def test_dispatcher_surfaces_errors():
    layout = build_layout(np.array([4]), np.array([4]), 16)
    # A caller blocked on its own condition (the torch shim's forward waiting for its
    # parameters) is woken by on_failure, once, and then sees ``failed``.
    outside = threading.Condition()
    woken = []

    def wake():
        with outside:
            woken.append(threading.current_thread().name)
            outside.notify_all()

    dispatcher = Dispatcher(lambda p: p, lambda p, h: 1 / 0, lambda p: None, on_failure=wake)
    dispatcher.begin(GradientQueue(layout, np.array([0]), 16))
    dispatcher.ready(0)
    with outside:
        assert outside.wait_for(lambda: woken, timeout=60)
    assert dispatcher.failed and woken == ["chronica-complete"]
    with pytest.raises(RuntimeError, match="dispatcher failed"):
        dispatcher.wait_all()
    dispatcher.close()


def test_options_from_arguments_and_environment(monkeypatch):
    monkeypatch.setenv("CHRONICA_PARTITION_BYTES", "2MiB")
    monkeypatch.setenv("CHRONICA_CREDIT_BYTES", "3000000")
    monkeypatch.setenv("CHRONICA_TIMELINE", "/tmp/x.json")
    opts = SchedulingOptions.resolve()
    assert (opts.partition_bytes, opts.credit_bytes, opts.timeline) == (
        2 << 20,
        3000000,
        "/tmp/x.json",
    )
    assert SchedulingOptions.resolve(partition_bytes=512, credit_bytes="1k").credit_bytes == 1024
    with pytest.raises(ValueError, match="partition_bytes"):
        SchedulingOptions.resolve(partition_bytes="lots")
    with pytest.raises(ValueError, match="credit_bytes=0"):  # not silently the environment's
        SchedulingOptions.resolve(credit_bytes=0)
    with pytest.raises(ValueError, match="order"):
        SchedulingOptions(order="random")
    assert timeline_path("/a/t.json", 1, 2) == "/a/t.rank1.json"
    assert timeline_path("/a/t-{rank}.json", 1, 2) == "/a/t-1.json"
    assert timeline_path("/a/t.json", 0, 1) == "/a/t.json"


def test_auto_tuner_keeps_the_fastest_candidate():
    tuner = AutoTuner([(1, 1), (2, 2), (3, 3)], steps_per_trial=3)
    seconds = {(1, 1): 3.0, (2, 2): 1.0, (3, 3): 2.0}
    switches = []
    for _ in range(30):
        knobs = tuner.record(seconds[tuner.current])
        if knobs is not None:
            switches.append(knobs)
    # the sweep, a second trial of the two best, then the winner for good
    assert switches == [(2, 2), (3, 3), (2, 2), (3, 3), (2, 2)]
    assert tuner.best == (2, 2)
    assert tuner.scores == [3.0, 1.0, 2.0]


def test_auto_tuner_is_not_decided_by_one_lucky_trial():
    # (2, 2) is slower (1.2 s) but its first trial ran while the machine was quiet (0.9 s).
    trials = {(1, 1): [[1.0] * 3, [1.0] * 3], (2, 2): [[0.9] * 3, [1.2] * 3]}
    tuner = AutoTuner(list(trials), steps_per_trial=3)
    while tuner.best is None:
        knobs = tuner.current
        for t in trials[knobs].pop(0):
            tuner.record(t)
    assert tuner.scores == [1.0, 0.9]  # the first sweep alone would keep (2, 2)
    assert tuner.best == (1, 1)
    lone = AutoTuner([(5, 5)], steps_per_trial=2)
    assert lone.record(1.0) is None and lone.record(1.0) == (5, 5) and lone.best == (5, 5)
