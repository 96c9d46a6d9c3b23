"""Parquet files read by row group: sizes from footers, reads from any row, random access
equal to the sequential read, records equal to what HF datasets streams, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stream_formats import assert_lengths_match_records

from chronica.runtime.sources import ShardedSource, shard_offsets
from chronica.runtime.sources.parquet import ParquetSource, batch_records


def _write(folder, sizes=(7, 0, 12), row_group_size=3):
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    rows = []
    for f, size in enumerate(sizes):
        lengths = rng.integers(1, 9, size=size)
        table = pa.table(
            {
                "tokens": pa.array([list(range(n)) for n in lengths], pa.list_(pa.int32())),
                "n": pa.array(lengths, pa.int64()),
                "text": [f"file {f} row {r}" for r in range(size)],
            }
        )
        pq.write_table(table, folder / f"part-{f:02d}.parquet", row_group_size=row_group_size)
        rows.append(lengths.tolist())
    return rows


def _plain(record: dict) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in record.items()}


def test_sizes_lengths_and_records_round_trip(tmp_path):
    lengths = _write(tmp_path / "data")
    source = ParquetSource(tmp_path / "data", length="tokens")
    assert isinstance(source, ShardedSource) and source.random_access
    assert [source.shard_size(s) for s in range(3)] == [7, 0, 12]
    assert shard_offsets(source).tolist() == [0, 7, 7, 19]
    for s in range(3):
        records = list(source.read(s))
        assert [source.length(r) for r in records] == lengths[s]
        assert [r["text"] for r in records] == [f"file {s} row {i}" for i in range(len(records))]
    assert (
        ParquetSource(tmp_path / "data", length="n").length(next(source.read(0))) == lengths[0][0]
    )


@pytest.mark.parametrize("start", [0, 1, 3, 5, 11, 12])
def test_a_read_from_any_row_equals_the_tail_of_the_whole_read(tmp_path, start):
    _write(tmp_path / "data")
    source = ParquetSource(tmp_path / "data", length="tokens")
    whole = [_plain(r) for r in source.read(2)]
    assert [_plain(r) for r in source.read(2, start=start)] == whole[start:]


def test_random_access_equals_the_sequential_read(tmp_path):
    _write(tmp_path / "data")
    source = ParquetSource(tmp_path / "data", length="tokens", columns=["tokens", "n"])
    whole = [_plain(r) for r in source.read(2)]
    rows = [11, 0, 5, 5, 3]
    assert [_plain(r) for r in source.read_rows(2, rows)] == [whole[r] for r in rows]
    assert set(whole[0]) == {"tokens", "n"}


@pytest.mark.parametrize("rows", [[4, 3, 5, 3], [11, 0, 5, 5, 3, 9], [2, 1, 0], []])
def test_read_rows_decodes_each_row_group_touched_once_in_ascending_order(
    tmp_path, monkeypatch, rows
):
    _write(tmp_path / "data")
    source = ParquetSource(tmp_path / "data", length="tokens", cached_rows=1)
    whole = [_plain(r) for r in ParquetSource(tmp_path / "data", length="tokens").read(2)]
    decoded = []
    decode = ParquetSource._decode
    monkeypatch.setattr(
        ParquetSource, "_decode", lambda self, s, g: decoded.append(g) or decode(self, s, g)
    )
    assert [_plain(r) for r in source.read_rows(2, rows)] == [whole[r] for r in rows]
    assert decoded == sorted({r // 3 for r in rows})  # row groups of 3 rows


def test_the_row_group_cache_is_bounded_by_rows_and_left_out_of_a_pickle(tmp_path):
    import pickle

    _write(tmp_path / "data", sizes=(40,), row_group_size=2)
    source = ParquetSource(tmp_path / "data", length="tokens", cached_rows=5)
    whole = [_plain(r) for r in source.read(0)]
    rows = list(range(39, -1, -3))
    assert [_plain(r) for r in source.read_rows(0, rows)] == [whole[r] for r in rows]
    assert len(source._cache) == 2  # two row groups of 2 rows: 4 rows <= 5 < 6
    copy = pickle.loads(pickle.dumps(source))
    assert not copy._cache and [_plain(r) for r in copy.read_rows(0, [5])] == [whole[5]]
    assert "cached_rows=5" in repr(copy)
    small = ParquetSource(tmp_path / "data", length="tokens", cached_rows=1)
    assert [_plain(r) for r in small.read_rows(0, [3, 0])] == [whole[3], whole[0]]
    assert len(small._cache) == 1  # the row group used last stays, whatever its rows
    with pytest.raises(ValueError, match="cached_rows=0"):
        ParquetSource(tmp_path / "data", length="tokens", cached_rows=0)


def test_records_equal_what_hf_datasets_streams(tmp_path):
    datasets = pytest.importorskip("datasets")
    _write(tmp_path / "data", sizes=(9,))
    path = str(tmp_path / "data" / "part-00.parquet")
    theirs = datasets.load_dataset("parquet", data_files=[path], split="train", streaming=True)
    ours = ParquetSource([path], length="tokens")
    assert [_plain(r) for r in ours.read(0)] == list(theirs)


def test_batch_records_reads_sliced_and_large_list_columns():
    batch = pa.record_batch(
        {"t": pa.array([[1], [2, 3], None, [4]], pa.large_list(pa.int64())), "k": [1, 2, 3, 4]}
    ).slice(1)
    assert [_plain(r) for r in batch_records(batch)] == [
        {"t": [2, 3], "k": 2},
        {"t": [], "k": 3},
        {"t": [4], "k": 4},
    ]


def test_errors_name_the_argument_and_the_fix(tmp_path):
    _write(tmp_path / "data")
    with pytest.raises(FileNotFoundError, match=r"files=.* is not a folder"):
        ParquetSource(tmp_path / "missing", length="tokens")
    with pytest.raises(ValueError, match=r"holds no file ending with \.parquet"):
        ParquetSource(tmp_path, length="tokens")
    with pytest.raises(FileNotFoundError, match="not a file"):
        ParquetSource([tmp_path / "nope.parquet"], length="tokens")
    with pytest.raises(ValueError, match=r"length='ids' is not in its columns \['tokens'"):
        ParquetSource(tmp_path / "data", length="ids")
    with pytest.raises(ValueError, match=r"names \['x'\]"):
        ParquetSource(tmp_path / "data", length="tokens", columns=["tokens", "x"])
    with pytest.raises(TypeError, match="columns='tokens'"):
        ParquetSource(tmp_path / "data", length="tokens", columns="tokens")
    source = ParquetSource(tmp_path / "data", length="tokens")
    with pytest.raises(ValueError, match="start=8"):
        source.read(0, start=8)
    with pytest.raises(ValueError, match="shard=3"):
        source.shard_size(3)
    assert "num_shards=3" in repr(source)


@pytest.mark.parametrize("length", ["tokens", "n", "text"])
def test_lengths_read_without_records_equal_the_records_lengths(tmp_path, length):
    # Row groups of 3 rows: files of 7 and 12 rows end with a partial one (and one is empty).
    _write(tmp_path / "data")
    source = ParquetSource(tmp_path / "data", length=length)
    assert source.lengths_without_records == (length in ("tokens", "n"))
    assert_lengths_match_records(source)
    with pytest.raises(ValueError, match=r"rows 5 \.\. 7 are not rows of shard 0 \(7 rows\)"):
        source.read_lengths(0, 5, 3)
    with pytest.raises(ValueError, match="not rows of shard 2"):
        source.read_lengths(2, -1, 2)


def test_a_lanes_consecutive_reads_read_each_row_groups_column_once(tmp_path, monkeypatch):
    from chronica.runtime.sources import parquet

    _write(tmp_path / "data", sizes=(40,), row_group_size=6)
    source = ParquetSource(tmp_path / "data", length="tokens")
    read, real = [], parquet.column_lengths
    monkeypatch.setattr(parquet, "column_lengths", lambda c: read.append(c) or real(c))
    got = [source.read_lengths(0, row, min(4, 40 - row)) for row in range(0, 40, 4)]
    assert np.concatenate(got).tolist() == [source.length(r) for r in source.read(0)]
    assert len(read) == 7  # the 7 row groups, each once
    assert all(c.type == pa.list_(pa.int32()) for c in read)  # the length column alone


def test_column_lengths_are_what_the_records_give():
    from chronica.runtime.sources.parquet import column_lengths

    columns = [
        pa.array([[1], [2, 3], None, [4, 5, 6]], pa.list_(pa.int32())).slice(1),
        pa.array([[1, 2], None, []], pa.large_list(pa.int64())),
        pa.array([[1, 2], [3, 4]], pa.list_(pa.int8(), 2)),
        pa.array([b"ab", b"", b"xyz"]),
        pa.array([b"ab"], pa.large_binary()),
        pa.array([3, 0, 9], pa.uint16()),
    ]
    for column in columns:
        records = batch_records(pa.record_batch({"c": column}))
        got = column_lengths(pa.chunked_array([column, column]))
        assert got.dtype == np.int64
        assert got.tolist() == [len(r["c"]) if not isinstance(r["c"], int) else r["c"]
                                for r in records * 2]  # fmt: skip
    # Only the records can say: text (its len counts characters) and nulls but a list's.
    for column in (pa.array(["é"]), pa.array([1, None]), pa.array([b"a", None])):
        assert column_lengths(column) is None


def test_a_null_length_is_the_records_error(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.table({"n": pa.array([1, None, 3], pa.int64())}), folder / "a.parquet")
    source = ParquetSource(folder, length="n")
    assert source.lengths_without_records  # the type says so; the null is found on reading
    assert source.read_lengths(0, 2, 1).tolist() == [3]  # its row group holds the null
    with pytest.raises(TypeError, match="column 'n' holds NoneType"):
        source.read_lengths(0, 0, 2)
