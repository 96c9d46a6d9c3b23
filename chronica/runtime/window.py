"""A coordinator's window checked at constant bytes: each rank its own part, the ranks
together the whole.

Exactly-once is a property of all the ranks' parts together (each step's parts must be
exactly the static step's samples), so no check a rank makes of its own part alone can
establish it: parts that each fit the static plan can still give two ranks the same
samples or leave some out. Shipping every rank the whole window would let each check it,
at bytes per rank and step that grow with the global batch. Instead each rank receives only
its own part and:

* checks what it can alone (``fault``): the part covers the window, its counts are ones
  the training loops can run (the static counts, or within the batch bounds with
  ``variable_batch``; never an empty rank where the static plan fills every one), its loss
  weights are the ones its counts imply, its indices exist;
* hashes the multiset of its part's ``(step, sample)`` pairs (pieces when packed) and of
  its static part's, under a key rank 0 draws after the plans were made and shares over
  the framework's channel (``imbalance``, ``chronica.core.multiset``);
* votes (``chronica.runtime.agreement``): the ranks' imbalances sum to 0 exactly when the
  union of the parts is the union of the static parts, the static window, step by step
  (up to a collision, at most ``2**-250`` per window for plans made without the key), and
  the ranks' tokens (``token``: generation, epoch, first step, steps and, for a packed
  window, the micro-batch counts of every step) must all be equal.

So every rank uses the coordinator's window only if all checked their own part, all hold
parts of one planning of the same steps, and together the parts partition every step. A
window whose parts are a partition with runnable counts is accepted whoever's part each
rank got (two ranks' parts swapped, say): exactly-once holds either way. Bytes per rank
and step are those of the rank's own plan, whatever the world size; the price is two small
all-reduces per window and hashing about twice the rank's own samples.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from chronica.comm.protocol import Plan
from chronica.core.config import ScheduleConfig
from chronica.core.multiset import HASH_WORDS, MODULUS, multiset_hash
from chronica.core.plan import EpochPlan
from chronica.runtime.agreement import TOKEN_WORDS, Token

__all__ = ["fault", "imbalance", "token"]


def token(plan: Plan) -> Token:
    """What every rank must hold alike to use ``plan``'s window, as an agreement token:
    its generation, epoch, first step, steps and (packed) micro-batch counts per step;
    never ``NO_PLAN``.

    Args:
        plan: this rank's part of a coordinator's window (``chronica.comm.protocol.Plan``).

    Example::

        >>> agree(token(plan), functools.partial(imbalance, plan, static, rank, 0, 16))
    """
    digest = hashlib.blake2b(digest_size=8 * TOKEN_WORDS)
    head = [plan.gen, plan.epoch, plan.first, plan.num_steps]
    digest.update(np.asarray(head, "<i8").tobytes())
    if plan.micro is not None:
        digest.update(np.ascontiguousarray(plan.micro.counts, "<i8").tobytes())
    words = np.frombuffer(digest.digest(), "<u8") >> np.uint64(2)
    return (int(words[0]) | 1, *(int(w) for w in words[1:]))


def imbalance(
    plan: Plan | None, static: EpochPlan, rank: int, first: int, stop: int, key: np.ndarray
) -> np.ndarray:
    """The multiset hash under ``key`` of ``plan``'s ``(step, sample)`` pairs (pieces when
    packed) minus that of rank ``rank``'s part of steps ``first..stop-1`` of ``static``,
    modulo ``MODULUS``: summed over the ranks, 0 when their parts together are the static
    window (``HASH_WORDS`` int64 in ``[0, MODULUS)``); zeros without a ``plan`` (the rank
    votes ``NO_PLAN``).

    Args:
        plan: this rank's part of the window, or ``None``.
        static: the epoch's static plan.
        rank: this rank.
        first: the window's first step.
        stop: one past its last step.
        key: the vote's key (``KEY_WORDS`` int64, drawn by rank 0 after the plans were made).

    Example::

        >>> words = imbalance(plan, static, rank, 16, 32, agreement.key())
    """
    if plan is None:
        return np.zeros(HASH_WORDS, np.int64)
    offsets = plan.offsets
    mine = multiset_hash(plan.indices, offsets[:-1], offsets[1:], first, key)
    source = static.indices if static.micro is None else static.micro.pieces
    spans = static.bounds[first:stop, rank : rank + 2]
    theirs = multiset_hash(source, spans[:, 0], spans[:, 1], first, key)
    return (mine - theirs) % MODULUS


def fault(
    plan: Plan,
    static: EpochPlan,
    config: ScheduleConfig,
    rank: int,
    first: int,
    stop: int,
    items: int,
) -> str | None:
    """Why ``plan`` cannot be rank ``rank``'s part of steps ``first..stop-1`` of
    ``static``'s epoch, judged from this part alone, or ``None``: it must cover that
    window, with indices below ``items`` (samples, or pieces when packed) and counts every
    rank's loop can run: the static counts unless ``config.variable_batch``, else within its
    batch bounds (or the static plan's, where wider); a packed rank holds a piece wherever
    the static plan gives every rank one. Its loss weights must be the ones its counts
    imply (packed windows: checked per micro-batch by the session). That the ranks' parts
    together are the static window is the vote's to establish (module docstring).

    Args:
        plan: this rank's part of the window.
        static: the epoch's static plan.
        config: the job's configuration (batch bounds, packing).
        rank: this rank.
        first: the window's first step.
        stop: one past its last step.
        items: how many samples (pieces, when packed) exist.

    Example::

        >>> why = fault(plan, static, scheduler.config, rank, 16, 32, len(sizes))
        >>> use = why is None  # else the static plan serves the window
    """
    steps = stop - first
    if (plan.epoch, plan.first, plan.num_steps) != (static.epoch, first, steps):
        return f"it covers epoch {plan.epoch} steps {plan.first}+{plan.num_steps}"
    if (plan.micro is None) != (static.micro is None):
        return "it is packed and the configuration is not" if plan.micro else "it is not packed"
    if plan.indices.shape[0] and plan.indices.max() >= items:
        return f"it names item {int(plan.indices.max())} of {items}"
    world = config.num_replicas
    if plan.indices.shape[0] * world >= MODULUS:
        # The vote's collision bound needs the ranks' parts to hold fewer pairs together.
        return f"it holds {plan.indices.shape[0]} entries, too many for {world} ranks"
    counts = np.diff(plan.offsets)
    expected = static.counts[first:stop]
    low, high = _count_bounds(config, expected)
    bad = np.flatnonzero((counts < low[:, rank]) | (counts > high[:, rank]))
    if bad.shape[0]:
        i = int(bad[0])
        return (
            f"step {first + i} gives rank {rank} {counts[i]} samples, outside "
            f"[{low[i, rank]}, {high[i, rank]}] (a count the ranks' loops could not all run)"
        )
    if static.micro is None:
        totals = static.bounds[first:stop, -1] - static.bounds[first:stop, 0]
        for i, step in enumerate(range(first, stop)):
            weight = counts[i] * world / max(int(totals[i]), 1)
            if not math.isclose(plan.weights[i], weight, rel_tol=1e-9, abs_tol=1e-12):
                return f"step {step} has loss weight {plan.weights[i]!r}, not {weight!r}"
    return None


def _count_bounds(config: ScheduleConfig, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least and most samples per (step, rank) a window may give, given ``expected``
    (the static plan's counts of its steps): exactly those without variable batches; else
    the batch bounds, widened to the step's static counts (a short last step); packed: at
    least one piece where the static plan gives every rank one."""
    least = expected.min(axis=1, keepdims=True)
    most = expected.max(axis=1, keepdims=True)
    if config.packing is not None:
        low, high = np.minimum(least, 1), np.full_like(most, np.iinfo(np.int64).max)
    elif not config.variable_batch:
        return expected, expected
    else:
        bounds = config.batch_bounds()
        low, high = np.minimum(least, bounds[0]), np.maximum(most, bounds[1])
    return np.broadcast_to(low, expected.shape), np.broadcast_to(high, expected.shape)
