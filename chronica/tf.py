"""``chronica.tf``: the TensorFlow face of chronica (importing it imports tensorflow).

``dataset.apply(chronica.tf.schedule(sizes, global_batch_size=..., num_replicas=..., rank=...))``

``chronica.tf.ScheduledAllReduce(...).apply_gradients(optimizer, zip(grads, variables))``
inside ``strategy.run``: gradient-priority scheduling, see ``chronica.adapters.tf.grad``.
"""

from chronica.adapters.tf import Schedule, schedule
from chronica.adapters.tf.grad import ScheduledAllReduce, forward_order, multi_step

__all__ = ["Schedule", "ScheduledAllReduce", "forward_order", "multi_step", "schedule"]
