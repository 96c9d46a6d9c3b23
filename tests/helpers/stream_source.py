"""An in-memory ``ShardedSource`` for the streaming tests, and runners of a stream's ranks
as threads of one process (``chronica.runtime.streaming_exchange.LocalGroup``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from chronica.core.packing import Packing
from chronica.runtime.streaming import StreamingEngine
from chronica.runtime.streaming_exchange import LocalGroup
from chronica.runtime.streaming_request import stream_request

__all__ = ["ListSource", "make_source", "run_ranks"]


class ListSource:
    """Shards of token arrays in memory: record ``j`` of shard ``s`` is a dict whose
    ``input_ids`` are ``length`` copies of its global id (so a packed row shows whose tokens
    it holds). ``random_access`` chooses the path samples take to their rank."""

    def __init__(self, shards: Sequence[Sequence[int]], random_access: bool = True) -> None:
        self.shards = [list(map(int, s)) for s in shards]
        self.random_access = random_access
        self.offsets = np.concatenate([[0], np.cumsum([len(s) for s in self.shards])])

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_size(self, shard: int) -> int:
        return len(self.shards[shard])

    def _record(self, shard: int, row: int) -> dict[str, Any]:
        sample = int(self.offsets[shard] + row)
        return {"input_ids": np.full(self.shards[shard][row], sample, np.int64), "id": sample}

    def read(self, shard: int, start: int = 0) -> Iterator[Any]:
        for row in range(start, len(self.shards[shard])):
            yield self._record(shard, row)

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[Any]:
        if not self.random_access:
            raise NotImplementedError("no random access: samples travel by the all-to-all")
        return [self._record(shard, row) for row in rows]

    def length(self, record: Any) -> int:
        return int(record["input_ids"].shape[0])


def make_source(
    shards: int = 7,
    mean: int = 40,
    seed: int = 0,
    random_access: bool = True,
    low: int = 8,
    high: int = 512,
) -> ListSource:
    """Shards of uneven sizes (``mean`` samples on average) of lengths drawn log-uniformly
    in ``[low, high]``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(mean // 2, mean * 3 // 2 + 1, shards)
    return ListSource(
        [np.exp(rng.uniform(np.log(low), np.log(high), n)).astype(int).tolist() for n in sizes],
        random_access,
    )


def make_engine(
    source: Any,
    packing: Packing,
    collectives: Any,
    *,
    state: dict[str, Any] | None = None,
    batch_size: int | None = None,
    **options: Any,
) -> StreamingEngine:
    """An engine built as the faces build theirs: plan and stream options as keywords."""
    config, stream = stream_request(
        options, packing=packing, batch_size=batch_size, collectives=collectives, face="test"
    )
    return StreamingEngine(source, config, collectives, stream, state=state)


def run_ranks(
    source: Any,
    world: int,
    packing: Packing,
    *,
    limit: int | None = None,
    states: Sequence[dict[str, Any] | None] | None = None,
    each: Callable[[int, StreamingEngine, Any], None] | None = None,
    **options: Any,
) -> tuple[list[list[Any]], list[dict[str, Any]], list[StreamingEngine]]:
    """Every rank of a ``world``-rank stream in its own thread: the micro-batches each
    yielded (up to ``limit`` each), each rank's ``state_dict()`` afterwards, the engines;
    ``each(rank, engine, batch)`` runs in the rank's thread after every micro-batch."""
    group = LocalGroup(world)
    engines = [
        make_engine(
            source, packing, group.rank(r), state=None if states is None else states[r],
            **options,
        )
        for r in range(world)
    ]  # fmt: skip
    out: list[list[Any]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            batches = engines[r].micro_batches()
            for batch in batches:
                out[r].append(batch)
                if each is not None:
                    each(r, engines[r], batch)
                if limit is not None and len(out[r]) >= limit:
                    break
            batches.close()
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, [e.state_dict() for e in engines], engines
