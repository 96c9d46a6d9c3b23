"""jsonl and parquet files streamed by HF datasets: sizes, reads from any row, exactly what
datasets yields, no random access, errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chronica.runtime.sources import ShardedSource, shard_offsets
from chronica.runtime.sources.hf import HFStreamingSource

datasets = pytest.importorskip("datasets")


def _write_jsonl(folder, sizes=(4, 0, 6)):
    folder.mkdir(exist_ok=True)
    for f, size in enumerate(sizes):
        lines = [json.dumps({"tokens": list(range(r + f)), "id": f"{f}-{r}"}) for r in range(size)]
        # A blank line at the end, as many writers leave: not a record.
        (folder / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n\n" if lines else "")


def test_jsonl_records_and_lengths_round_trip(tmp_path):
    _write_jsonl(tmp_path / "data")
    source = HFStreamingSource(tmp_path / "data", length="tokens")
    assert isinstance(source, ShardedSource) and not source.random_access
    assert shard_offsets(source).tolist() == [0, 4, 4, 10]
    records = list(source.read(2))
    assert [r["id"] for r in records] == [f"2-{r}" for r in range(6)]
    assert [source.length(r) for r in records] == [2, 3, 4, 5, 6, 7]
    assert list(source.read(1)) == []


@pytest.mark.parametrize("start", [0, 2, 5, 6])
def test_a_read_from_any_row_equals_the_tail_of_the_whole_read(tmp_path, start):
    _write_jsonl(tmp_path / "data")
    source = HFStreamingSource(tmp_path / "data", length="tokens")
    assert list(source.read(2, start=start)) == list(source.read(2))[start:]


def test_records_are_what_datasets_streams(tmp_path):
    _write_jsonl(tmp_path / "data", sizes=(5,))
    path = str(tmp_path / "data" / "part-0.jsonl")
    theirs = datasets.load_dataset("json", data_files=[path], split="train", streaming=True)
    assert list(HFStreamingSource([path], length="tokens").read(0)) == list(theirs)


def test_parquet_files_and_selected_columns(tmp_path):
    table = pa.table({"tokens": [[1, 2], [3], [4, 5, 6]], "meta": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    source = HFStreamingSource([tmp_path / "a.parquet"], length="tokens", columns=["tokens"])
    assert source.builder == "parquet" and source.shard_size(0) == 3
    assert list(source.read(0, start=1)) == [{"tokens": [3]}, {"tokens": [4, 5, 6]}]


def test_no_random_access_names_the_all_to_all_path(tmp_path):
    _write_jsonl(tmp_path / "data")
    with pytest.raises(NotImplementedError, match="all-to-all"):
        HFStreamingSource(tmp_path / "data", length="tokens").read_rows(0, [1])


def test_errors_name_the_argument_and_the_fix(tmp_path):
    _write_jsonl(tmp_path / "data")
    pq.write_table(pa.table({"tokens": [[1]]}), tmp_path / "data" / "z.parquet")
    with pytest.raises(ValueError, match=r"all be \.jsonl or all \.parquet"):
        HFStreamingSource(tmp_path / "data", length="tokens")
    with pytest.raises(FileNotFoundError, match=r"files=.* is not a folder"):
        HFStreamingSource(tmp_path / "nope", length="tokens")
    jsonl = sorted((tmp_path / "data").glob("*.jsonl"))
    with pytest.raises(ValueError, match=r"length='tokens' is not in columns \['id'\]"):
        HFStreamingSource(jsonl, length="tokens", columns=["id"])
    with pytest.raises(ValueError, match="start=5"):
        HFStreamingSource(jsonl, length="tokens").read(0, start=5)
    with pytest.raises(ValueError, match="columns="):
        list(HFStreamingSource(jsonl, length=len, columns=["nope"]).read(0))
    assert "builder='json'" in repr(HFStreamingSource(jsonl, length="tokens"))
