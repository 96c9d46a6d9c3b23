"""Reading lanes: shards dealt once per epoch, the shuffle buffer emits every sample once,
holds at most its capacity, and is a function of its integers alone."""

import numpy as np
import pytest

from chronica.core.streaming import LaneState, deal_lanes


def _drain(lane):
    out = []
    while lane.segments:
        shard, row = lane.next_row
        emitted = lane.offer(shard * 100 + row, row, None)
        assert len(lane.buffer_ids) <= lane.capacity
        if emitted is not None:
            out.append(emitted[0])
    while lane.buffer_ids:
        out.append(lane.drain()[0])
    return out


def test_every_shard_is_dealt_to_exactly_one_lane_and_epochs_differ():
    sizes = [5, 0, 7, 3, 9, 4, 6]
    for w in (1, 2, 3, 8):
        lanes = deal_lanes(sizes, w, seed=1, epoch=0, capacity=4)
        shards = sorted(s for lane in lanes for s, _, _ in lane.segments)
        assert shards == [0, 2, 3, 4, 5, 6] and len(lanes) == w
    orders = [[s for s, _, _ in deal_lanes(sizes, 1, 1, e, 4)[0].segments] for e in range(4)]
    assert len({tuple(o) for o in orders}) > 1


@pytest.mark.parametrize("capacity", [1, 3, 50])
def test_the_buffer_emits_every_sample_exactly_once(capacity):
    lane = LaneState(key=7, capacity=capacity, segments=[[0, 0, 10], [2, 4, 9]])
    out = _drain(lane)
    expected = list(range(10)) + list(range(204, 209))
    assert sorted(out) == expected
    assert (out == expected) == (capacity == 1)
    assert lane.remaining == 0


def test_a_lane_restored_from_its_integers_continues_identically():
    lane = LaneState(key=3, capacity=4, segments=[[1, 0, 20]])
    for _ in range(9):
        lane.offer(100 + lane.next_row[1], 1, None)
    copy = LaneState.from_dict(lane.to_dict())
    assert _drain(copy) == _drain(lane)
    assert "LaneState(next_row=" in repr(copy)


def test_drain_before_the_end_is_refused():
    with pytest.raises(ValueError, match="drain"):
        LaneState(key=1, capacity=2, segments=[[0, 0, 2]]).drain()
    with pytest.raises(ValueError, match="capacity"):
        deal_lanes([1], 1, 0, 0, 0)
    assert np.asarray(deal_lanes([1], 1, 0, 0, 1)[0].key, dtype=np.uint64) > 0


@pytest.mark.parametrize("capacity", [1, 3, 16, 300])
def test_offering_a_block_is_offering_its_samples_one_by_one(capacity):
    """Blocks of any size (across a draw-key block of 1024 too) push out the same samples
    in the same order and leave the same buffer and draws as one ``offer`` per sample."""
    segments = [[2, 0, 700], [0, 5, 1400]]
    one = LaneState(key=7, capacity=capacity, segments=[list(s) for s in segments])
    block = LaneState(key=7, capacity=capacity, segments=[list(s) for s in segments])
    rng = np.random.default_rng(0)
    expected, got = [], []
    while one.segments:
        shard, row = one.next_row
        end = one.segments[0][2]
        rows = min(end - row, int(rng.integers(1, 400)))
        ids = np.arange(shard * 10_000 + row, shard * 10_000 + row + rows, dtype=np.int64)
        lengths = ids % 97
        payloads = [("record", int(i)) for i in ids]
        for i, n, p in zip(ids.tolist(), lengths.tolist(), payloads, strict=True):
            out = one.offer(i, n, p)
            if out is not None:
                expected.append(out)
        out_ids, out_lengths, out_payloads = block.offer_block(ids, lengths, payloads)
        got.extend(zip(out_ids.tolist(), out_lengths.tolist(), out_payloads, strict=True))
        assert block.to_dict() == one.to_dict() and block.payloads == one.payloads
    assert got == expected


@pytest.mark.parametrize("capacity", [1, 5, 64])
def test_payload_arrays_move_as_lists_do_and_a_drained_block_is_drains_one_by_one(capacity):
    """Object-array payloads (records that are lists stay whole) give the same samples,
    buffer and draws as lists; ``drain_block`` is ``drain`` repeated."""
    as_list = LaneState(key=9, capacity=capacity, segments=[[0, 0, 300]])
    as_array = LaneState(key=9, capacity=capacity, segments=[[0, 0, 300]])
    for first in range(0, 300, 70):
        ids = np.arange(first, min(first + 70, 300), dtype=np.int64)
        payloads = [[int(i), "record"] for i in ids]
        array = np.empty(len(payloads), object)
        array[:] = payloads
        a = as_list.offer_block(ids, ids % 13, payloads)
        b = as_array.offer_block(ids, ids % 13, array)
        assert isinstance(b[2], np.ndarray) and b[2].tolist() == a[2]
        assert a[0].tolist() == b[0].tolist() and as_list.to_dict() == as_array.to_dict()
    assert as_array.payloads.tolist() == as_list.payloads
    one = [as_list.drain() for _ in range(min(3, capacity))]
    ids, lengths, payloads = as_array.drain_block(3)
    assert list(zip(ids.tolist(), lengths.tolist(), payloads.tolist(), strict=True)) == one
    assert as_array.to_dict() == as_list.to_dict()
    with pytest.raises(ValueError, match="drain"):
        LaneState(key=1, capacity=2, segments=[[0, 0, 2]]).drain_block(1)


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_a_lane_keeping_no_payloads_moves_the_same_ids_and_lengths(capacity):
    with_payloads = LaneState(key=9, capacity=capacity, segments=[[0, 0, 20]])
    without = LaneState(key=9, capacity=capacity, segments=[[0, 0, 20]], payloads=None)
    for start, stop in ((0, 2), (2, 11), (11, 20)):
        ids, lengths = np.arange(start, stop), np.arange(start, stop) * 3
        a = with_payloads.offer_block(ids, lengths, [str(i) for i in ids.tolist()])
        b = without.offer_block(ids, lengths, None)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist() and b[2] is None
    a, b = with_payloads.drain_block(50), without.drain_block(50)
    assert a[0].tolist() == b[0].tolist() and b[2] is None and without.payloads is None
    assert with_payloads.to_dict() == without.to_dict()
