"""``chronica.tf.stream``: a sharded stream as a ``tf.data.Dataset`` of this worker's packed,
balanced micro-batches (``chronica.runtime.streaming.StreamingEngine``), resumable.

Every element is one micro-batch as dense rows (``chronica.runtime.streaming_faces.dense_rows``,
the layout of ``chronica.tf.schedule``'s packed elements): ``tokens``, ``segment_ids``,
``positions`` of shape ``(packing.rows, packing.length)``, ``ids`` and ``lengths`` (the
samples, padded to one static shape), ``loss_weight``, ``epoch``, ``step``, ``micro``,
``num_micro``; every worker gets the same number of elements per step.

The ranks' collectives go through the key-value store of TensorFlow's coordination service
(``chronica.runtime.streaming_faces.StoreCollectives``), which a ``TF_CONFIG`` cluster
already runs once ``MultiWorkerMirroredStrategy`` is made: host-side text, callable from
the engine's planning thread. TensorFlow's own collective ops would need the tensors padded
to one length and, issued from a second thread, would race the training step's all-reduces
(collective ops run in the order each worker issues them). Outside a cluster the stream
has one rank.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf.coordination import coordination_store
from chronica.core import ScheduleConfig
from chronica.core.packing import Packing
from chronica.core.streaming import StreamOptions
from chronica.runtime.streaming import StreamingEngine
from chronica.runtime.streaming_exchange import Collectives, LocalGroup
from chronica.runtime.streaming_faces import StoreCollectives, dense_rows
from chronica.runtime.streaming_request import stream_face, stream_request

__all__ = ["TFStream", "stream"]

_KEPT = 256  # elements whose state a delivered element may still refer to (tf.data prefetch)
_STREAMS = itertools.count()  # every worker makes its streams in the same order


def _cluster_collectives() -> Collectives:
    """This worker's collectives: over the coordination service of a ``TF_CONFIG`` cluster
    (made by ``MultiWorkerMirroredStrategy``), else a single rank."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = config.get("cluster", {}).get("worker", [])
    if len(workers) <= 1:
        return LocalGroup(1).rank(0)
    store = coordination_store(len(workers))
    if store is None:
        raise ValueError(
            "TF_CONFIG names a cluster but TensorFlow's coordination service is not running: "
            "make tf.distribute.MultiWorkerMirroredStrategy() before chronica.tf.stream(...)"
        )
    rank = int(config.get("task", {}).get("index", 0))
    return StoreCollectives(store, rank, len(workers), prefix=f"chronica/stream/{next(_STREAMS)}")


@stream_face
class TFStream:
    """This worker's micro-batches of a sharded ``source`` as a ``tf.data.Dataset``
    (``dataset``, built on ``tf.data.Dataset.from_generator``; see the module docstring):
    every sample once per pass, the same element count on every worker, resumable bitwise
    at the same world size (exactly-once for the rest of the pass at another).
    ``chronica.tf.stream`` is this class under the name the docs use.

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
        collectives: the ranks' ``Collectives`` (default: over the coordination service of a
            ``TF_CONFIG`` cluster, else a single rank).
        options: plan options and stream options by name (listed below).

    Example::

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        batches = chronica.tf.stream(source, Packing(max_tokens=8192), batch_size=64)
        for batch in batches.dataset:
            train_step(batch["tokens"], batch["segment_ids"], batch["positions"])
            state = batches.get_state(delivered=batch)
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
        collectives = _cluster_collectives() if collectives is None else collectives
        self.key, self.pad_value = key, int(pad_value)
        config, stream = stream_request(
            options, packing=packing, batch_size=batch_size, collectives=collectives,
            face="chronica.tf.stream", config=config, stream=stream,
        )  # fmt: skip
        self.engine = StreamingEngine(source, config, collectives, stream)
        self._states: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()

    def __repr__(self) -> str:
        return f"TFStream({self.engine!r})"

    @property
    def element_spec(self) -> dict[str, tf.TensorSpec]:
        """The ``tf.TensorSpec`` of every field of an element (one static shape)."""
        rows, length = self.engine.packing.rows, self.engine.packing.length
        spec = {
            "tokens": tf.TensorSpec((rows, length), tf.int64),
            "segment_ids": tf.TensorSpec((rows, length), tf.int32),
            "positions": tf.TensorSpec((rows, length), tf.int32),
            "ids": tf.TensorSpec((rows * length,), tf.int64),
            "lengths": tf.TensorSpec((rows * length,), tf.int64),
            "loss_weight": tf.TensorSpec((), tf.float32),
        }
        return spec | {
            k: tf.TensorSpec((), tf.int64) for k in ("epoch", "step", "micro", "num_micro")
        }

    @property
    def dataset(self) -> tf.data.Dataset:
        """The micro-batches from the current state (each iteration starts again from
        ``get_state()``: the next pass, or where ``set_state`` put it)."""
        return tf.data.Dataset.from_generator(self._elements, output_signature=self.element_spec)

    def _elements(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.engine.micro_batches():
            self._states[(batch.step, batch.micro)] = self.engine.state_dict()
            while len(self._states) > _KEPT:
                self._states.popitem(last=False)
            yield dense_rows(batch, self.engine.packing, self.key, self.pad_value)

    def get_state(self, delivered: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The stream's global state (the same on every worker), as plain lists and ints.

        Args:
            delivered: the last element the training loop took (its ``step`` and
                ``micro``; tensors or numpy values): the state right after it, whatever
                ``tf.data`` prefetched. ``None``: after the last element the generator
                produced.

        Raises ``TypeError`` when ``delivered`` is not a mapping, ``ValueError`` when it is
        not one of the last elements produced.

        Example::

            >>> state = batches.get_state(delivered=batch)
        """
        if delivered is None:
            return self.engine.state_dict()
        if not isinstance(delivered, Mapping):
            raise TypeError(
                f"delivered must be an element (a dict), got {type(delivered).__name__}"
            )
        place = (int(np.asarray(delivered["step"])), int(np.asarray(delivered["micro"])))
        if place not in self._states:
            raise ValueError(
                f"delivered (step, micro) {place} is not among the last {_KEPT} elements "
                "produced; pass an element of this stream's current iteration"
            )
        return self._states[place]

    def set_state(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (``get_state()`` of a run of any world size) on the next
        iteration of ``dataset``; every worker calls it at the same point.

        Args:
            state: what ``get_state()`` returned.

        Example::

            >>> batches.set_state(json.loads(saved))
        """
        self._states.clear()
        self.engine = self.engine.resumed(state)

    def report(self, seconds: float, step: int | None = None) -> None:
        """With ``kind="dynamic"``: this worker's own compute time of ``step`` (default: the
        step of the last micro-batch taken), forward and backward before the gradient
        all-reduce; later windows give a slower worker less work
        (``StreamingEngine.report``). Without it nothing happens.

        Args:
            seconds: the worker's compute time of the step.
            step: the global step (the element's ``step``); ``None`` is the step of the
                last element the generator produced, which ``tf.data``'s prefetching puts
                ahead of the training loop: pass the element's.

        Example::

            >>> batches.report(time.perf_counter() - started, step=int(element["step"]))
        """
        self.engine.report(seconds, step)

    def close(self) -> None:
        """Stop the planning thread (``StreamingEngine.close``): on every worker at the same
        point when a pass is left unfinished."""
        self.engine.close()


stream = TFStream
