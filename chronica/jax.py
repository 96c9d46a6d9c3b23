"""``chronica.jax``: the JAX face of chronica (importing it imports jax).

``chronica.jax.iterator(source, global_batch_size=B)`` yields this process's balanced,
padded, static-shape batches, epoch after epoch: a face of ``chronica.runtime.RankStream``
with the arguments of every chronica adapter (``kind="dynamic"`` included: steps re-split
by a coordinator from the times each process reports with ``it.report(seconds)``,
configured by a ``chronica.runtime.DynamicOptions``) and their one state format
(``get_state``/``set_state`` resume exactly, at another world size, or from a torch or
tf.data state); see ``chronica.adapters.jax.data.ScheduledIterator``.

``chronica.jax.StepSource(source, global_batch_size=B, epochs=E)`` is the same batches as a
Grain data source, one record per step (``grain.DataLoader(data_source=steps,
sampler=steps.sampler(), worker_count=N)`` or ``grain.MapDataset.source(steps)``), so
Grain's workers keep chronica's balance and Grain's checkpoints keep its position; see
``chronica.adapters.grain.StepSource`` (grain is imported only by ``sampler()``).

``chronica.jax.stream(source, packing, batch_size=B)``: a sharded stream as an iterator of
this process's packed micro-batches (numpy dense rows), planned window by window across the
processes over ``jax.distributed``'s coordination service, with ``state_dict()`` /
``load_state_dict()``; see ``chronica.adapters.jax.streaming``.

``chronica.jax.GrainStream(source, packing, batch_size=B)``: the same stream as a Grain
``IterDataset`` whose iterators keep Grain's checkpoint protocol; see
``chronica.adapters.grain.streaming`` (grain is imported on first use).

``chronica.jax.ScheduledReducer(priority=chronica.jax.forward_order(loss, params, batch))``
averages gradient pytrees across ``jax.distributed`` processes partition by partition, first
layers first, under a credit of bytes in flight; see ``chronica.adapters.jax.grad``.
"""

from typing import TYPE_CHECKING, Any

from chronica.adapters.grain import StepSource
from chronica.adapters.jax.data import ScheduledIterator, iterator
from chronica.adapters.jax.grad import (
    PerLeaf,
    ReducedLeaves,
    ScheduledReducer,
    forward_order,
    per_leaf,
)
from chronica.adapters.jax.streaming import JaxStream, stream

if TYPE_CHECKING:
    from chronica.adapters.grain.streaming import GrainStream

__all__ = [
    "GrainStream",
    "JaxStream",
    "PerLeaf",
    "ReducedLeaves",
    "ScheduledIterator",
    "ScheduledReducer",
    "StepSource",
    "forward_order",
    "iterator",
    "per_leaf",
    "stream",
]


def __getattr__(name: str) -> Any:
    # GrainStream subclasses grain's IterDataset: grain is imported when it is first used.
    if name == "GrainStream":
        from chronica.adapters.grain.streaming import GrainStream

        return GrainStream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
