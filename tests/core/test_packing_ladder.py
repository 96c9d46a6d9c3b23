"""The ladders of ``chronica.core.packing.ladder``: ``rung``, ``climb`` and ``sink`` keep a
class's cells sorted by (cost, rank) through any change of one cell."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.packing.ladder import cell_before, climb, rung, sink


def _sorted_ladder(cells: np.ndarray) -> list[int]:
    return sorted(range(cells.shape[0]), key=lambda r: (cells[r], r))


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=12),
    st.data(),
    st.integers(-6, 6),
)
def test_a_changed_cell_takes_its_sorted_place(values, data, change):
    cells = np.array(values, dtype=np.float64)
    ladder = np.array(_sorted_ladder(cells), np.int64)
    r = data.draw(st.integers(0, cells.shape[0] - 1))
    x = rung(cells, ladder, ladder.shape[0], r)
    assert ladder[x] == r
    cells[r] += change
    if change >= 0:
        climb(cells, ladder, ladder.shape[0], x, r)
    else:
        sink(cells, ladder, x, r)
    assert ladder.tolist() == _sorted_ladder(cells)


def test_cells_are_ordered_by_rise_slack_time_micro_batch_rank():
    assert cell_before(0.0, 5.0, 9.0, 3, 3, 1.0, 0.0, 0.0, 0, 0)
    assert cell_before(0.0, 1.0, 9.0, 3, 3, 0.0, 2.0, 0.0, 0, 0)
    assert cell_before(0.0, 1.0, 1.0, 3, 3, 0.0, 1.0, 2.0, 0, 0)
    assert cell_before(0.0, 1.0, 1.0, 0, 3, 0.0, 1.0, 1.0, 1, 0)
    assert not cell_before(0.0, 1.0, 1.0, 0, 3, 0.0, 1.0, 1.0, 0, 3)
