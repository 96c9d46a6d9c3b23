"""chronica.comm.parts: each rank's message of a planned window holds exactly that rank's
part of every step, batched or one by one alike, under the coordinator's generation."""

import numpy as np
import pytest

from chronica.comm.parts import PlanParts
from chronica.comm.protocol import decode
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.packing import Packing


def _window(packed: bool):
    sizes = np.ceil(np.clip(np.random.default_rng(1).lognormal(5, 1, 900), 1, 256))
    config = ScheduleConfig(6, 96, kind="dynamic", variable_batch=True, window=4)
    if packed:
        packing = Packing(256, row_length=128, tokens_per_step=6000, long_documents="split")
        config = ScheduleConfig(6, None, kind="dynamic", window=4, packing=packing)
    planner = DynamicPlanner(Scheduler(sizes, config))
    for rank in range(6):  # rank 2 is slow: the window is not the static one
        planner.observe(rank, 0, 1.0, 2.0 if rank == 2 else 1.0)
    return planner.plan_window(0, 4)


@pytest.mark.parametrize("packed", [False, True])
def test_each_rank_gets_exactly_its_part_of_every_step(packed):
    window = _window(packed)
    encoder = PlanParts(generation=77)
    parts = encoder.parts(window, seq=5)
    assert parts == [encoder.part(window, rank, 5) for rank in range(6)]
    for rank, payload in enumerate(parts):
        plan = decode(payload, 1 << 24)["plan"]
        assert (plan.seq, plan.gen, plan.epoch, plan.first) == (5, 77, 0, 4)
        np.testing.assert_array_equal(plan.weights, window.loss_weights[:, rank])
        np.testing.assert_array_equal(plan.loads, window.loads[:, rank])
        for i in range(window.num_steps):
            a, b = window.bounds[i, rank], window.bounds[i, rank + 1]
            expected = window.indices[a:b] if not packed else window.micro.pieces[a:b]
            np.testing.assert_array_equal(plan.local(4 + i), expected)
        assert (plan.micro is not None) == packed
        if packed:
            assert plan.micro.counts.tolist() == window.micro.num_micro.tolist()


def test_the_same_window_encodes_to_the_same_bytes():
    window = _window(packed=False)
    encoder = PlanParts(generation=3)
    assert encoder.parts(window, 0) == encoder.parts(window, 0)  # the cached layout too
    assert PlanParts(generation=3).part(window, 4, 0) == encoder.part(window, 4, 0)
    assert PlanParts(generation=4).part(window, 4, 0) != encoder.part(window, 4, 0)


def test_the_generation_is_checked_and_shown():
    assert repr(PlanParts(generation=9)) == "PlanParts(generation=9)"
    with pytest.raises(ValueError, match="generation"):
        PlanParts(generation=0)
    with pytest.raises(TypeError, match="generation"):
        PlanParts(generation="1")
