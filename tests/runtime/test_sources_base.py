"""The source protocol's helpers and the in-memory source: global ids, checks, errors."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from chronica.runtime.sources import ListSource, ShardedSource, locate, shard_offsets
from chronica.runtime.sources.base import (
    check_rows,
    column_length,
    no_random_access,
    record_length,
    record_lengths,
)

SHARDS = [[{"tokens": np.arange(n)} for n in sizes] for sizes in ([3, 1], [], [4, 2, 5])]


def test_global_ids_are_prefix_sums_of_the_shard_sizes():
    source = ListSource(SHARDS, length="tokens")
    offsets = shard_offsets(source)
    assert offsets.tolist() == [0, 2, 2, 5]
    ids = [offsets[s] + row for s in range(3) for row in range(source.shard_size(s))]
    assert ids == list(range(5))
    assert [locate(offsets, i) for i in ids] == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]


def test_locate_rejects_an_id_past_the_stream():
    with pytest.raises(ValueError, match="sample=5"):
        locate(np.array([0, 2, 2, 5]), 5)


def test_list_source_follows_the_protocol_and_reads_from_any_row():
    source = ListSource(SHARDS, length="tokens")
    assert isinstance(source, ShardedSource)
    assert source.random_access and source.num_shards == 3
    lengths = [source.length(r) for r in source.read(2)]
    assert lengths == [4, 2, 5]
    assert [source.length(r) for r in source.read(2, start=1)] == [2, 5]
    assert list(source.read(2, start=3)) == []
    assert source.read_rows(2, [2, 0, 2]) == [SHARDS[2][2], SHARDS[2][0], SHARDS[2][2]]
    assert pickle.loads(pickle.dumps(list(source.read(0))))[1]["tokens"].tolist() == [0]
    assert "sizes=[2, 0, 3]" in repr(source)


def test_list_source_with_a_length_function():
    source = ListSource([[b"abc", b""]])
    assert [source.length(r) for r in source.read(0)] == [3, 0]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda s: s.shard_size(3), ValueError, "shard=3"),
        (lambda s: s.read(-1), ValueError, "shard=-1"),
        (lambda s: s.read("0"), TypeError, "shard="),
        (lambda s: s.read(0, start=3), ValueError, "start=3"),
        (lambda s: s.read_rows(0, [2]), ValueError, "the shard has 2 rows"),
        (lambda s: s.read_rows(0, 1), TypeError, "rows="),
        (lambda s: s.read_rows(0, [1.0]), TypeError, "integers"),
    ],
)
def test_bad_arguments_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call(ListSource(SHARDS, length="tokens"))


def test_bad_construction_names_the_argument():
    with pytest.raises(ValueError, match="at least one shard"):
        ListSource([])
    with pytest.raises(TypeError, match=r"shards\[1\]"):
        ListSource([[1], 2])
    with pytest.raises(TypeError, match="length"):
        ListSource([[1]], length=3)


def test_column_length_reads_a_length_or_a_size_and_names_missing_columns():
    assert column_length({"n": np.int32(7)}, "n") == 7
    assert column_length({"n": np.array(7)}, "n") == 7
    assert column_length({"t": "héllo"}, "t") == 5
    with pytest.raises(ValueError, match="'tokens' is not in the record"):
        column_length({"text": "a"}, "tokens")
    with pytest.raises(TypeError, match="neither an integer"):
        column_length({"x": 1.5}, "x")


RECORDS = [
    {"t": [1, 2, 3]},
    {"t": b"ab"},
    {"t": "héllo"},
    {"t": np.arange(4)},
    {"t": (1,)},
    {"t": 7},
    {"t": np.int64(6)},
    {"t": np.array(5)},
]


@pytest.mark.parametrize("block", [RECORDS[:5], RECORDS, RECORDS[5:], []])
def test_record_lengths_of_a_block_equal_one_record_length_each(block):
    expected = [record_length(r, "t") for r in block]
    assert record_lengths(block, "t").tolist() == expected
    assert record_lengths(block, len).dtype == np.int64


@pytest.mark.parametrize(
    "block, error, words",
    [
        ([{"t": [1]}, {"u": [1]}], ValueError, "'t' is not in the record"),
        ([{"t": [1]}, [1, 2]], TypeError, "mapping"),
        ([{"t": [1]}, {"t": 1.5}], TypeError, "neither an integer"),
        ([{"t": True}], TypeError, "neither an integer"),
    ],
)
def test_record_lengths_raise_what_one_record_length_raises(block, error, words):
    with pytest.raises(error, match=words):
        record_lengths(block, "t")
    with pytest.raises(error, match=words):
        [record_length(r, "t") for r in block]


def test_rows_accept_numpy_arrays():
    assert check_rows(np.array([1, 0]), 2) == [1, 0]


def test_rows_in_a_list_are_checked_and_copied():
    rows = [1, 0, 1]
    checked = check_rows(rows, 2)
    assert checked == rows and checked is not rows
    with pytest.raises(ValueError, match=r"rows holds 2; the shard has 2 rows \(0..1\)"):
        check_rows([0, 2], 2)
    with pytest.raises(ValueError, match="rows holds -1"):
        check_rows([-1], 2)
    with pytest.raises(TypeError, match="rows must hold integers; got True"):
        check_rows([True], 2)
    with pytest.raises(TypeError, match=r"rows must hold integers; got 0\.0"):
        check_rows([0.0], 2)


def test_the_no_random_access_error_names_the_all_to_all_path():
    assert "all-to-all" in str(no_random_access(object()))


def _every_reader(folder):
    """Every reader of the package over the same 3 shards of token records (sizes 4, 0, 5)."""
    import io
    import json
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from chronica.runtime.sources import (
        HFStreamingSource,
        MDSSource,
        ParquetSource,
        WebDatasetSource,
        write_mds,
    )

    shards = [
        [np.arange(3 * s + r + 1, dtype=np.int32) for r in range(n)]
        for s, n in enumerate((4, 0, 5))
    ]
    write_mds(
        folder / "mds",
        [[{"tokens": t} for t in shard] for shard in shards],
        {"tokens": "ndarray:int32"},
    )
    for s, shard in enumerate(shards):
        pq.write_table(
            pa.table({"tokens": pa.array([t.tolist() for t in shard], pa.list_(pa.int32()))}),
            folder / f"{s}.parquet",
            row_group_size=2,
        )
        (folder / f"{s}.jsonl").write_text(
            "".join(json.dumps({"tokens": t.tolist()}) + "\n" for t in shard)
        )
        with tarfile.open(folder / f"{s}.tar", "w") as tar:
            for r, t in enumerate(shard):
                data = io.BytesIO()
                np.save(data, t)
                info = tarfile.TarInfo(f"{r:04d}.tokens.npy")
                info.size = data.tell()
                data.seek(0)
                tar.addfile(info, data)
    files = lambda suffix: [folder / f"{s}{suffix}" for s in range(3)]  # noqa: E731
    return {
        "list": ListSource([[{"tokens": t} for t in shard] for shard in shards], length="tokens"),
        "mds": MDSSource(folder / "mds", length="tokens"),
        "parquet": ParquetSource(files(".parquet"), length="tokens"),
        "hf": HFStreamingSource(files(".jsonl"), length="tokens"),
        "webdataset": WebDatasetSource(files(".tar"), length="tokens.npy"),
    }, [len(t) for shard in shards for t in shard]


def test_every_reader_keeps_the_protocol_on_the_same_data(tmp_path):
    pytest.importorskip("datasets")
    readers, lengths = _every_reader(tmp_path)
    for name, source in readers.items():
        assert isinstance(source, ShardedSource), name
        assert shard_offsets(source).tolist() == [0, 4, 4, 9], name
        read = [source.length(r) for s in range(3) for r in source.read(s)]
        assert read == lengths, name
        blocks = np.concatenate([source.block_lengths(list(source.read(s))) for s in range(3)])
        assert blocks.tolist() == lengths, name
        for s in range(3):
            whole = pickle.dumps(list(source.read(s)))  # records travel between ranks
            size = source.shard_size(s)
            for start in range(size + 1):
                assert pickle.dumps(list(source.read(s, start))) == pickle.dumps(
                    pickle.loads(whole)[start:]
                ), (name, s, start)
            if source.random_access and size:
                rows = list(range(size))[::-1]
                lengths_by_row = [source.length(r) for r in source.read_rows(s, rows)]
                assert lengths_by_row == [read[shard_offsets(source)[s] + r] for r in rows], name
            elif size:
                with pytest.raises(NotImplementedError, match="all-to-all"):
                    source.read_rows(s, [0])
        copy = pickle.loads(pickle.dumps(source))  # e.g. into a data-loading worker
        assert [copy.length(r) for r in copy.read(2, 3)] == lengths[-2:], name


def test_read_ids_reads_by_global_id_in_the_order_asked():
    from chronica.runtime.sources import read_ids

    source = ListSource(SHARDS, length="tokens")
    offsets = shard_offsets(source)
    ids = [4, 0, 2, 4, 1]
    expected = [source.read_rows(s, [r])[0] for s, r in (locate(offsets, i) for i in ids)]
    assert read_ids(source, offsets, ids) == expected
    assert read_ids(source, offsets, []) == []
    with pytest.raises(ValueError, match=r"ids must be global ids in \[0, 5\)"):
        read_ids(source, offsets, [5])


class _Recorded(ListSource):
    """A ``ListSource`` that records every ``read_rows`` call."""

    def __init__(self, shards):
        super().__init__(shards)
        self.calls = []

    def read_rows(self, shard, rows):
        self.calls.append((shard, list(rows)))
        return super().read_rows(shard, rows)


@pytest.mark.parametrize("seed", range(20))
def test_read_ids_gives_the_same_reads_for_every_form_of_ids(seed):
    from chronica.runtime.sources import read_ids

    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 6, rng.integers(1, 6)).tolist() + [1]
    source = _Recorded([[object() for _ in range(n)] for n in sizes])
    offsets = shard_offsets(source)
    count = 300 if seed % 5 == 1 else rng.integers(0, 40)  # past FEW_IDS: numpy's path
    ids = rng.integers(0, offsets[-1], count).tolist()
    if seed % 4 == 0:  # every id in one shard
        ids = [int(offsets[-2])] * len(ids)
    reference = [source._shards[s][r] for s, r in (locate(offsets, i) for i in ids)]
    shards = sorted({locate(offsets, i)[0] for i in ids})
    calls = [
        (s, [locate(offsets, i)[1] for i in ids if locate(offsets, i)[0] == s]) for s in shards
    ]
    for form in (list, np.array, tuple, lambda v: [np.int64(i) for i in v]):
        source.calls = []
        records = read_ids(source, offsets, form(ids))
        assert len(records) == len(reference)
        assert all(a is b for a, b in zip(records, reference, strict=True))
        assert source.calls == calls


@pytest.mark.parametrize("ids", [[-1], [0, 5], np.array([7]), [3, -2, 1], [4] * 300 + [-1]])
def test_read_ids_names_the_range_of_global_ids_for_any_form(ids):
    from chronica.runtime.sources import read_ids

    source = ListSource(SHARDS, length="tokens")
    got = np.asarray(ids).tolist()
    message = rf"ids must be global ids in \[0, 5\); got {re.escape(str(got))}"
    with pytest.raises(ValueError, match=message):
        read_ids(source, shard_offsets(source), ids)


def test_read_ids_from_a_source_without_random_access_names_the_all_to_all_path(tmp_path):
    pytest.importorskip("datasets")
    from chronica.runtime.sources import read_ids

    readers, _ = _every_reader(tmp_path)
    with pytest.raises(NotImplementedError, match="all-to-all"):
        read_ids(readers["hf"], shard_offsets(readers["hf"]), [0])
