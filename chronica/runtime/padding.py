"""One padded length per step for every rank: what the faces pad variable-length features to.

In synchronous data-parallel training every rank of a step waits for the slowest, so padding
each rank's batch to the *step's* longest sample (over all ranks) costs no step time when the
ranks hold equal counts, and it gives every rank of a step the same shapes: frameworks that
combine the ranks' batches (Keras's ``model.fit`` under a ``tf.distribute`` strategy reduces
one batch across replicas; a global ``jax.Array`` is one array) need them. Every rank computes
the length from the plan alone, so no communication is involved. Numpy only.
"""

from __future__ import annotations

import numpy as np

from chronica.core.plan import EpochPlan

__all__ = ["step_longest"]


def step_longest(plan: EpochPlan, lengths: np.ndarray) -> np.ndarray:
    """The longest sample of every step of ``plan`` over all its ranks.

    ``lengths``: one length per sample (shape ``(N,)``), or one per sample and feature
    (``(N, F)``, each feature padded on its own). Returns int64 of shape ``(steps,)`` or
    ``(steps, F)``: row ``s`` is the maximum of ``lengths`` over
    ``plan.indices[bounds[s, 0] : bounds[s, -1]]``, the samples every rank trains at step
    ``s``, and 0 for a step without samples. Equal plans give equal results on every rank.

    Args:
        plan: the epoch's plan (every rank's part of every step).
        lengths: every sample's length, ``(N,)``, or per sample and feature, ``(N, F)``.

    Example::

        >>> pad_to = step_longest(stream.plan(), lengths)  # pad step s's batch to pad_to[s]
    """
    values = np.asarray(lengths, dtype=np.int64)
    if values.ndim not in (1, 2):
        raise ValueError(f"lengths must be (samples,) or (samples, features), got {values.shape}")
    starts, ends = plan.bounds[:, 0], plan.bounds[:, -1]
    out = np.zeros((plan.num_steps, *values.shape[1:]), dtype=np.int64)
    full = ends > starts
    if full.any():
        # Steps are contiguous in plan.indices, so each non-empty step's samples run from
        # its start to the next non-empty step's start (the last one to its end).
        taken = values[plan.indices[: ends[full][-1]]]
        out[full] = np.maximum.reduceat(taken, starts[full], axis=0)
    return out
