"""The readers of streamed data: records in shards, each shard read in order from any row.

``ShardedSource`` (``base``) is the protocol; a sample's global id is
``shard_offsets(source)[shard] + row``; ``read_ids`` reads records by global id.
``ListSource`` keeps shards in memory (tests,
examples). The readers of real formats: ``MDSSource`` (Mosaic Streaming MDS shards, read
without the package), ``ParquetSource`` (parquet row groups through pyarrow),
``HFStreamingSource`` (jsonl or parquet through HF ``datasets`` streaming) and
``WebDatasetSource`` (WebDataset tars). Each imports its format's library only when a
source is built or read.
"""

from chronica.runtime.sources.base import (
    ListSource,
    ShardedSource,
    column_length,
    locate,
    read_ids,
    record_lengths,
    shard_offsets,
)
from chronica.runtime.sources.hf import HFStreamingSource
from chronica.runtime.sources.mds import MDSSource, write_mds
from chronica.runtime.sources.parquet import ParquetSource
from chronica.runtime.sources.webdataset import WebDatasetSource

__all__ = [
    "HFStreamingSource",
    "ListSource",
    "MDSSource",
    "ParquetSource",
    "ShardedSource",
    "WebDatasetSource",
    "column_length",
    "locate",
    "read_ids",
    "record_lengths",
    "shard_offsets",
    "write_mds",
]
