"""Local datasets in the streamed formats (MDS, WebDataset tars, parquet read through HF
``datasets`` streaming, parquet row groups) with the lengths of ``stream_source``'s
``make_source``: sample ``offsets[s] + j`` holds that many copies of its global id, under
the field ``open_source`` names as the dataset's token key."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
from stream_source import make_source

__all__ = ["FORMATS", "assert_lengths_match_records", "open_source", "write_dataset"]

FORMATS = ("mds", "tar", "hf", "parquet")
KEYS = {"mds": "input_ids", "tar": "input_ids.npy", "hf": "input_ids", "parquet": "input_ids"}


def _shards() -> list[list[np.ndarray]]:
    source = make_source()
    return [
        [np.full(n, source.offsets[s] + j, np.int32) for j, n in enumerate(lengths)]
        for s, lengths in enumerate(source.shards)
    ]


def write_dataset(kind: str, folder: Path) -> None:
    """Write the test stream in format ``kind`` into ``folder``."""
    shards = _shards()
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "mds":
        from chronica.runtime.sources import write_mds

        write_mds(folder, [[{"input_ids": t} for t in s] for s in shards],
                  {"input_ids": "ndarray:int32"})  # fmt: skip
    elif kind == "tar":
        for s, records in enumerate(shards):
            with tarfile.open(folder / f"shard-{s:03d}.tar", "w") as tar:
                for j, tokens in enumerate(records):
                    buffer = io.BytesIO()
                    np.save(buffer, tokens)
                    info = tarfile.TarInfo(f"s{s:03d}-{j:05d}.input_ids.npy")
                    info.size = len(buffer.getvalue())
                    tar.addfile(info, io.BytesIO(buffer.getvalue()))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for s, records in enumerate(shards):
            table = pa.table({"input_ids": [t.tolist() for t in records]})
            pq.write_table(table, folder / f"shard-{s:03d}.parquet", row_group_size=8)


def open_source(kind: str, folder: Path) -> tuple[Any, str]:
    """The source reading ``folder`` and the field holding the tokens."""
    from chronica.runtime import sources

    files = sorted(folder.iterdir())
    key = KEYS[kind]
    if kind == "mds":
        return sources.MDSSource(folder, length=key), key
    if kind == "tar":
        return sources.WebDatasetSource(files, length=key), key
    if kind == "hf":
        return sources.HFStreamingSource(files, length=key), key
    return sources.ParquetSource(files, length=key), key


def assert_lengths_match_records(source: Any) -> None:
    """``source.read_lengths`` of every span of every shard (every start, every count)
    equals the lengths of the records ``read`` yields there, as ``int64``."""
    for shard in range(source.num_shards):
        want = [source.length(r) for r in source.read(shard)]
        for start in range(len(want) + 1):
            for count in range(len(want) - start + 1):
                got = source.read_lengths(shard, start, count)
                assert got.dtype == np.int64 and got.tolist() == want[start : start + count]
