"""ReadingLane: a lane read from its source in blocks gives every sample once, with its
record and length, in the order the lane's buffer gives one sample at a time."""

import numpy as np
import pytest

from chronica.core.streaming import LaneState, deal_lanes
from chronica.runtime.sources import ListSource, shard_offsets
from chronica.runtime.streaming_lane import ReadingLane


def _lengths(records):
    return np.array([len(r) for r in records], np.int64)


def _one_by_one(lane, source, offsets):
    """The reference: every row offered alone, then the buffer drained one at a time."""
    out = []
    while lane.segments:
        shard, row = lane.next_row
        record = source.read_rows(shard, [row])[0]
        pushed = lane.offer(int(offsets[shard]) + row, len(record), record)
        if pushed is not None:
            out.append(pushed)
    while lane.buffer_ids:
        out.append(lane.drain())
    return out


@pytest.mark.parametrize(("share", "capacity"), [(5, 1), (7, 4), (64, 16), (1000, 300)])
def test_blocks_give_the_samples_one_at_a_time_reading_gives(share, capacity):
    rng = np.random.default_rng(share)
    shards = [[b"x" * int(n) for n in rng.integers(1, 30, size)] for size in (40, 0, 75, 9)]
    source = ListSource(shards)
    offsets = shard_offsets(source)
    sizes = np.diff(offsets)
    expected = _one_by_one(deal_lanes(sizes, 1, 5, 0, capacity)[0], source, offsets)
    lane = ReadingLane(deal_lanes(sizes, 1, 5, 0, capacity)[0], source, offsets)
    got = []
    while lane.state.remaining:
        ids, lengths, records = lane.take((share, 0), _lengths)
        assert ids.dtype == lengths.dtype == np.int64 and records.dtype == object
        got.extend(zip(ids.tolist(), lengths.tolist(), records.tolist(), strict=True))
    assert got == expected
    assert sorted(i for i, _, _ in got) == list(range(int(offsets[-1])))
    assert "ReadingLane(LaneState(" in repr(lane)


def test_a_share_of_tokens_stops_once_met_and_a_restored_lane_continues():
    source = ListSource([[b"ab"] * 30])
    offsets = shard_offsets(source)
    lane = ReadingLane(deal_lanes([30], 1, 1, 0, 4)[0], source, offsets)
    ids, lengths, _ = lane.take((0, 9), _lengths)
    assert lengths.sum() >= 9 and lengths[:-1].sum() < 9
    saved = LaneState.from_dict(lane.state.to_dict())
    saved.payloads = source.read_rows(0, [i - int(offsets[0]) for i in saved.buffer_ids])
    again = ReadingLane(saved, source, offsets)
    rest = [lane.take((1000, 0), _lengths)[0].tolist() for lane in (lane, again)]
    assert rest[0] == rest[1] and sorted(ids.tolist() + rest[0]) == list(range(30))


@pytest.mark.parametrize(("share", "capacity"), [(5, 1), (64, 16), (1000, 300)])
def test_a_lane_reading_lengths_alone_gives_the_same_samples_and_keeps_no_records(share, capacity):
    rng = np.random.default_rng(share)
    shards = [[b"x" * int(n) for n in rng.integers(1, 30, size)] for size in (40, 0, 75, 9)]
    source = ListSource(shards)
    offsets = shard_offsets(source)
    sizes = np.diff(offsets)
    lanes = [
        ReadingLane(deal_lanes(sizes, 1, 5, 0, capacity)[0], source, offsets),
        ReadingLane(
            deal_lanes(sizes, 1, 5, 0, capacity)[0], source, offsets,
            read_lengths=lambda s, row, n: _lengths(shards[s][row : row + n]),
        ),
    ]  # fmt: skip
    taken: list[list[tuple[int, int]]] = [[], []]
    for lane, out in zip(lanes, taken, strict=True):
        while lane.state.remaining:
            ids, lengths, records = lane.take((share, 0), _lengths)
            assert (records is None) == (lane is lanes[1])
            out.extend(zip(ids.tolist(), lengths.tolist(), strict=True))
    assert taken[0] == taken[1] and lanes[1].state.payloads is None
