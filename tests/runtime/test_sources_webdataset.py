"""WebDataset tars: grouping by key as the convention says, sizes from one header scan,
reads from any row, random access on plain tars, compressed tars in order only, the same
samples as the webdataset package, errors."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from chronica.runtime.sources import ShardedSource, shard_offsets
from chronica.runtime.sources.webdataset import WebDatasetSource, decode_field, split_name


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _write_tar(path, samples, extra=()):
    """``samples``: (key, {field: bytes}); ``extra``: (name, bytes) written first."""
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for name, data in [*extra, *((f"{k}.{f}", d) for k, fs in samples for f, d in fs.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _samples(shard: int, count: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = np.random.default_rng(shard)
    out = []
    for row in range(count):
        n = int(rng.integers(1, 20))
        out.append(
            (
                f"part/{shard:02d}{row:04d}",
                {
                    "tokens.npy": _npy(np.arange(n, dtype=np.int32)),
                    "txt": f"sample {shard}.{row}".encode(),
                    "len.cls": str(n).encode(),
                    "meta.json": b'{"row": %d}' % row,
                    "raw.bin": bytes([row % 256]) * 3,
                },
            )
        )
    return out


def _write(folder, sizes=(5, 0, 8), suffix=".tar"):
    folder.mkdir(exist_ok=True)
    for s, size in enumerate(sizes):
        _write_tar(folder / f"shard-{s:03d}{suffix}", _samples(s, size))


def _plain(record):
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in record.items()}


def test_records_are_grouped_by_key_and_decoded(tmp_path):
    _write(tmp_path / "data")
    source = WebDatasetSource(tmp_path / "data", length="tokens.npy")
    assert isinstance(source, ShardedSource) and source.random_access
    assert shard_offsets(source).tolist() == [0, 5, 5, 13]
    records = list(source.read(2))
    assert [r["__key__"] for r in records] == [f"part/02{r:04d}" for r in range(8)]
    assert [source.length(r) for r in records] == [r["len.cls"] for r in records]
    assert records[3]["txt"] == "sample 2.3" and records[3]["meta.json"] == {"row": 3}
    assert records[3]["raw.bin"] == b"\x03\x03\x03"
    assert records[3]["tokens.npy"].dtype == np.int32


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_read_from_any_row_equals_the_tail_of_the_whole_read(tmp_path, suffix):
    _write(tmp_path / "data", suffix=suffix)
    source = WebDatasetSource(tmp_path / "data", length="len.cls")
    whole = [_plain(r) for r in source.read(2)]
    for start in (0, 1, 7, 8):
        assert [_plain(r) for r in source.read(2, start=start)] == whole[start:]


def test_random_access_equals_the_sequential_read(tmp_path):
    _write(tmp_path / "data")
    source = WebDatasetSource(tmp_path / "data", length="len.cls", fields=["len.cls", "txt"])
    whole = list(source.read(2))
    rows = [7, 0, 4, 4]
    assert source.read_rows(2, rows) == [whole[r] for r in rows]
    assert set(whole[0]) == {"__key__", "len.cls", "txt"}


def test_compressed_tars_have_no_random_access(tmp_path):
    _write(tmp_path / "data", suffix=".tar.gz")
    source = WebDatasetSource(tmp_path / "data", length="len.cls")
    assert not source.random_access and source.shard_size(2) == 8
    with pytest.raises(NotImplementedError, match="all-to-all"):
        source.read_rows(2, [0])
    plain = tmp_path / "plain"
    _write(plain)
    assert [_plain(r) for r in source.read(2)] == [
        _plain(r) for r in WebDatasetSource(plain, length="len.cls").read(2)
    ]


def test_undecoded_fields_stay_bytes_and_metadata_is_skipped(tmp_path):
    samples = [("a", {"txt": b"x", "cls": b"3"}), ("b", {"txt": b"y", "cls": b"4"})]
    extra = [("__meta__", b"skip"), ("README", b"no extension")]
    _write_tar(tmp_path / "s.tar", samples, extra)
    source = WebDatasetSource([tmp_path / "s.tar"], length=lambda r: 1, decode=False)
    assert list(source.read(0)) == [
        {"__key__": "a", "txt": b"x", "cls": b"3"},
        {"__key__": "b", "txt": b"y", "cls": b"4"},
    ]


def test_the_same_samples_as_the_webdataset_package(tmp_path):
    wds = pytest.importorskip("webdataset")
    _write(tmp_path / "data", sizes=(6,))
    path = str(tmp_path / "data" / "shard-000.tar")
    theirs = [
        {k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")}
        for sample in wds.WebDataset(path, shardshuffle=False).decode()
    ]
    ours = list(WebDatasetSource([path], length="len.cls").read(0))
    assert [_plain(r) for r in ours] == [_plain(r) for r in theirs]


def test_split_name_and_decode_field_follow_the_convention():
    assert split_name("a/b/c.d.E") == ("a/b/c", "d.e")
    assert split_name("a/.hidden") is None and split_name("dir/__meta__") is None
    assert split_name("__key__.txt") == ("__key__", "txt")  # as webdataset: not metadata
    assert decode_field("x.cls2", b"7") == 7 and decode_field("x.text", b"t") == "t"


def test_errors_name_the_argument_and_the_fix(tmp_path):
    _write_tar(tmp_path / "dup.tar", [("a", {"txt": b"1"})], extra=[("a.txt", b"0")])
    with pytest.raises(ValueError, match="repeats field 'txt'"):
        WebDatasetSource([tmp_path / "dup.tar"], length="txt").shard_size(0)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        WebDatasetSource(tmp_path / "none", length="txt")
    with pytest.raises(ValueError, match="holds no file ending with"):
        WebDatasetSource(_empty(tmp_path), length="txt")
    with pytest.raises(ValueError, match=r"length='txt' is not in fields \['cls'\]"):
        WebDatasetSource([tmp_path / "dup.tar"], length="txt", fields=["cls"])
    (tmp_path / "x.zip").write_bytes(b"")
    with pytest.raises(ValueError, match="not tar shards"):
        WebDatasetSource([tmp_path / "x.zip"], length="txt")
    source = WebDatasetSource([tmp_path / "dup.tar"], length="txt")
    with pytest.raises(ValueError, match="shard=1"):
        source.read(1)
    assert "decode=True" in repr(source)


def _empty(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder
