"""The streaming benchmark's throughput part: every reader, alone and through the engine,
reads the same documents (what its side-by-side timing assumes), and the page section
reports every reader with its overhead and CPU per sample, reading MDS by id at four
ranks against buffering its records, and MDS and parquet through DataLoader workers on
both sides."""

from __future__ import annotations

from benchmarks import stream_throughput, streaming


def test_every_reader_alone_and_through_the_engine_reads_every_sample():
    result = stream_throughput.measure(samples=700, repeats=1)  # asserts the counts
    assert [r["reader"] for r in result["readers"]] == list(stream_throughput.READERS)
    for row in result["readers"]:
        assert row["alone"] > 0 and row["chronica"] > 0
        assert row["chronica_cpu_us"] > 0 and set(row["engine_us"]) == set(stream_throughput.PARTS)
        assert row["held_cpu_us"] > 0 and row["pickle_cpu_us"] > 0 and row["unpickle_cpu_us"] > 0
        assert row["engine_us"]["reading"] > 0 and row["engine_us"]["planning"] > 0
        assert len(row["load"]) == 2
    assert len(result["load"]) == 2
    lines = streaming._throughput_lines(result)
    table = [line for line in lines if line.startswith("| ") and line.count("|") == 18]
    assert len(table) == 1 + len(stream_throughput.READERS)
    assert any("`MDSSource`" in line for line in table)
    assert any(line.startswith("Met: the 5% of samples/s for ") for line in lines)
    assert "not in this run" in streaming._throughput_lines(None)[0]
    # Reading MDS by id decodes every sample once; buffered, some twice (on another rank).
    by_id = result["by_id"]
    assert by_id["ranks"] == stream_throughput.RANKS
    assert by_id["by_id"]["decoded"] == 1.0 and by_id["buffered"]["decoded"] > 1.0
    assert by_id["by_id"]["cpu_us"] > 0 and by_id["buffered"]["cpu_us"] > 0
    assert any(line.startswith("Reading by id, MDS at W = 4") for line in lines)
    # Through DataLoader workers: the reader alone against chronica's loader, both sides,
    # one row per reader that reads by id.
    rows = result["in_workers"]
    assert [w["reader"] for w in rows] == list(stream_throughput.WORKER_READERS)
    assert [w["source"] for w in rows] == ["MDSSource", "ParquetSource"]
    for workers in rows:
        assert workers["workers"] == stream_throughput.WORKERS and len(workers["load"]) == 2
        low, high = workers["overhead_range"]
        assert (
            workers["rounds"] == stream_throughput.WORKER_ROUNDS
            and low <= workers["overhead"] <= high
        )
        assert set(workers["added_alone"]) == {"planning", "pickling", "by_id", "order", "collate"}
        assert all(v > 0 for v in workers["added_alone"].values())
        for side in ("alone", "chronica"):
            assert workers[side]["samples_s"] > 0 and workers[side]["main_cpu_us"] > 0
            assert workers[side]["worker_cpu_us"] > 0
    assert any(line.startswith("With DataLoader workers, MDS and parquet") for line in lines)
    assert sum("num_workers=1)` |" in line for line in lines) == 2 * len(rows)
    assert any(line.startswith("parquet: through workers chronica adds") for line in lines)
    # A result written before parquet had a row (MDS's alone, a dictionary) still renders.
    old = {**result, "in_workers": {k: v for k, v in rows[0].items() if k != "reader"}}
    assert sum("num_workers=1)` |" in line for line in streaming._throughput_lines(old)) == 2
