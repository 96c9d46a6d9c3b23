"""``chronica.core.packing.lockstep_lpt.lpt_cells`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and its promises: rows keep their
token and document limits, every unit is placed once, no cell is empty where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from lockstep_constructions import GRIDS, check

from chronica.core.packing.lockstep_lpt import lpt_cells


@settings(max_examples=200, deadline=None)
@given(**GRIDS)
def test_lpt_cells_equals_the_reference(**grid):
    check(lpt_cells, lockstep_reference.lpt_pack, **grid)


def test_lpt_cells_breaks_ties_by_the_lower_rank_sum():
    # Four units, four cells: each opens an empty one. 4 opens (0, 0); 3 goes under its
    # maximum on rank 1 (no rise); 2 raises micro-batch 1 equally on either rank and goes to
    # rank 1, whose sum (3) is the lower; 1 takes the last cell.
    free, slots = np.empty((2, 2, 1), np.int64), np.empty((2, 2, 1), np.int64)
    rank, micro, row = (np.empty(4, np.int64) for _ in range(3))
    cells = np.empty((2, 2))
    costs = np.array([4.0, 3.0, 2.0, 1.0])
    assert lpt_cells(np.array([4, 3, 2, 1]), costs, np.ones(4, np.int64), np.arange(4),
                     np.ones(2), 8, 8, free, slots, rank, micro, row, cells)  # fmt: skip
    assert cells.tolist() == [[4.0, 1.0], [3.0, 2.0]]
