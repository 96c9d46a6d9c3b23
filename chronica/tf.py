"""``chronica.tf``: the TensorFlow face of chronica (importing it imports tensorflow).

``dataset.apply(chronica.tf.schedule(sizes, global_batch_size=..., num_replicas=..., rank=...))``
"""

from chronica.adapters.tf import Schedule, schedule

__all__ = ["Schedule", "schedule"]
