"""Parquet files read by row group: sizes from footers, reads from any row, random access
equal to the sequential read, records equal to what HF datasets streams, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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


def test_the_row_group_cache_is_bounded_and_left_out_of_a_pickle(tmp_path):
    import pickle

    from chronica.runtime.sources.parquet import CACHED_ROW_GROUPS

    _write(tmp_path / "data", sizes=(40,), row_group_size=2)
    source = ParquetSource(tmp_path / "data", length="tokens")
    whole = [_plain(r) for r in source.read(0)]
    rows = list(range(39, -1, -3))
    assert [_plain(r) for r in source.read_rows(0, rows)] == [whole[r] for r in rows]
    assert len(source._cache) == CACHED_ROW_GROUPS
    copy = pickle.loads(pickle.dumps(source))
    assert not copy._cache and [_plain(r) for r in copy.read_rows(0, [5])] == [whole[5]]


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
