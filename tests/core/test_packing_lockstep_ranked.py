"""``chronica.core.packing.lockstep_ranked.ranked_cells`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and its promises: rows keep their
token and document limits, every rank's micro-batches run in descending cost order, no cell
is empty where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from lockstep_constructions import GRIDS, check

from chronica.core.packing.lockstep_ranked import ranked_cells


@settings(max_examples=200, deadline=None)
@given(**GRIDS)
def test_ranked_cells_equals_the_reference(**grid):
    cells = check(ranked_cells, lockstep_reference.ranked_pack, **grid)
    if cells is not None:
        assert (np.diff(cells, axis=1) <= 0).all(), "a rank's micro-batches not by descending cost"
