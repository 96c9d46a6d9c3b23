"""Pure-Python twin of ``chronica.core.packing.context_kernels.place_loaded``: LPT under row
capacities from a state whose rows and loads are already partly taken, then (optionally) the
rank kernel's refinement (``reference.pack_refine``)."""

from __future__ import annotations

import numpy as np
import reference


def place_loaded(lengths, costs, docs, speeds, tight, refined, free, slots, micro_loads, loads):
    """``(rank, micro, row, loads)`` lists, or ``None`` if a document fits nowhere. ``free``,
    ``slots`` (``[rank][micro][row]``), ``micro_loads`` (``[rank][micro]``) and ``loads``
    are nested lists, mutated in place."""
    lengths = [int(x) for x in lengths]
    docs = [int(d) for d in docs]
    costs = [float(c) for c in costs]
    speeds = [float(s) for s in speeds]
    w, n = len(speeds), len(lengths)
    room = [reference.largest_room(free[r], slots[r]) for r in range(w)]
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    for i in reference.descending_order(np.asarray(costs, dtype=np.float64)):
        i = int(i)
        fitting = [
            ((loads[r] + costs[i]) / speeds[r], r)
            for r in range(w)
            if room[r] >= lengths[i]
            and reference.fit_micro(free[r], micro_loads[r], lengths[i], tight, slots[r], docs[i])[
                0
            ]
            >= 0
        ]
        if not fitting:
            return None
        best = min(fitting)[1]
        m, k = reference.fit_micro(
            free[best], micro_loads[best], lengths[i], tight, slots[best], docs[i]
        )
        rank[i], micro[i], row[i] = best, m, k
        free[best][m][k] -= lengths[i]
        slots[best][m][k] -= docs[i]
        micro_loads[best][m] += costs[i]
        loads[best] += costs[i]
        room[best] = reference.largest_room(free[best], slots[best])
    if refined:
        reference.pack_refine(
            lengths, costs, docs, speeds, tight, free, slots, micro_loads, room, rank, micro,
            row, loads,
        )  # fmt: skip
    return rank, micro, row, loads
