"""Where an element of ``chronica.tf.schedule``'s output stands: the state right after it.

``tf.data`` prefetches, so the stream's own position runs ahead of training. Every output
element carries its ``"epoch"`` and ``"step"`` (packed ones also ``"micro"`` and
``"num_micro"``); ``state_after`` turns the last element the training loop took into the
common state of every adapter (``chronica.runtime.RankStream.state``) that resumes with the
batch after it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf.store import EPOCH, MICRO, NUM_MICRO, STEP

__all__ = ["state_after"]


def state_after(
    delivered: Any, epoch_starts: Mapping[int, dict[str, Any]], packed: bool
) -> dict[str, Any]:
    """The state that resumes with the batch (or packed micro-batch) after ``delivered``.

    Args:
        delivered: an output element, or a dict of its ``"epoch"`` and ``"step"`` (and
            ``"micro"``, ``"num_micro"`` when packed): tensors, numpy values, ints or the
            distributed values of ``strategy.distribute_datasets_from_function``.
        epoch_starts: the state at the start of every epoch of the current iteration.
        packed: whether the output holds packed micro-batches.

    Raises ``TypeError`` when ``delivered`` is not a dict, ``ValueError`` when it lacks the
    position's keys or is not an element of the current iteration.

    Example::

        >>> state_after({"epoch": 0, "step": 4}, {0: start}, packed=False)["step"]
        5
    """
    if not isinstance(delivered, Mapping):
        raise TypeError(
            f"delivered= must be an element of this pipeline's output (a dict), got "
            f"{type(delivered).__name__}: pass the last batch the training loop took"
        )
    if not {EPOCH, STEP} <= set(delivered):
        raise ValueError(
            "delivered= must be an element of this pipeline's output (a dict with "
            "'epoch' and 'step'), the last one the training loop took"
        )
    epoch, step = _scalar(EPOCH, delivered[EPOCH]), _scalar(STEP, delivered[STEP])
    start = epoch_starts.get(epoch)
    if start is None or not start["step"] <= step:
        raise ValueError(
            f"delivered= is epoch {epoch} step {step}, not a batch of this pipeline's "
            f"current iteration"
        )
    if not packed:
        return {**copy.deepcopy(start), "step": step + 1, "offset": 0}
    if not {MICRO, NUM_MICRO} <= set(delivered):
        raise ValueError(
            "with packing= delivered= must be a packed micro-batch of this pipeline's "
            "output (a dict with 'epoch', 'step', 'micro' and 'num_micro')"
        )
    micro = _scalar(MICRO, delivered[MICRO]) + 1
    if micro < _scalar(NUM_MICRO, delivered[NUM_MICRO]):
        return {**copy.deepcopy(start), "step": step, "offset": micro}
    return {**copy.deepcopy(start), "step": step + 1, "offset": 0}


def _scalar(name: str, value: Any) -> int:
    """One integer from a tensor, numpy value, int, or distributed value (all equal)."""
    found = {int(np.asarray(v)) for v in tf.nest.flatten(value, expand_composites=True)}
    if len(found) != 1:
        raise ValueError(f"delivered[{name!r}] holds {sorted(found)}, not one step counter")
    return found.pop()
