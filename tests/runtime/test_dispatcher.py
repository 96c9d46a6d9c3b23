"""chronica.runtime.dispatcher without any framework: the issue and completion threads under
credit, their errors, the knobs from arguments and environment, and the auto-tuner."""

import json
import threading
import time

import numpy as np
import pytest

from chronica.core.priority import GradientQueue, build_layout
from chronica.runtime.dispatcher import AutoTuner, Dispatcher, SchedulingOptions
from chronica.runtime.timeline import Timeline


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
    assert opts.with_knobs(4096, 8192).credit_bytes == 8192


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
