"""``chronica.plan_step``: the promises of ``chronica.core.packing.planner`` over a wide random
matrix (world sizes 1-512, caps, rows, groups, padding, count rules, both objectives, empty
and one-document steps): equal micro-batch counts, no empty rank, caps and document limits
held, groups never split, every document exactly once, loss weights giving the global mean;
and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronica
from chronica import CostModel, OutlierDelay, Packing, Pipeline, plan_step
from chronica.core.pipeline import pipeline_makespan


@st.composite
def steps(draw):
    """A global batch, its ranks and its packing options."""
    world = draw(st.sampled_from([1, 2, 3, 4, 7, 8, 16, 64, 256, 512]))
    cap = draw(st.sampled_from([16, 64, 256, 4096]))
    rows = draw(st.sampled_from([1, 1, 2, 4]))
    row_length = max(1, cap // rows)
    pad = draw(st.sampled_from([1, 1, 2, 8]))
    row_length -= row_length % pad
    if row_length < pad:
        pad = 1
        row_length = max(1, cap // rows)
    packing = Packing(
        max_tokens=row_length * rows,
        row_length=row_length,
        balance=draw(st.sampled_from(["rank", "micro"])),
        micro_batch_multiple=draw(st.sampled_from([1, 1, 2, 4])),
        pad_multiple=pad,
        max_documents_per_row=draw(st.sampled_from([None, None, 2, 8])),
        loss=draw(st.sampled_from(["token", "sample", "loss_token"])),
        pipeline=draw(
            st.sampled_from([None, None, Pipeline(stages=2), Pipeline(stages=2, virtual_stages=2)])
        ),
    )
    n = draw(st.integers(0, 3 * world + 24))
    longest = row_length
    grouped = draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, longest), min_size=n, max_size=n))
    lengths = [min(x, longest // (2 if grouped else 1) or 1) for x in lengths]
    groups = None
    if grouped and n:
        # Pairs (DPO) or small groups (GRPO) of consecutive documents.
        size = draw(st.sampled_from([2, 3]))
        groups = [i // size for i in range(n)]
        lengths = [min(x, max(1, row_length // size // pad * pad)) for x in lengths]
    speeds = draw(st.sampled_from([None, "levels"]))
    return lengths, world, packing, groups, speeds


def _check(plan, lengths, world, packing, groups):
    n = len(lengths)
    padded = packing.padded(np.array(lengths, np.int64))
    batches = [plan.micro_batches(r) for r in range(world)]
    assert all(len(b) == plan.num_micro for b in batches)
    assert plan.num_micro % packing.count_multiple == 0
    assert plan.num_micro >= (packing.pipeline.min_micro_batches if packing.pipeline else 1)
    everything = np.concatenate([d for b in batches for d in b]) if n else np.array([], int)
    assert sorted(everything.tolist()) == list(range(n)), "every document exactly once"
    unit_of = np.arange(n) if groups is None else np.unique(groups, return_inverse=True)[1]
    for r in range(world):
        assert sum(d.size for d in batches[r]) > 0, "no empty rank"
        if len({int(unit_of[d]) for b in batches[r] for d in b}) >= plan.num_micro:
            assert all(d.size for d in batches[r]), "an empty micro-batch beside a full one"
        for k in range(plan.num_micro):
            assert padded[batches[r][k]].sum() <= packing.max_tokens
            for docs in plan.rows(r, k):
                assert padded[docs].sum() <= packing.length
                if packing.max_documents_per_row:
                    assert docs.size <= packing.max_documents_per_row
            offsets = plan.cu_seqlens(r, k)
            assert offsets[-1] == padded[batches[r][k]].sum()
            assert plan.position_ids(r, k).shape == (offsets[-1],)
    if groups is not None:
        where = {}
        for r in range(world):
            for k, docs in enumerate(batches[r]):
                for d in docs.tolist():
                    where.setdefault(groups[d], set()).add((r, k, int(plan.row[d])))
        assert all(len(places) == 1 for places in where.values()), "a group was split"


@settings(max_examples=300, deadline=None)
@given(case=steps(), data=st.data())
def test_every_promise_holds_over_a_wide_random_matrix(case, data):
    lengths, world, packing, groups, speeds = case
    n = len(lengths)
    loss_tokens = None
    if packing.loss == "loss_token":
        loss_tokens = [data.draw(st.integers(0, x)) for x in lengths]
    speed = None if speeds is None else np.array([1.0, 2.0, 0.5, 1.5])[np.arange(world) % 4]
    units = n if groups is None else len(set(groups))
    largest_group = 1 if groups is None or not n else max(groups.count(g) for g in set(groups))
    if units < world:
        with pytest.raises(ValueError, match="rank would be left empty"):
            plan_step(lengths, world, packing, groups=groups, loss_tokens=loss_tokens,
                      speeds=speed)  # fmt: skip
        return
    padded = packing.padded(np.array(lengths, np.int64))
    if groups is not None and n and np.bincount(groups, weights=padded).max() > packing.length:
        with pytest.raises(ValueError, match="longer than row_length"):
            plan_step(lengths, world, packing, groups=groups, loss_tokens=loss_tokens)
        return
    if units >= world and largest_group > (packing.max_documents_per_row or n):
        with pytest.raises(ValueError, match="exceeds max_documents_per_row"):
            plan_step(lengths, world, packing, groups=groups, loss_tokens=loss_tokens)
        return
    plan = plan_step(
        lengths, world, packing, groups=groups, loss_tokens=loss_tokens,
        cost=CostModel.quadratic(b=24.0, c=1.0), speeds=speed,
    )  # fmt: skip
    _check(plan, lengths, world, packing, groups)
    # The loss weights: any per-unit losses, averaged per micro-batch, weighted, summed per
    # rank and averaged over the ranks, give the global mean over the units.
    counted = {
        "token": np.array(lengths, float),
        "sample": np.ones(n),
        "loss_token": np.array(loss_tokens or [], float),
    }[packing.loss]
    losses = np.array(data.draw(st.lists(st.floats(0, 10), min_size=n, max_size=n)))
    if counted.sum() == 0:
        assert all((plan.loss_weights(r) == 0).all() for r in range(world))
        return
    total = 0.0
    for r in range(world):
        weights = plan.loss_weights(r)
        for k, docs in enumerate(plan.micro_batches(r)):
            units_here = counted[docs].sum()
            if units_here:
                total += weights[k] * (losses[docs] * counted[docs]).sum() / units_here
            else:
                assert weights[k] == 0
    expected = (losses * counted).sum() / counted.sum()
    assert total / world == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    world=st.sampled_from([2, 4, 8, 16]),
    balance=st.sampled_from(["rank", "micro"]),
)
def test_the_plan_is_deterministic_and_its_figures_add_up(seed, world, balance):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(6, 1.2, 40 * world).astype(np.int64) + 1, 4096)
    packing = Packing(max_tokens=4096, balance=balance)
    cost = CostModel.quadratic(b=4096.0, c=1.0)
    plan = plan_step(lengths, world, packing, cost=cost)
    again = plan_step(lengths.tolist(), world, packing, cost=cost)
    assert plan.rank.tobytes() == again.rank.tobytes()
    assert plan.micro.tobytes() == again.micro.tobytes()
    costs = cost(lengths.astype(float))
    for r in range(world):
        for k, docs in enumerate(plan.micro_batches(r)):
            assert plan.micro_costs[r, k] == pytest.approx(costs[docs].sum())
    assert plan.lockstep_time >= plan.rank_time >= plan.bound * (1 - 1e-12)
    assert plan.rank_time == pytest.approx(plan.rank_costs.max())


@pytest.mark.parametrize(
    "packing,loss_tokens",
    [
        (Packing(max_tokens=64), None),
        (Packing(max_tokens=64, balance="micro", loss="sample"), None),
        (Packing(max_tokens=64, loss="loss_token"), np.zeros(24, np.int64)),
        (Packing(max_tokens=64, context_parallel=2, pad_multiple=4), None),
    ],
)
def test_micro_weights_are_every_ranks_loss_weights(packing, loss_tokens):
    lengths = np.random.default_rng(3).integers(1, 60, 24)
    plan = plan_step(lengths, 4, packing, loss_tokens=loss_tokens)
    table = plan.micro_weights
    assert table.shape == (4, plan.num_micro)
    for r in range(4):
        assert table[r].tobytes() == plan.loss_weights(r).tobytes()
    table[:] = -1.0  # a copy: the plan's weights stay
    assert (plan.loss_weights(0) >= 0).all()


def test_each_objective_wins_on_its_own_figure():
    rng = np.random.default_rng(7)
    cost = CostModel.quadratic(b=24576.0, c=1.0)
    lockstep, rank = [], []
    for _ in range(5):
        lengths = np.minimum(rng.lognormal(7, 1.5, 1024).astype(np.int64) + 1, 16384)
        by_rank = plan_step(lengths, 16, Packing(max_tokens=16384), cost=cost)
        by_micro = plan_step(lengths, 16, Packing(max_tokens=16384, balance="micro"), cost=cost)
        lockstep.append(by_micro.lockstep_time / by_rank.lockstep_time)
        rank.append(by_rank.rank_time / by_micro.rank_time)
    assert max(lockstep) < 1.0 and max(rank) <= 1.0


def test_groups_count_as_one_unit_and_share_a_micro_batch():
    lengths = [100, 90, 80, 70, 60, 50, 40, 30]
    plan = plan_step(lengths, 2, Packing(max_tokens=256), groups=[7, 7, 3, 3, 9, 9, 1, 1])
    for r in range(2):
        for docs in plan.micro_batches(r):
            ids = {[7, 7, 3, 3, 9, 9, 1, 1][d] for d in docs.tolist()}
            assert all(sum(1 for d in docs.tolist() if [7, 7, 3, 3, 9, 9, 1, 1][d] == g) == 2
                       for g in ids)  # fmt: skip


def test_refusals_name_the_argument_and_the_fix():
    packing = Packing(max_tokens=64)
    with pytest.raises(ValueError, match="rank would be left empty"):
        plan_step([], 1, packing)
    with pytest.raises(ValueError, match="rank would be left empty"):
        plan_step([3, 4], 4, packing)
    with pytest.raises(ValueError, match="longer than row_length=64"):
        plan_step([65, 1], 1, packing)
    with pytest.raises(ValueError, match="group 5 of 70 tokens"):
        plan_step([40, 30, 1], 1, packing, groups=[5, 5, 6])
    with pytest.raises(TypeError, match="lengths must be whole numbers"):
        plan_step([True, False], 1, packing)
    with pytest.raises(TypeError, match="lengths must be whole numbers"):
        plan_step([1.5, 2.0], 1, packing)
    with pytest.raises(ValueError, match="lengths must be finite and >= 0"):
        plan_step([-1, 2], 1, packing)
    with pytest.raises(TypeError, match=r"packing must be a chronica\.Packing"):
        plan_step([1, 2], 1, 64)
    with pytest.raises(ValueError, match="pass loss_tokens="):
        plan_step([1, 2], 1, Packing(max_tokens=8, loss="loss_token"))
    with pytest.raises(ValueError, match="loss_tokens must be <= lengths"):
        plan_step([1, 2], 1, Packing(max_tokens=8, loss="loss_token"), loss_tokens=[2, 2])
    with pytest.raises(ValueError, match="loss_tokens= is used by"):
        plan_step([1, 2], 1, packing, loss_tokens=[1, 1])
    with pytest.raises(TypeError, match="groups must be 2 integer group ids"):
        plan_step([1, 2], 1, packing, groups=["a", "b"])
    with pytest.raises(ValueError, match=r"chronica\.OutlierQueue"):
        plan_step([1, 2], 1, Packing(max_tokens=8, outliers=OutlierDelay()))
    with pytest.raises(ValueError, match=r"cost=.* more than 2\*\*128"):
        plan_step([60] * 4, 1, packing, cost=CostModel.quadratic(c=1e306))


def test_the_plan_shows_its_shape_and_figures():
    plan = chronica.plan_step([5, 4, 3, 2], 2, Packing(max_tokens=8, balance="micro"))
    text = repr(plan)
    assert text.startswith("StepPlan(world_size=2, documents=4, num_micro=1, balance='micro'")
    assert "lockstep_time=7" in text and "bound=7" in text


@pytest.mark.parametrize("balance", ["rank", "micro"])
@pytest.mark.parametrize("pipeline", [Pipeline(stages=4), Pipeline(stages=4, virtual_stages=2)])
def test_a_pipeline_sets_the_counts_and_orders_the_micro_batches(balance, pipeline):
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(7, 1.5, 400).astype(np.int64) + 1, 8192)
    cost = CostModel.quadratic(b=24576.0, c=1.0)
    flat = plan_step(lengths, 4, Packing(max_tokens=8192, balance=balance), cost=cost)
    piped = plan_step(
        lengths, 4, Packing(max_tokens=8192, balance=balance, pipeline=pipeline), cost=cost
    )
    assert piped.num_micro % pipeline.micro_batch_multiple == 0
    assert piped.num_micro >= pipeline.min_micro_batches
    assert flat.pipeline_time is None and flat.pipeline_bound is None
    # The order never lengthens any rank's simulated step, and micro-batch k's costs are
    # the costs of its documents.
    costs = cost(piped.padded.astype(float))
    for r in range(4):
        for k, docs in enumerate(piped.micro_batches(r)):
            assert piped.micro_costs[r, k] == pytest.approx(costs[docs].sum())
        if balance == "micro":
            continue  # one order for every rank, chosen for the lockstep maxima (below)
        unordered = np.sort(piped.micro_costs[r])
        assert pipeline_makespan(piped.micro_costs[r], pipeline) <= pipeline_makespan(
            unordered, pipeline
        ) * (1 + 1e-12)
    assert piped.pipeline_time <= piped.pipeline_bound * 1.10
    if balance == "micro":
        steps = piped.micro_costs.max(0)
        assert pipeline_makespan(steps, pipeline) <= pipeline_makespan(np.sort(steps), pipeline)
