"""Pure-Python twin of ``chronica.core.packing.lockstep``: the lockstep greedy on lists."""

from __future__ import annotations

import numpy as np
import reference


def lockstep_pack(lengths, costs, docs, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep_attempt``: ``(rank, micro, row, cells)`` lists, or ``None`` if a unit fits
    no cell. Each unit, by descending cost, to the cell minimising (rise of its micro-batch's
    maximum, slack left below that maximum, its new time, micro-batch, rank); while no more
    units are left than cells are empty, only empty cells are candidates."""
    w, n = len(speeds), len(lengths)
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    count = [[0] * num_micro for _ in range(w)]
    cells = [[0.0] * num_micro for _ in range(w)]
    top = [0.0] * num_micro
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    empty = w * num_micro
    for t, i in enumerate(reference.descending_order(np.asarray(costs))):
        forced = empty > 0 and n - t <= empty
        candidates = []
        for k in range(num_micro):
            for r in range(w):
                if forced and count[r][k] > 0:
                    continue
                q = reference.fit_row(free[r][k], lengths[i], slots[r][k], docs[i])
                if q < 0:
                    continue
                time = (cells[r][k] + costs[i]) / speeds[r]
                rise = max(0.0, time - top[k])
                candidates.append((rise, top[k] - time if rise == 0.0 else 0.0, time, k, r, q))
        if not candidates:
            return None
        _, _, time, k, r, q = min(candidates)
        rank[i], micro[i], row[i] = r, k, q
        free[r][k][q] -= lengths[i]
        slots[r][k][q] -= docs[i]
        empty -= count[r][k] == 0
        count[r][k] += 1
        cells[r][k] += costs[i]
        top[k] = max(top[k], time)
    return rank, micro, row, cells
