"""The engine's collectives over threads and records fetched by id, with and without
random access."""

import threading

import numpy as np
import pytest
from stream_source import ListSource

from chronica.runtime.sources import shard_offsets
from chronica.runtime.streaming_exchange import (
    Collectives,
    LocalGroup,
    decode,
    encode,
    fetch_records,
)


def test_local_group_gathers_and_exchanges_in_rank_order():
    group = LocalGroup(3)
    out = [None] * 3

    def run(r):
        rank = group.rank(r)
        assert isinstance(rank, Collectives)
        gathered = rank.allgather(bytes([r]))
        swapped = rank.alltoall([bytes([r, d]) for d in range(3)])
        out[r] = (gathered, swapped)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(3):
        assert out[r][0] == [b"\x00", b"\x01", b"\x02"]
        assert out[r][1] == [bytes([s, r]) for s in range(3)]
    with pytest.raises(ValueError, match="rank"):
        group.rank(3)


@pytest.mark.parametrize("random_access", [True, False])
def test_fetch_records_reads_the_wanted_ids(random_access):
    source = ListSource([[3, 4], [], [5, 6, 7]], random_access=random_access)
    offsets = shard_offsets(source)
    assert offsets.tolist() == [0, 2, 2, 5]
    records = fetch_records(source, offsets, [4, 0, 3, 4])
    assert sorted(records) == [0, 3, 4]
    assert [records[i]["id"] for i in (0, 3, 4)] == [0, 3, 4]
    assert records[4]["input_ids"].shape[0] == 7


def test_records_travel_as_data_and_come_back_equal():
    record = {
        "input_ids": np.arange(6, dtype=np.int32).reshape(2, 3),
        "mask": np.array([True, False]),
        "score": np.float16(0.5),
        "n": np.int64(7),
        "scalar": np.array(3.5),
        "text": "héllo",
        "raw": b"\x00\x01",
        "meta": {"tags": [1, "a", None], "ok": True},
    }
    back = decode(encode([(4, record)]))
    assert back[0][0] == 4
    got = back[0][1]
    assert got.keys() == record.keys()
    for key in ("input_ids", "mask", "scalar"):
        assert got[key].dtype == record[key].dtype and got[key].shape == record[key].shape
        assert np.array_equal(got[key], record[key])
        assert got[key].flags.writeable
    for key in ("score", "n"):
        assert type(got[key]) is type(record[key]) and got[key] == record[key]
    assert got["text"] == "héllo" and got["raw"] == b"\x00\x01" and got["meta"] == record["meta"]


def test_what_is_not_plain_data_is_refused_before_it_travels():
    with pytest.raises(TypeError, match="plain data"):
        encode({"model": object()})
    with pytest.raises(TypeError, match="plain data"):
        encode({"objects": np.array([object()])})
