"""Loss normalisation of packed steps: the weight that turns a micro-batch's mean loss into
its share of the global batch's mean."""

from __future__ import annotations

import numpy as np

__all__ = ["micro_weights"]


def micro_weights(tokens: np.ndarray, docs: np.ndarray, num_replicas: int, loss: str) -> np.ndarray:
    """The loss weight of every micro-batch of one step: ``tokens``/``docs`` hold each
    micro-batch's token and document (piece) counts, any shape. Multiplying a micro-batch's
    mean loss (over its tokens for ``loss="token"``, over its documents for ``"sample"``)
    by its weight, summing over a rank's micro-batches and averaging over ``num_replicas``
    ranks gives the mean over the whole step; an empty micro-batch weighs 0.

    Args:
        tokens: tokens of every micro-batch of the step (any shape).
        docs: documents (pieces) of every micro-batch, ``tokens``' shape.
        num_replicas: the ranks that average their gradients.
        loss: ``"token"`` or ``"sample"`` (``Packing.loss``).

    Example::

        >>> micro_weights(np.array([[30, 10], [40, 0]]), np.array([[3, 1], [2, 0]]), 2, "token")
        array([[0.75, 0.25],
               [1.  , 0.  ]])
    """
    share = np.asarray(tokens if loss == "token" else docs, dtype=np.float64)
    total = share.sum()
    return share * num_replicas / total if total > 0 else np.zeros_like(share)
