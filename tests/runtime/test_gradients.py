"""chronica.runtime.gradients: the plan record and its views, and the step history behind
every gradient shim's stats(), without any framework."""

import numpy as np
import pytest

from chronica.core.priority import bucket_layout, build_layout
from chronica.runtime.gradients import GradientViews, PlanRecord, StepHistory


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
