"""``chronica.jax.GrainStream``: a sharded stream as a Grain ``IterDataset`` of this process's
packed, balanced micro-batches (the items of ``chronica.jax.stream``), whose iterators keep
Grain's checkpoint protocol (``get_state`` / ``set_state``).

Grain's own transformations compose after it (``.map``, ``.filter`` of one micro-batch at a
time; never a re-batching, which would mix steps), and Grain checkpoints the position
through them: the state of the stream is plain JSON (the engine's ``state_dict``), so
``grain.checkpoint`` handlers save it as they save any iterator's. Imports grain and jax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grain
import numpy as np

from chronica.adapters.jax.streaming import JaxStream

__all__ = ["GrainStream", "GrainStreamIterator"]


class GrainStreamIterator(grain.DatasetIterator):
    """One pass (or, with ``infinite=True``, every pass) of a ``GrainStream``: the
    micro-batches of ``chronica.jax.stream`` in order, every sample once per pass, the same
    count on every process; ``set_state(get_state())`` in a new process continues bitwise.

    Args:
        stream: the ``chronica.jax.stream`` it reads.
    """

    def __init__(self, stream: JaxStream) -> None:
        super().__init__()
        self._stream = stream

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._stream)

    def get_state(self) -> dict[str, Any]:
        """The stream's state after the last micro-batch returned (plain JSON)."""
        return self._stream.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue after ``state`` (``get_state()`` of a run of any world size), on every
        process at the same point.

        Args:
            state: what ``get_state()`` returned.
        """
        self._stream.load_state_dict(state)

    def close(self) -> None:
        """Stop the stream's planning thread (on every process at the same point)."""
        self._stream.close()

    def __repr__(self) -> str:
        return f"GrainStreamIterator({self._stream!r})"


class GrainStream(grain.IterDataset):
    """A sharded stream as a Grain ``IterDataset`` (see the module docstring): every
    ``iter()`` starts the stream at its beginning, in a ``GrainStreamIterator``; every
    process must iterate it at the same points (its planning windows are collective).

    Args:
        source: a ``ShardedSource`` whose records hold token sequences.
        packing: the cap, rows, objective and padding (``chronica.Packing``).
        options: everything else ``chronica.jax.stream`` takes (``batch_size``, plan and
            stream options, ``collectives``...), by name.

    Example::

        dataset = chronica.jax.GrainStream(source, Packing(max_tokens=8192), batch_size=64)
        batches = iter(dataset.map(add_labels))
        state = batches.get_state()        # Grain's checkpoints save it
    """

    def __init__(self, source: Any, packing: Any = None, **options: Any) -> None:
        super().__init__()
        self._make: Callable[[], JaxStream] = lambda: JaxStream(source, packing, **options)
        # Made now, so that a wrong argument fails here, not at the first iter().
        self._first: JaxStream | None = self._make()
        self._description = repr(self._first)

    def __iter__(self) -> GrainStreamIterator:
        stream, self._first = self._first or self._make(), None
        return GrainStreamIterator(stream)

    def __repr__(self) -> str:
        return f"GrainStream({self._description})"
