"""``chronica.jax``: the JAX face of chronica (importing it imports jax).

``chronica.jax.iterator(source, global_batch_size=B)`` yields this process's balanced,
padded, static-shape batches; see ``chronica.adapters.jax.data.ScheduledIterator``.
"""

from chronica.adapters.jax.data import ScheduledIterator, iterator

__all__ = ["ScheduledIterator", "iterator"]
