"""The pipeline kernels against the pure-Python references of ``pipeline_reference``: the
programs hold every operation once in the schedule's order, the one-pass simulation gives
the reference's makespan on random costs, and the search keeps its promises."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_reference import device_operations, reference_makespan, zero_bubble_operations

from chronica.core import pipeline_kernels as kernels

KINDS = {kernels.F: "F", kernels.B: "B", kernels.W: "W"}


def _units(stages: int, virtual: int, schedule: str, ratio: float) -> np.ndarray:
    forward = 1.0 / ((1.0 + ratio) * stages * virtual)
    backward = ratio * forward
    if schedule == "zero_bubble":
        return np.array([forward, backward / 2, backward / 2])
    return np.array([forward, backward, 0.0])


@st.composite
def cases(draw):
    schedule = draw(st.sampled_from(["1f1b", "interleaved", "zero_bubble"]))
    stages = draw(st.integers(1, 6))
    if schedule == "interleaved":
        virtual = draw(st.integers(2, 3))
        micro = draw(st.integers(1, 4)) * stages
    else:
        virtual = 1
        micro = draw(st.integers(1, 13))
    costs = draw(st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=micro, max_size=micro))
    ratio = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    return schedule, stages, virtual, costs, ratio


@settings(max_examples=150)
@given(cases())
def test_the_kernels_match_the_reference(case):
    schedule, stages, virtual, costs, ratio = case
    prog = kernels.program(stages, virtual, schedule, len(costs))
    got = kernels.makespan(prog, np.array(costs), _units(stages, virtual, schedule, ratio))
    want = reference_makespan(costs, stages, virtual, schedule, ratio)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zero_bubble"])
def test_the_programs_are_the_schedules_written_out(schedule):
    stages, virtual = 4, (2 if schedule == "interleaved" else 1)
    micro = 8
    prog = kernels.program(stages, virtual, schedule, micro)
    kinds = "FBW" if schedule == "zero_bubble" else "FB"
    for d in range(stages):
        ops = [
            (KINDS[int(k)], int(c), int(s))
            for k, c, s in zip(prog.kind[d], prog.chunk[d], prog.slot[d], strict=True)
        ]
        if schedule == "zero_bubble":
            assert ops == zero_bubble_operations(stages, micro)[d]
            # A weight gradient after its own backward.
            assert all(ops.index(("W", 0, s)) > ops.index(("B", 0, s)) for s in range(micro))
        else:
            assert ops == device_operations(stages, virtual, schedule, micro, d)
        # Every chunk of the device runs every micro-batch's operations once.
        assert sorted(ops) == sorted(
            (kind, c, s) for kind in kinds for c in range(virtual) for s in range(micro)
        )


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zero_bubble"])
def test_the_flat_order_is_topological_and_the_programs_are_read_only(schedule):
    prog = kernels.program(3, 2 if schedule == "interleaved" else 1, schedule, 6)
    n = prog.flat_kind.shape[0]
    assert n == prog.kind.size
    positions = np.arange(n)
    assert np.all(prog.prev < positions) and np.all(prog.dep < positions)
    with pytest.raises(ValueError):
        prog.kind[0, 0] = 1


def test_the_search_returns_the_best_start_on_its_own_and_improves_it():
    prog = kernels.program(4, 1, "1f1b", 8)
    costs = np.array([4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 1.0, 1.0])
    units = _units(4, 1, "1f1b", 2.0)
    starts = np.array([np.arange(8), np.arange(8)[::-1]])
    chosen = kernels.search(prog, starts, costs, units, 2)  # only the starts
    assert chosen.tolist() == list(range(8))[::-1]
    improved = kernels.search(prog, starts[:1].copy(), costs, units, 100)
    assert kernels.makespan(prog, costs[improved], units) < kernels.makespan(prog, costs, units)


def test_every_order_is_tried_when_the_budget_allows():
    prog = kernels.program(3, 1, "1f1b", 5)
    costs = np.random.default_rng(5).lognormal(0, 1, 5)
    units = _units(3, 1, "1f1b", 2.0)
    best = min(kernels.makespan(prog, costs[list(p)], units) for p in permutations(range(5)))
    order = kernels.search(prog, np.arange(5)[None, :], costs, units, 120)
    assert kernels.makespan(prog, costs[order], units) == pytest.approx(best)
