"""StreamMicroBatch: built by field, sent without records and given them back, pickled
whole; StreamStats' CPU accounts."""

import pickle

import numpy as np
import pytest

from chronica.runtime.streaming_batch import CPU_PARTS, StreamMicroBatch, StreamStats


def _batch(records):
    ids = np.array([4, 9], np.int64)
    return StreamMicroBatch.of(
        records=records, ids=ids, lengths=np.array([3, 5], np.int64),
        rows=np.zeros(2, np.int64), epoch=1, step=6, micro=0, num_micro=2, loss_weight=0.25,
    )  # fmt: skip


def test_a_plan_without_records_gets_them_back_and_pickles_whole():
    planned = _batch([])
    full = pickle.loads(pickle.dumps(planned)).with_records(["a", "b"])
    assert full.records == ["a", "b"] and planned.records == []
    assert full.ids.tolist() == [4, 9] and (full.step, full.micro, full.loss_weight) == (6, 0, 0.25)
    assert repr(full) == "StreamMicroBatch(epoch=1, step=6, micro=0/2, samples=2, tokens=8)"
    with pytest.raises(ValueError, match="got 1 records"):
        planned.with_records(["a"])
    with pytest.raises(AttributeError):
        full.step = 7  # frozen


@pytest.mark.parametrize("records", [[], ["a", {"tokens": [1, 2]}]])
def test_a_pickled_batch_equals_the_batch(records):
    """Every field back, its arrays ``int64`` and writable (a worker may sort or edit them),
    records too where it holds them; an empty micro-batch as well."""
    empty = dict.fromkeys(("ids", "lengths", "rows"), np.zeros(0, np.int64))
    for batch in (_batch(records), StreamMicroBatch.of(**(_batch([]).__dict__ | empty))):
        back = pickle.loads(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
        assert back.__dict__.keys() == batch.__dict__.keys()
        for name, value in batch.__dict__.items():
            got = getattr(back, name)
            if isinstance(value, np.ndarray):
                assert got.dtype == np.int64 and got.flags.writeable
                assert got.tolist() == value.tolist(), name
            else:
                assert got == value, name


def test_a_batch_sent_through_a_multiprocessing_queue_keeps_its_place_exactly():
    """The DataLoader's index queue pickles with ``ForkingPickler``; a place given as numpy
    scalars (a plan's counts) comes back equal, the loss weight to the bit."""
    from multiprocessing.reduction import ForkingPickler

    weight = np.float64(1) / 3
    place = {"epoch": 2**40, "step": np.int64(7), "num_micro": np.int64(3), "loss_weight": weight}
    batch = StreamMicroBatch.of(**(_batch([]).__dict__ | place))
    back = pickle.loads(ForkingPickler.dumps(batch))
    assert (back.epoch, back.step, back.micro, back.num_micro) == (2**40, 7, 0, 3)
    assert back.loss_weight == weight and back.ids.tolist() == [4, 9]


def test_a_plan_as_bytes_comes_back_whole_and_takes_its_records():
    batch = _batch(["a", "b"])
    data = batch.plan_bytes()
    assert type(data) is bytes
    plan = StreamMicroBatch.from_plan_bytes(data)
    assert plan.records == [] and plan.ids.flags.writeable and plan.ids.dtype == np.int64
    full = StreamMicroBatch.from_plan_bytes(data, ["a", "b"])
    for name, value in batch.__dict__.items():
        got = getattr(full, name)
        assert (got.tolist() == value.tolist()) if isinstance(value, np.ndarray) else got == value
    with pytest.raises(TypeError, match="bytes plan_bytes"):
        StreamMicroBatch.from_plan_bytes(batch)


def test_stats_count_every_cpu_part():
    stats = StreamStats()
    assert set(stats.cpu) == set(CPU_PARTS) and not any(stats.cpu.values())
