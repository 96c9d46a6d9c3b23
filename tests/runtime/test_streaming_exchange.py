"""The engine's collectives over threads and records fetched by id, with and without
random access."""

import threading

import pytest
from stream_source import ListSource

from chronica.runtime.sources import shard_offsets
from chronica.runtime.streaming_exchange import Collectives, LocalGroup, fetch_records


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
