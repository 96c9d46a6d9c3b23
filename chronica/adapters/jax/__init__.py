"""JAX adapter: a scheduled, static-shape, checkpointable batch iterator (imports jax)."""

from chronica.adapters.jax.data import ScheduledIterator, iterator

__all__ = ["ScheduledIterator", "iterator"]
