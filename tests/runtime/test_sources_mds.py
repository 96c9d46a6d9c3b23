"""MDS shards read without mosaicml-streaming: a dataset its MDSWriter wrote, read back
exactly; written and read round trips; reads from a row; random access; errors."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from stream_formats import assert_lengths_match_records

from chronica.runtime.sources import ShardedSource, shard_offsets
from chronica.runtime.sources.mds import MDSSource, write_mds

# Written by mosaicml-streaming 0.13's MDSWriter (size_limit=1000, no compression) from the
# records of ``_reference_record``; see tests/runtime/data/README.md.
WRITTEN_BY_STREAMING = Path(__file__).parent / "data" / "mds_streaming_0_13"
COLUMNS = {"tokens": "ndarray:int32", "n": "int", "text": "str", "blob": "bytes"}
COLUMNS |= {"meta": "json", "w": "float32"}


def _reference_record(i: int) -> dict:
    return {
        "tokens": np.arange(i + 1, dtype=np.int32) * 7,
        "n": i + 1,
        "text": f"doc {i} é",
        "blob": bytes([i]) * (i % 4),
        "meta": {"i": i, "odd": i % 2 == 1},
        "w": np.float32(i / 4),
    }


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _records(source: MDSSource) -> list[dict]:
    return [r for s in range(source.num_shards) for r in source.read(s)]


def test_reads_what_mosaic_streaming_wrote():
    source = MDSSource(WRITTEN_BY_STREAMING, length="tokens")
    assert isinstance(source, ShardedSource)
    assert [source.shard_size(s) for s in range(source.num_shards)] == [8, 5]
    records = _records(source)
    assert all(_equal(r, _reference_record(i)) for i, r in enumerate(records))
    assert [source.length(r) for r in records] == list(range(1, 14))
    assert type(records[0]["n"]) is int and records[0]["tokens"].dtype == np.int32


def test_writes_the_samples_mosaic_streaming_writes(tmp_path):
    # Same records, same shards: every sample's bytes equal (only the writer's config,
    # which names its size_limit, differs).
    write_mds(
        tmp_path, [[_reference_record(i) for i in r] for r in (range(8), range(8, 13))], COLUMNS
    )
    for name in ("shard.00000.mds", "shard.00001.mds"):
        ours, theirs = (d.joinpath(name).read_bytes() for d in (tmp_path, WRITTEN_BY_STREAMING))
        cut = b'"version": 2}'
        assert ours[ours.index(cut) :] == theirs[theirs.index(cut) :]


def test_round_trip_with_every_decoded_encoding(tmp_path):
    columns = {
        "a": "ndarray",  # dtype and shape stored per sample
        "b": "ndarray:float16:2,3",  # both fixed
        "c": "uint16",
        "d": "str_int",
        "e": "str_float",
        "f": "int64",
    }
    rng = np.random.default_rng(0)
    shards = [
        [
            {
                "a": rng.integers(0, 9, size=(k + 1, 300)).astype(np.int64),
                "b": rng.random((2, 3)).astype(np.float16),
                "c": np.uint16(k),
                "d": 10**20 + k,
                "e": 0.5 + k,
                "f": np.int64(-k),
            }
            for k in range(n)
        ]
        for n in (3, 0, 5)
    ]
    write_mds(tmp_path, shards, columns)
    source = MDSSource(tmp_path, length=lambda r: r["a"].size)
    assert [source.shard_size(s) for s in range(3)] == [3, 0, 5]
    assert list(source.read(1)) == []
    flat = [r for shard in shards for r in shard]
    assert all(_equal(a, b) for a, b in zip(_records(source), flat, strict=True))
    assert source.length(flat[0]) == 300


def test_a_read_from_a_row_and_random_access_equal_the_sequential_read():
    source = MDSSource(WRITTEN_BY_STREAMING, length="n")
    whole = list(source.read(0))
    assert all(_equal(a, b) for a, b in zip(source.read(0, start=5), whole[5:], strict=True))
    assert list(source.read(0, start=8)) == []
    rows = [7, 0, 3, 3]
    assert all(_equal(a, whole[r]) for a, r in zip(source.read_rows(0, rows), rows, strict=True))
    assert shard_offsets(source).tolist() == [0, 8, 13]


def test_records_read_by_global_id_equal_those_read_in_shard_order():
    from chronica.runtime.sources import read_ids

    source = MDSSource(WRITTEN_BY_STREAMING, length="n")
    whole = _records(source)
    ids = np.random.default_rng(3).integers(0, len(whole), 200).tolist()
    records = read_ids(source, shard_offsets(source), ids)
    assert all(_equal(a, whole[i]) for a, i in zip(records, ids, strict=True))
    assert all(
        type(a[k]) is type(whole[i][k]) for a, i in zip(records, ids, strict=True) for k in a
    )
    assert not any(r["tokens"].flags.writeable for r in records)  # views of the file


@pytest.mark.parametrize("length", ["tokens", "n", "blob", "text", "meta"])
def test_lengths_read_without_records_equal_the_records_lengths(length):
    source = MDSSource(WRITTEN_BY_STREAMING, length=length)
    assert source.lengths_without_records == (length in ("tokens", "n", "blob"))
    assert_lengths_match_records(source)
    with pytest.raises(ValueError, match="not rows of shard 1"):
        source.read_lengths(1, 3, 3)


def test_only_the_columns_asked_for_are_decoded():
    source = MDSSource(WRITTEN_BY_STREAMING, length="n", columns=["n", "text"])
    assert next(source.read(1)) == {"n": 9, "text": "doc 8 é"}


def test_the_source_pickles_and_reads_in_the_copy():
    source = MDSSource(WRITTEN_BY_STREAMING, length="tokens")
    next(source.read(1))
    copy = pickle.loads(pickle.dumps(source))
    assert [r["n"] for r in copy.read(1, start=3)] == [12, 13]
    assert "num_shards=2" in repr(copy)


def test_many_shards_stay_readable_past_the_open_shard_limit(tmp_path):
    write_mds(tmp_path, [[{"n": s}] for s in range(40)], {"n": "int"})
    source = MDSSource(tmp_path, length="n")
    readers = [source.read(s) for s in range(40)]
    assert [next(r)["n"] for r in readers] == list(range(40))


def test_errors_name_the_argument_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"directory=.*not a folder"):
        MDSSource(tmp_path / "missing", length="n")
    with pytest.raises(FileNotFoundError, match=r"has no index.json"):
        MDSSource(tmp_path, length="n")
    with pytest.raises(TypeError, match="directory="):
        MDSSource(3, length="n")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"length='tokens' is not in columns \['n'\]"):
        MDSSource(WRITTEN_BY_STREAMING, length="tokens", columns=["n"])
    with pytest.raises(ValueError, match=r"columns=\['nope'\] names \['nope'\]"):
        MDSSource(WRITTEN_BY_STREAMING, length="n", columns=["nope"])
    with pytest.raises(ValueError, match="'tokens' is not in the record"):
        MDSSource(WRITTEN_BY_STREAMING, length="tokens").length({"n": 1})
    with pytest.raises(TypeError, match="length=3"):
        MDSSource(WRITTEN_BY_STREAMING, length=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="columns='n'"):
        MDSSource(WRITTEN_BY_STREAMING, length="n", columns="n")
    with pytest.raises(ValueError, match="start=9"):
        MDSSource(WRITTEN_BY_STREAMING, length="n").read(0, start=9)


def test_errors_for_a_damaged_or_unsupported_dataset(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(WRITTEN_BY_STREAMING, data)
    index = json.loads((data / "index.json").read_text())
    (data / "shard.00001.mds").write_bytes((data / "shard.00001.mds").read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        list(MDSSource(data, length="n").read(1))
    (data / "shard.00001.mds").unlink()
    with pytest.raises(FileNotFoundError, match="copy the whole dataset"):
        list(MDSSource(data, length="n").read(1))
    index["shards"][1]["zip_data"] = {"basename": "shard.00001.mds.zstd"}
    index["shards"][1]["compression"] = "zstd"
    (data / "index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="compression=None"):
        MDSSource(data, length="n").read_rows(1, [0])
    index["shards"][0]["column_encodings"][0] = "jpeg"
    (data / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"column 'blob'.*leave the column out"):
        MDSSource(data, length="n")
    assert MDSSource(data, length="n", columns=["n"]).read_rows(0, [2]) == [{"n": 3}]
    index["version"] = 1
    (data / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="index version 2"):
        MDSSource(data, length="n")


def test_pickle_columns_are_refused_unless_left_out(tmp_path):
    write_mds(tmp_path, [[{"obj": {"a": [1, 2]}, "n": 1}]], {"obj": "json", "n": "int"})
    index = json.loads((tmp_path / "index.json").read_text())
    shard = index["shards"][0]
    shard["column_encodings"][shard["column_names"].index("obj")] = "pkl"  # a pickled column
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"column 'obj'.*never unpickles.*columns="):
        MDSSource(tmp_path, length="n")
    assert MDSSource(tmp_path, length="n", columns=["n"]).read_rows(0, [0]) == [{"n": 1}]


def test_write_mds_refuses_an_existing_dataset_and_incomplete_records(tmp_path):
    write_mds(tmp_path, [[{"n": 1}]], {"n": "int"})
    with pytest.raises(ValueError, match=r"already holds an index.json"):
        write_mds(tmp_path, [[{"n": 1}]], {"n": "int"})
    with pytest.raises(ValueError, match=r"lacks columns \['n'\]"):
        write_mds(tmp_path / "b", [[{"m": 1}]], {"n": "int"})


def test_mosaic_streaming_reads_what_write_mds_wrote(tmp_path):
    # Where mosaicml-streaming imports (its torchvision import loads), its own reader
    # reads chronica's files the same.
    try:
        from streaming import LocalDataset
    except Exception as error:  # torchvision fails to load beside the CPU torch wheel
        pytest.skip(f"mosaicml-streaming does not import here: {error!r}")
    records = [_reference_record(i) for i in range(5)]
    write_mds(tmp_path, [records[:2], records[2:]], COLUMNS)
    theirs = LocalDataset(str(tmp_path))
    assert all(_equal(dict(theirs[i]), records[i]) for i in range(5))
