"""chronica.runtime.gradients: the plan record and its views, and the step history behind
every gradient shim's stats(), without any framework."""

import numpy as np
import pytest

from chronica.core.priority import bucket_layout, build_layout, simulate_order
from chronica.runtime.gradients import (
    PLAN_STEPS,
    GradientViews,
    PlanInputs,
    PlanRecord,
    StepHistory,
    link_busy,
)


def _record(part=8, credit=16):
    layout = build_layout(np.array([4, 2, 1]), np.array([4, 4, 4]), part, np.zeros(3, np.int64))
    return PlanRecord(layout, ["w", "b", "s"], part, credit)


def test_record_shapes_tile_every_tensor_and_labels_follow_the_layout():
    record = _record()
    assert record.shapes() == [[("w", 0, 2)], [("w", 2, 4)], [("b", 0, 2)], [("s", 0, 1)]]
    assert len(record.labels) == record.layout.num_partitions
    assert record.dispatch([3, 0]) == [record.labels[3], record.labels[0]]
    fused = PlanRecord(
        bucket_layout(np.array([2, 2]), np.array([4, 4]), 64, 64, np.zeros(2, np.int64)),
        ["w", "b"],
        64,
        0,
    )
    assert [len(part) for part in fused.shapes()] == [2]  # one bucket holds both


def test_record_refuses_mismatched_names_and_non_layouts():
    layout = _record().layout
    with pytest.raises(ValueError, match="one name per tensor"):
        PlanRecord(layout, ["w"], 8, 16)
    with pytest.raises(TypeError, match="Layout"):
        PlanRecord("layout", ["w"], 8, 16)


class Shim(GradientViews):
    def __init__(self, record=None, issued=()):
        self._record, self._issued = record, list(issued)

    def _dispatched(self):
        return self._issued

    def _config(self):
        return {"mode": "auto", "partition_bytes": 8}


def test_views_read_the_record_in_force():
    empty = Shim()
    assert (empty.partition_bytes, empty.credit_bytes) == (0, 0)
    assert empty.last_dispatch == [] and empty.partition_shapes() == []
    shim = Shim(_record(), issued=[1, 0])
    assert (shim.partition_bytes, shim.credit_bytes) == (8, 16)
    assert shim.last_dispatch == [shim._record.labels[1], shim._record.labels[0]]
    assert shim.partition_shapes() == _record().shapes()
    assert repr(shim) == "Shim(mode='auto', partition_bytes=8)"


def test_history_steps_between_calls_medians_and_restart():
    history = StepHistory(maxlen=3)
    assert history.record(1.0, 0.0, 0.0) is None  # reference point only
    for now, after in [(1.2, 0.02), (1.5, 0.06), (1.6, 0.01), (2.0, 0.04)]:
        history.record(now, after, 0.0)
    assert len(history) == 3  # the oldest step dropped
    exposure = history.exposure("bucketed", "told")
    assert exposure.steps == 3 and exposure.step_time == pytest.approx(0.3)
    assert exposure.after_backward == pytest.approx(0.04) and exposure.decision == "told"
    assert history.median_cpu() == 0.0  # CPU not asked for
    history.record(2.1, 0.0, 0.0, cpu=True)
    assert len(history.cpu) == 1 and history.median_cpu() >= 0.0
    history.restart()
    assert len(history) == 0 and history.last_call is None
    assert history.record(3.0, 0.0, 0.0) is None
    assert "maxlen=3" in repr(history)
    with pytest.raises(TypeError, match="maxlen"):
        StepHistory(maxlen=2.5)
    with pytest.raises(ValueError, match="maxlen"):
        StepHistory(maxlen=0)


def test_link_busy_is_all_bytes_at_the_last_collectives_rate_within_the_issue_span():
    # The last 1 MiB took 10 ms from its issue: 4 MiB at that rate is 40 ms, within 50 ms.
    assert link_busy(0.0, 0.040, 0.050, 1 << 20, 4 << 20) == pytest.approx(0.040)
    # Queued behind the others, the last took 30 ms: no more than the 35 ms since the first.
    assert link_busy(0.0, 0.005, 0.035, 1 << 20, 4 << 20) == pytest.approx(0.035)
    # One collective: its own span; nothing sent: 0; never negative.
    assert link_busy(1.0, 1.0, 1.02, 8, 8) == pytest.approx(0.02)
    assert link_busy(0.0, 0.0, 0.1, 0, 0) == 0.0
    assert link_busy(0.0, 0.2, 0.1, 8, 8) == 0.0


def test_history_keeps_the_busy_time_the_shims_measure_for_the_bound():
    history = StepHistory()
    for now in (0.0, 0.1, 0.2, 0.3):
        history.record(now, 0.05, 0.0, busy=link_busy(now - 0.06, now - 0.02, now, 1, 4))
    exposure = history.exposure("bucketed")
    assert exposure.link_busy == pytest.approx(0.06)  # capped by the issue span
    assert exposure.saving_bound == pytest.approx(0.04 / 0.1)  # the room the link leaves
    assert "the link is busy 60.0 ms per step" in exposure.verdict


def test_plan_inputs_are_per_tensor_medians_of_the_last_steps():
    inputs = PlanInputs(steps=3)
    assert not inputs.full and inputs.estimate()[1] == 0.0
    steps = [([0.0, 5.0, np.nan], 9.0), ([0.0, 1.0, 2.0], np.inf), ([0.0, 3.0, 4.0], 4.0)]
    for ready, rate in [([0.0, 99.0, 99.0], 99.0), *steps]:  # the first drops out
        inputs.record(np.array(ready), rate)
    assert inputs.full and len(inputs) == 3
    ready, rate = inputs.estimate()
    # NaN (never ready that step) and an unmeasured rate are left out of the medians.
    assert ready.tolist() == [0.0, 3.0, 3.0] and rate == 6.5
    inputs.clear()
    inputs.record(np.array([np.nan, 0.0]), 1.0)
    assert inputs.estimate()[0].tolist() == [0.0, 0.0]  # never ready: planned as first
    with pytest.raises(ValueError, match="clear"):
        inputs.record(np.zeros(3), 1.0)
    with pytest.raises(TypeError, match="steps"):
        PlanInputs(steps=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        PlanInputs(steps=0)
    assert repr(PlanInputs(steps=4)) == "PlanInputs(recorded=0, steps=4)"


def test_orders_planned_from_medians_agree_far_more_than_from_single_steps():
    """Forty optimizers with one setting at 100 Mbit/s, each planning from its own noisy
    steps: planned from one step they run five orders; from the medians of PLAN_STEPS steps
    two, which differ only where the estimate lies on a boundary (the first layer's partition
    ready just before or just after a partition's transfer ends: one place apart)."""
    rng = np.random.default_rng(3)
    numel = np.array([864, 32, 9216, 32, 18432, 64, 1048576, 256, 65536, 256, 2560, 10])
    layout = build_layout(numel, np.full(12, 4), 256 << 10)
    # Backward order: the last layers first; each gap one layer's backward (seconds).
    gaps = np.repeat([0.010, 0.035, 0.020, 0.006, 0.001, 0.0003], 2)[::-1]
    rate = 12.5e6  # 100 Mbit/s

    def noisy_step() -> tuple[np.ndarray, float]:
        ready = np.cumsum(gaps * rng.lognormal(0.0, 0.25, 12))[::-1]
        return ready - ready.min(), rate * rng.lognormal(0.0, 0.08)

    def order(steps: int) -> tuple[int, ...]:
        inputs = PlanInputs(steps)
        for _ in range(steps):
            inputs.record(*noisy_step())
        ready, bps = inputs.estimate()
        return tuple(simulate_order(layout, ready, 4 * (256 << 10), bps).tolist())

    single = {order(1) for _ in range(40)}
    medians = {order(PLAN_STEPS) for _ in range(40)}
    assert len(single) == 5 and len(medians) == 2
    a, b = (np.array(o) for o in medians)
    moved = np.flatnonzero(a != b)
    assert len(moved) == 2 and moved[1] == moved[0] + 1  # one partition, one place
