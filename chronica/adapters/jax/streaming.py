"""``chronica.jax.stream``: a sharded stream as an iterator of this process's packed, balanced
micro-batches (``chronica.runtime.streaming.StreamingEngine``) as numpy arrays, for a JAX
training loop, with ``state_dict``/``load_state_dict``.

Every item is one micro-batch as dense rows (``chronica.runtime.streaming_faces.dense_rows``,
the layout of ``chronica.jax.iterator``'s packed batches): ``tokens``, ``segment_ids``,
``positions`` of shape ``(packing.rows, packing.length)``, ``ids`` and ``lengths`` (the
samples, padded to one static shape, so one compiled step serves every micro-batch),
``loss_weight``, ``epoch``, ``step``, ``micro``, ``num_micro``; every process gets the same
number of items per step.

The processes' collectives go through the key-value store of ``jax.distributed``'s
coordination service (``chronica.runtime.streaming_faces.StoreCollectives``; the store the
JAX iterator's ``kind="dynamic"`` already votes over): host-side, callable from the
engine's planning thread. ``multihost_utils.process_allgather`` would need the bytes padded
to one length across processes and runs a cross-process XLA computation; issued from a
second thread it could interleave with the training step's own collectives, which every
process must run in one order. Without ``jax.distributed`` the stream has one rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from chronica.adapters.jax.data import _jax_store
from chronica.core import ScheduleConfig
from chronica.core.packing import Packing
from chronica.core.streaming import StreamOptions
from chronica.runtime.streaming import StreamingEngine, StreamMicroBatch
from chronica.runtime.streaming_exchange import Collectives, LocalGroup
from chronica.runtime.streaming_faces import StoreCollectives, dense_rows
from chronica.runtime.streaming_request import stream_face, stream_request

__all__ = ["JaxStream", "stream"]

_STREAMS = itertools.count()  # every process makes its streams in the same order


def _process_collectives() -> Collectives:
    """This process's collectives: over ``jax.distributed``'s coordination service when it
    runs several processes, else a single rank."""
    world = jax.process_count()
    if world == 1:
        return LocalGroup(1).rank(0)
    store = _jax_store(world)
    if store is None:
        raise ValueError(
            "chronica.jax.stream over several processes needs jax.distributed.initialize() "
            "(its coordination service carries the collectives), or pass collectives="
        )
    prefix = f"chronica/stream/{next(_STREAMS)}"
    return StoreCollectives(store, jax.process_index(), world, prefix=prefix)


@stream_face
class JaxStream(Iterator[dict[str, np.ndarray]]):
    """This process's micro-batches of a sharded ``source`` as numpy dense rows (see the
    module docstring): every sample once per pass, the same count on every process,
    resumable bitwise at the same world size (exactly-once for the rest of the pass at
    another). Iterating past the end of a pass starts the next one.
    ``chronica.jax.stream`` is this class under the name the docs use.

    Args:
        source: a ``ShardedSource`` whose records hold token sequences (under ``key`` when
            they are mappings).
        packing: the cap, rows, objective and padding (``chronica.Packing``); ``None`` when
            ``config`` holds it.
        batch_size: samples per global step (without ``packing.tokens_per_step``).
        config: the whole plan request (``chronica.ScheduleConfig``) instead of
            ``packing``, ``batch_size`` and the plan options.
        stream: the stream options whole (``chronica.StreamOptions``) instead of their
            keywords.
        key: the field of a mapping record holding its tokens.
        pad_value: the token of the padding.
        collectives: the ranks' ``Collectives`` (default: over ``jax.distributed``'s
            coordination service when it runs several processes, else a single rank).
        options: plan options and stream options by name (listed below).

    Example::

        batches = chronica.jax.stream(source, Packing(max_tokens=8192), batch_size=64)
        for batch in batches:
            params, opt = train_step(params, opt, batch["tokens"], batch["segment_ids"])
            checkpoint = batches.state_dict()
    """

    def __init__(
        self,
        source: Any,
        packing: Packing | None = None,
        *,
        batch_size: int | None = None,
        config: ScheduleConfig | None = None,
        stream: StreamOptions | None = None,
        collectives: Collectives | None = None,
        key: str = "input_ids",
        pad_value: int = 0,
        **options: Any,
    ) -> None:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        if not isinstance(pad_value, int | np.integer):
            raise TypeError(f"pad_value must be an int, got {type(pad_value).__name__}")
        collectives = _process_collectives() if collectives is None else collectives
        self.key, self.pad_value = key, int(pad_value)
        config, stream = stream_request(
            options, packing=packing, batch_size=batch_size, collectives=collectives,
            face="chronica.jax.stream", config=config, stream=stream,
        )  # fmt: skip
        self.engine = StreamingEngine(source, config, collectives, stream)
        self._batches: Iterator[StreamMicroBatch] | None = None

    def __repr__(self) -> str:
        return f"JaxStream({self.engine!r})"

    def __iter__(self) -> JaxStream:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._batches is None:
            self._batches = self.engine.micro_batches()
        try:
            batch = next(self._batches)
        except StopIteration:
            self._batches = None
            raise
        return dense_rows(batch, self.engine.packing, self.key, self.pad_value)

    def state_dict(self) -> dict[str, Any]:
        """The stream's global state after the last item returned (the same on every
        process), as plain lists and ints."""
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after ``state`` (``state_dict()`` of a run of any world size) with the
        next item; every process calls it at the same point.

        Args:
            state: what ``state_dict()`` returned.

        Example::

            >>> batches.load_state_dict(json.loads(saved))
        """
        self.close()
        self.engine = self.engine.resumed(state)

    def report(self, seconds: float, step: int | None = None) -> None:
        """With ``kind="dynamic"``: this process's own compute time of ``step`` (default: the
        step of the last micro-batch taken), forward and backward before the gradient
        all-reduce; later windows give a slower process less work
        (``StreamingEngine.report``). Without it nothing happens.

        Args:
            seconds: the process's compute time of the step.
            step: the global step (the items' ``step``), or ``None``.

        Example::

            >>> batches.report(time.perf_counter() - started)
        """
        self.engine.report(seconds, step)

    def close(self) -> None:
        """Stop the planning thread (``StreamingEngine.close``): on every process at the
        same point when a pass is left unfinished."""
        if self._batches is not None:
            self._batches.close()  # type: ignore[attr-defined]
            self._batches = None
        self.engine.close()


stream = JaxStream
