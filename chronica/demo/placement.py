"""Where a demo rank runs: on a core of its own, where the machine has one per rank."""

from __future__ import annotations

import os

__all__ = ["pin_rank"]


def pin_rank(rank: int, world: int, wanted: bool) -> list[int]:
    """Pin this rank to a core of its own when the machine gives every rank one (``wanted``
    and enough cores in this process's affinity): a rank that waits then cannot lend its
    core to the others, so the wall clock shows the balance too. Returns the ranks' cores,
    empty when not pinned.

    Args:
        rank: this process's rank.
        world: the ranks.
        wanted: whether to pin (``--no-pin`` says no).

    Example::

        cores = pin_rank(rank=1, world=2, wanted=True)   # [0, 1] on a 2-core machine
    """
    if not wanted or not hasattr(os, "sched_getaffinity"):
        return []
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < world:
        return []
    os.sched_setaffinity(0, {cores[rank]})
    return cores[:world]
