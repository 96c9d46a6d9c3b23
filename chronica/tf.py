"""``chronica.tf``: the TensorFlow face of chronica (importing it imports tensorflow).

``dataset.apply(chronica.tf.schedule(sizes, global_batch_size=..., num_replicas=..., rank=...))``
(or ``input_context=ctx`` inside ``strategy.distribute_datasets_from_function``): this
replica's balanced local batches, a face of ``chronica.runtime.RankStream`` with the same
arguments as the PyTorch samplers, ``kind="dynamic"`` included (``schedule.report(seconds)``
per step), and the common state: ``schedule.get_state(delivered=batch)`` after the last batch
trained, ``schedule.set_state(state)`` before iterating again, in this or another process,
adapter or world size.

Keras: ``chronica.tf.schedule(..., x=..., y=...)`` yields ``(x, y, sample_weight)`` for
``model.fit``, with ``callbacks=[chronica.tf.ScheduleCallback(schedule)]`` (epochs in step
with ``fit``; ``backup_dir=`` for exact mid-epoch backup and restore);
``chronica.tf.patch_keras_multiworker()`` works around Keras 3's failing ``fit`` under
``MultiWorkerMirroredStrategy`` with several workers.

``chronica.tf.stream(source, packing, batch_size=B).dataset``: a sharded stream as a
``tf.data.Dataset`` of this worker's packed micro-batches (dense rows), planned window by
window across the workers over TensorFlow's coordination service, with
``get_state(delivered=batch)``/``set_state``; see ``chronica.adapters.tf.streaming``.

``chronica.tf.ScheduledAllReduce(...).apply_gradients(optimizer, zip(grads, variables))``
inside ``strategy.run``: gradient-priority scheduling, see ``chronica.adapters.tf.grad``.
"""

from chronica.adapters.tf import Schedule, schedule
from chronica.adapters.tf.fit import ScheduleCallback, patch_keras_multiworker
from chronica.adapters.tf.grad import ScheduledAllReduce, forward_order, multi_step
from chronica.adapters.tf.streaming import TFStream, stream

__all__ = [
    "Schedule",
    "ScheduleCallback",
    "ScheduledAllReduce",
    "TFStream",
    "forward_order",
    "multi_step",
    "patch_keras_multiworker",
    "schedule",
    "stream",
]
