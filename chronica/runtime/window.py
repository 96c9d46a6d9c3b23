"""A coordinator's window checked as a whole, and the token the ranks agree on for it.

Why every rank receives the whole window: exactly-once is a property of all the ranks'
parts together (each step's parts must partition the step's samples), so no check a rank
makes of its own part alone can establish it: parts that each fit the static plan can still
give two ranks the same samples, leave one empty or swap two. Hashing each rank's part and
comparing the hashes with a digest the coordinator sends only shows that the ranks hold what
the coordinator meant to send; a wrong coordinator computes that digest from the wrong
parts. So every rank receives every rank's part of the window (``Parts``: a permutation of
the window's samples, about ``window x global batch`` integers, published once for all
ranks beside their plans and attached to the plan by ``PlanClient``), checks that the parts
of each step are exactly the static step's samples with counts the training loop can run
(``fault``), and the ranks agree on a digest of what they checked (``token``). Then:

* a window that is not a partition fails the check on every rank (they all hold it);
* ranks holding different windows (different parts, another planning, a mixed generation,
  a part that is not the rank's share of the window it came with) hold different tokens,
  and the agreement sends all of them to the static plan;
* so every rank uses the coordinator's window only if all hold the same one and it
  partitions every step: tampering is detectable by construction, not by a probability
  that depends on what the coordinator chose to send.

The token also covers the rank's micro-batch counts of a packed window, so ranks with
unequal counts (which would hang gradient accumulation) fall back together.

The cost is bytes: a rank receives about ``8 x (global batch + world)`` more bytes per step
(its plan was ``8 x`` its own batch). The coordinator encodes the window once, but its PUB
socket sends it to every rank: at 64 ranks and a global batch of 16,384, 2,078 -> 133,662
bytes per rank and step (0.13 -> 8.2 MiB per step over all ranks); at 1024 ranks, 158 ->
139,422 bytes (0.15 -> 136 MiB per step), measured with the coordinator's encoder on the
first window of 16 steps of lognormal sizes. Fine up to a few hundred ranks; beyond, a
check that needs only each rank's own part (a multiset hash of the parts under a key the
ranks draw after the plans are sent, combined over the ranks' own collectives) would keep
the same guarantee at constant bytes.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from chronica.comm.protocol import Plan
from chronica.core.plan import EpochPlan
from chronica.core.scheduler import ScheduleConfig
from chronica.runtime.agreement import TOKEN_WORDS, Token

__all__ = ["fault", "token"]


def token(plan: Plan) -> Token:
    """The digest of the window ``plan`` came with, as an agreement token: the same on every
    rank holding the same window (generation, position, every rank's part, and for a packed
    one this rank's micro-batch counts), never ``NO_PLAN``. Only for a ``plan`` with
    ``parts`` (``fault`` returned ``None``)."""
    assert plan.parts is not None
    digest = hashlib.blake2b(digest_size=8 * TOKEN_WORDS)
    head = [plan.gen, plan.epoch, plan.first, *plan.parts.counts.shape]
    digest.update(np.asarray(head, "<i8").tobytes())
    digest.update(np.ascontiguousarray(plan.parts.counts, "<i8").tobytes())
    digest.update(np.ascontiguousarray(plan.parts.indices, "<i8").tobytes())
    if plan.micro is not None:
        digest.update(np.ascontiguousarray(plan.micro.counts, "<i8").tobytes())
    words = np.frombuffer(digest.digest(), "<u8") >> np.uint64(2)
    return (int(words[0]) | 1, *(int(w) for w in words[1:]))


def fault(
    plan: Plan, static: EpochPlan, config: ScheduleConfig, rank: int, first: int, stop: int
) -> str | None:
    """Why ``plan`` cannot serve steps ``first..stop-1`` of ``static``'s epoch at ``rank``,
    or ``None``: it must cover that window, of which (``plan.parts``: every rank's part) its
    own part is ``rank``'s share, and every step's parts must be exactly the static step's
    samples (pieces, when packed), with counts every rank can run: the static counts unless
    ``config.variable_batch``, else within its batch bounds (or the static plan's, where
    wider); a packed rank holds a piece wherever the static plan gives every rank one. The
    own part's loss weights must be the ones its counts imply (packed windows: checked per
    micro-batch where the pieces are known)."""
    steps, world = stop - first, config.num_replicas
    if (plan.epoch, plan.first, plan.num_steps) != (static.epoch, first, steps):
        return f"it covers epoch {plan.epoch} steps {plan.first}+{plan.num_steps}"
    if (plan.micro is None) != (static.micro is None):
        return "it is packed and the configuration is not" if plan.micro else "it is not packed"
    parts = plan.parts
    assert parts is not None  # PlanClient returns plans with their window
    counts = parts.counts
    if counts.shape[1] != world:
        return f"it holds the parts of {counts.shape[1]} ranks, not {world}"
    ends = np.cumsum(counts.ravel()).reshape(counts.shape)
    starts = ends - counts
    own = [parts.indices[a:b] for a, b in zip(starts[:, rank], ends[:, rank], strict=True)]
    if not np.array_equal(np.diff(plan.offsets), counts[:, rank]) or not np.array_equal(
        plan.indices, np.concatenate(own)
    ):
        return "its part is not this rank's share of the window it carries"
    source = static.indices if static.micro is None else static.micro.pieces
    expected = static.counts[first:stop]
    low, high = _count_bounds(config, expected)
    for i, step in enumerate(range(first, stop)):
        whole = source[static.bounds[step, 0] : static.bounds[step, -1]]
        got = parts.indices[starts[i, 0] : ends[i, -1]]
        if got.shape != whole.shape:
            return f"step {step}'s parts hold {got.shape[0]} samples, not {whole.shape[0]}"
        if not np.array_equal(np.sort(got), np.sort(whole)):
            return f"step {step}'s parts repeat or miss samples of the step"
        bad = np.flatnonzero((counts[i] < low[i]) | (counts[i] > high[i]))
        if bad.shape[0]:
            r = int(bad[0])
            return (
                f"step {step} gives rank {r} {counts[i, r]} samples, outside "
                f"[{low[i, r]}, {high[i, r]}] (a count the ranks' loops could not all run)"
            )
        if static.micro is None:
            weight = counts[i, rank] * world / max(whole.shape[0], 1)
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
