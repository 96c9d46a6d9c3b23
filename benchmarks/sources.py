"""Read rate of each streamed source against the package it stands for, on the same files.

One corpus of token documents (lognormal(5, 1) lengths clipped to [8, 4096], int32 tokens)
is written once per format into a temporary folder, in the same shards:

- MDS (``write_mds``): chronica's ``MDSSource`` against mosaicml-streaming's
  ``LocalDataset`` (its reader without downloading), where the package imports;
- parquet (row groups of 1,024 rows): chronica's ``ParquetSource`` (pyarrow row groups) and
  ``HFStreamingSource`` against HF ``datasets`` streaming (``load_dataset("parquet", ...,
  streaming=True)``) over the same files;
- jsonl: ``HFStreamingSource`` against ``datasets`` streaming;
- WebDataset tars (``tokens.npy`` per sample): ``WebDatasetSource`` against the
  ``webdataset`` package's pipeline (``WebDataset(...).decode()``).

Every reader reads every shard in order and takes every record's length (its token
count), so all do the same work; the rate is samples per second, the median over repeats
run in turn (reader after reader, repeat after repeat), with the ratio to the package's
median beside it. Random access (``read_rows`` of 256 random rows of a shard at a time,
as a window fetches its planned samples) is measured for the sources that have it.

    python -m benchmarks --only sources
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "python -m benchmarks --only sources"
ROW_GROUP = 1024
RANDOM_BATCH = 256


def _documents(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(5, 1, n)), 8, 4096).astype(np.int64)
    return [rng.integers(0, 50_000, size=k).astype(np.int32) for k in lengths]


FORMATS = ("mds", "parquet", "jsonl", "tar")


def _write_all(
    folder: Path,
    shards: list[list[np.ndarray]],
    formats: tuple[str, ...] = FORMATS,
    parquet_lengths: str | None = None,
) -> dict[str, list[Path]]:
    """The documents as every format of ``formats`` (MDS in ``folder / "mds"``), the
    ``tokens`` column holding each (and, in parquet, the column ``parquet_lengths`` their
    lengths, where given); the files of parquet, jsonl and tar by format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from chronica.runtime.sources import write_mds

    if "mds" in formats:
        records = [[{"tokens": t} for t in s] for s in shards]
        write_mds(folder / "mds", records, {"tokens": "ndarray:int32"})
    files: dict[str, list[Path]] = {"parquet": [], "jsonl": [], "tar": []}
    for i, docs in enumerate(shards):
        if "parquet" in formats:
            parquet = folder / f"part-{i:03d}.parquet"
            column = pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))
            table = {"tokens": column}
            if parquet_lengths is not None:
                table[parquet_lengths] = pa.array([d.shape[0] for d in docs], pa.int64())
            pq.write_table(pa.table(table), parquet, row_group_size=ROW_GROUP)
            files["parquet"].append(parquet)
        if "jsonl" in formats:
            jsonl = folder / f"part-{i:03d}.jsonl"
            with open(jsonl, "w") as file:
                file.writelines(json.dumps({"tokens": d.tolist()}) + "\n" for d in docs)
            files["jsonl"].append(jsonl)
        if "tar" in formats:
            tar_path = folder / f"shard-{i:03d}.tar"
            with tarfile.open(tar_path, "w") as tar:
                for row, doc in enumerate(docs):
                    buffer = io.BytesIO()
                    np.save(buffer, doc)
                    info = tarfile.TarInfo(f"doc/{i:03d}{row:06d}.tokens.npy")
                    info.size = buffer.tell()
                    buffer.seek(0)
                    tar.addfile(info, buffer)
            files["tar"].append(tar_path)
    return files


def _drain(records: Iterable[Any], length: Callable[[Any], int]) -> tuple[int, int]:
    count = tokens = 0
    for record in records:
        count += 1
        tokens += length(record)
    return count, tokens


def _readers(folder: Path, files: dict[str, list[Path]]) -> dict[str, dict[str, Any]]:
    """Each reader: a callable reading everything, returning (samples, tokens); or the
    reason it cannot run here."""
    from chronica.runtime.sources import (
        HFStreamingSource,
        MDSSource,
        ParquetSource,
        WebDatasetSource,
    )

    def source_reader(source: Any) -> Callable[[], tuple[int, int]]:
        def read() -> tuple[int, int]:
            totals = [_drain(source.read(s), source.length) for s in range(source.num_shards)]
            return sum(t[0] for t in totals), sum(t[1] for t in totals)

        return read

    readers: dict[str, dict[str, Any]] = {}

    def add(name: str, group: str, package: bool, build: Callable[[], Callable[[], Any]]):
        try:
            readers[name] = {"group": group, "package": package, "read": build()}
        except Exception as error:  # a package that does not import here
            readers[name] = {"group": group, "package": package, "error": repr(error)[:160]}

    def mosaic() -> Callable[[], tuple[int, int]]:
        from streaming import LocalDataset

        dataset = LocalDataset(str(folder / "mds"))
        return lambda: _drain((dataset[i] for i in range(len(dataset))), lambda r: len(r["tokens"]))

    def hf(builder: str, paths: list[Path]) -> Callable[[], Callable[[], tuple[int, int]]]:
        def build() -> Callable[[], tuple[int, int]]:
            from datasets import load_dataset

            stream = load_dataset(
                builder, data_files=[str(p) for p in paths], split="train", streaming=True
            )
            return lambda: _drain(stream, lambda r: len(r["tokens"]))

        return build

    def wds() -> Callable[[], tuple[int, int]]:
        import webdataset

        urls = [str(p) for p in files["tar"]]
        return lambda: _drain(
            webdataset.WebDataset(urls, shardshuffle=False).decode(),
            lambda r: len(r["tokens.npy"]),
        )

    add("mosaicml-streaming LocalDataset", "MDS", True, mosaic)
    add(
        "chronica MDSSource",
        "MDS",
        False,
        lambda: source_reader(MDSSource(folder / "mds", "tokens")),
    )
    add("datasets streaming (parquet)", "parquet", True, hf("parquet", files["parquet"]))
    add(
        "chronica ParquetSource",
        "parquet",
        False,
        lambda: source_reader(ParquetSource(files["parquet"], length="tokens")),
    )
    add(
        "chronica HFStreamingSource (parquet)",
        "parquet",
        False,
        lambda: source_reader(HFStreamingSource(files["parquet"], length="tokens")),
    )
    add("datasets streaming (jsonl)", "jsonl", True, hf("json", files["jsonl"]))
    add(
        "chronica HFStreamingSource (jsonl)",
        "jsonl",
        False,
        lambda: source_reader(HFStreamingSource(files["jsonl"], length="tokens")),
    )
    add("webdataset WebDataset.decode()", "WebDataset", True, wds)
    add(
        "chronica WebDatasetSource",
        "WebDataset",
        False,
        lambda: source_reader(WebDatasetSource(files["tar"], length="tokens.npy")),
    )
    return readers


def _random_readers(folder: Path, files: dict[str, list[Path]]) -> dict[str, Any]:
    from chronica.runtime.sources import MDSSource, ParquetSource, WebDatasetSource

    return {
        "chronica MDSSource": MDSSource(folder / "mds", "tokens"),
        "chronica ParquetSource": ParquetSource(files["parquet"], length="tokens"),
        "chronica WebDatasetSource": WebDatasetSource(files["tar"], length="tokens.npy"),
    }


def _random_read(source: Any, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    count = tokens = 0
    for shard in range(source.num_shards):
        rows = rng.permutation(source.shard_size(shard))
        for at in range(0, len(rows), RANDOM_BATCH):
            records = source.read_rows(shard, rows[at : at + RANDOM_BATCH].tolist())
            count += len(records)
            tokens += sum(source.length(r) for r in records)
    return count, tokens


def _timed(read: Callable[[], tuple[int, int]]) -> tuple[float, int, int]:
    started = time.perf_counter()
    count, tokens = read()
    return time.perf_counter() - started, count, tokens


def run(quick: bool) -> dict[str, Any]:
    """Write the corpus, time every reader; samples/s medians and ratios to the package."""
    n, num_shards, repeats = (8_000, 4, 3) if quick else (40_000, 8, 5)
    docs = _documents(n)
    shards = [docs[i::num_shards] for i in range(num_shards)]
    expected_tokens = int(sum(len(d) for d in docs))
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="chronica-sources-"))
    try:
        files = _write_all(folder, shards)
        readers = _readers(folder, files)
        randoms = _random_readers(folder, files)
        seconds: dict[str, list[float]] = {name: [] for name in readers}
        random_seconds: dict[str, list[float]] = {name: [] for name in randoms}
        for reader in readers.values():  # warm: imports, page cache, first builds
            if "read" in reader:
                reader["read"]()
        for repeat in range(repeats):
            for name, reader in readers.items():
                if "read" not in reader:
                    continue
                took, count, tokens = _timed(reader["read"])
                assert (count, tokens) == (n, expected_tokens), (name, count, tokens)
                seconds[name].append(took)
            for name, source in randoms.items():
                took, count, tokens = _timed(partial(_random_read, source, repeat))
                assert (count, tokens) == (n, expected_tokens), (name, count, tokens)
                random_seconds[name].append(took)
        sizes = {
            "MDS": sum(p.stat().st_size for p in (folder / "mds").iterdir()),
            "parquet": sum(p.stat().st_size for p in files["parquet"]),
            "jsonl": sum(p.stat().st_size for p in files["jsonl"]),
            "WebDataset": sum(p.stat().st_size for p in files["tar"]),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for name, reader in readers.items():
        row = {"reader": name, "format": reader["group"], "package": reader["package"]}
        if "error" in reader:
            row["error"] = reader["error"]
        else:
            row["samples_per_s"] = n / median(seconds[name])
            row["seconds"] = seconds[name]
        rows.append(row)
    for row in rows:
        base = next(
            (r for r in rows if r["package"] and r["format"] == row["format"] and "error" not in r),
            None,
        )
        if base is not None and "error" not in row:
            row["vs_package"] = row["samples_per_s"] / base["samples_per_s"]
    random_rows = [
        {"reader": name, "samples_per_s": n / median(times), "seconds": times}
        for name, times in random_seconds.items()
    ]
    return {
        "samples": n,
        "shards": num_shards,
        "tokens": expected_tokens,
        "repeats": repeats,
        "bytes": sizes,
        "sequential": rows,
        "random": random_rows,
        "versions": _versions(),
        # The machine's 1-minute load average before and after: other jobs share its cores.
        "load_average": [load_before, os.getloadavg()[0]],
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("datasets", "pyarrow", "webdataset", "mosaicml-streaming"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def format_table(result: dict[str, Any]) -> str:
    """The terminal table: samples/s per reader, ratio to the package's reader."""
    lines = [f"{'reader':40s} {'format':10s} {'samples/s':>10s} {'vs package':>10s}"]
    for row in result["sequential"]:
        if "error" in row:
            lines.append(f"{row['reader']:40s} {row['format']:10s} not run: {row['error'][:60]}")
            continue
        ratio = f"{row['vs_package']:.2f}x" if "vs_package" in row else "-"
        lines.append(
            f"{row['reader']:40s} {row['format']:10s} {row['samples_per_s']:10,.0f} {ratio:>10s}"
        )
    for row in result["random"]:
        lines.append(
            f"{row['reader'] + ' read_rows':40s} {'random':10s} {row['samples_per_s']:10,.0f}"
        )
    return "\n".join(lines)


def _range(samples: int, seconds: list[float]) -> str:
    return f"{samples / max(seconds):,.0f}–{samples / min(seconds):,.0f}"


def _load_note(result: dict[str, Any]) -> str:
    if "load_average" not in result:
        return ""
    before, after = result["load_average"]
    return (
        f" The machine's {result['machine']['cpu_count']} cores were shared with other jobs "
        f"(1-minute load average {before:.1f} before the run, {after:.1f} after): compare "
        "readers within a run, and read the range over repeats as the noise."
    )


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md."""
    del img_dir
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    mib = {k: v / 2**20 for k, v in result["bytes"].items()}
    lines = [
        "## Stream sources",
        "",
        f"Each reader of [streamed sources](stream-sources.md) alone against the package it "
        f"stands for, on the same files: {result['samples']:,} token documents "
        f"(lognormal(5, 1) lengths in [8, 4096], {result['tokens']:,} int32 tokens) in "
        f"{result['shards']} shards, written as MDS ({mib['MDS']:.0f} MiB), parquet with row "
        f"groups of {ROW_GROUP} ({mib['parquet']:.0f} MiB), jsonl ({mib['jsonl']:.0f} MiB) "
        f"and WebDataset tars with one `tokens.npy` per sample ({mib['WebDataset']:.0f} MiB), "
        "on local disk (page cache warm). Every reader reads every shard in order and takes "
        "each record's token count; samples per second, the median of "
        f"{result['repeats']} repeats run in turn. ({versions}.)" + _load_note(result),
        "",
        "| format | reader | samples/s | range over repeats | vs the package |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["sequential"]:
        if "error" in row:
            lines.append(f"| {row['format']} | {row['reader']} | not run here | | |")
            continue
        ratio = f"{row['vs_package']:.2f}x" if "vs_package" in row else ""
        lines.append(
            f"| {row['format']} | {row['reader']} | {row['samples_per_s']:,.0f} | "
            f"{_range(result['samples'], row['seconds'])} | {ratio} |"
        )
    lines += [
        "",
        f"Random access (`read_rows` of {RANDOM_BATCH} random rows of a shard at a time, "
        "every row once, as a planning window fetches its samples by index):",
        "",
        "| reader | samples/s | range over repeats |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {r['reader']} | {r['samples_per_s']:,.0f} | {_range(result['samples'], r['seconds'])} |"
        for r in result["random"]
    ]
    missing = [r for r in result["sequential"] if "error" in r]
    if missing:
        lines += [
            "",
            "Not run here: "
            + "; ".join(f"{r['reader']} ({r['error']})" for r in missing)
            + ". mosaicml-streaming 0.13 imports torchvision, whose index wheels do not load "
            "beside the CPU torch wheel; the issue's own tries measured its `StreamingDataset` "
            "at about 1,100 samples/s from local disk with the default `predownload` and about "
            "23,000/s with a large one.",
        ]
    lines += ["", f"Reproduce: `{REPRODUCE}`."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(run(quick=True)))
