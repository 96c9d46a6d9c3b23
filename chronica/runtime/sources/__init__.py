"""The readers of streamed data: records in shards, each shard read in order from any row.

``ShardedSource`` (``base``) is the protocol; a sample's global id is
``shard_offsets(source)[shard] + row``. ``ListSource`` keeps shards in memory (tests,
examples). The readers of real formats live in this package's other modules and import
their format's library only when a source is built.
"""

from chronica.runtime.sources.base import (
    ListSource,
    ShardedSource,
    column_length,
    locate,
    shard_offsets,
)

__all__ = ["ListSource", "ShardedSource", "column_length", "locate", "shard_offsets"]
