"""Context-parallel plans (``Packing(context_parallel=g)``, ``chronica.core.packing.context_step``
through ``chronica.plan_step``): every token of every document exactly once across the
(DP, CP) devices, a sharded document's chunks reassembling to it on one micro-batch of one
group, equal causal work per CP rank for sharded documents, caps held per device, predicted
costs equal to the layout's, loss weights giving the global token mean; the outliers are
sharded and the wall falls; and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica import CostModel, Packing, Pipeline, plan_step
from chronica.core.config import ScheduleConfig
from chronica.core.packing.context_parallel import causal_work, restore_order
from chronica.core.packing.context_step import pack_context_step, shard_choice
from chronica.core.packing.step import pack_step


@st.composite
def cp_steps(draw):
    g = draw(st.sampled_from([2, 4, 8]))
    groups = draw(st.sampled_from([1, 2, 3, 8]))
    cap = 2 * g * draw(st.sampled_from([4, 16, 64]))
    rows = draw(st.sampled_from([1, 2]))
    pad = 2 * g
    row_length = cap // rows - (cap // rows) % pad
    n = draw(st.integers(groups * g, groups * g * 4))
    top = draw(st.sampled_from([row_length, g * row_length]))
    lengths = draw(st.lists(st.integers(1, top), min_size=n, max_size=n))
    packing = Packing(
        max_tokens=cap, row_length=row_length, pad_multiple=pad, context_parallel=g,
        max_documents_per_row=draw(st.sampled_from([None, 4])),
        micro_batches=draw(st.sampled_from([None, None, 2])),
    )  # fmt: skip
    cost = draw(st.sampled_from(["linear", "quadratic"]))
    return np.array(lengths), groups * g, packing, cost


def _tokens(plan):
    """Every (document, position) the plan's devices hold, with the device and micro-batch."""
    g = plan.context_parallel
    held = []
    for group in range(plan.world_size // g):
        for k in range(plan.num_micro):
            docs = plan.context_documents(group, k)
            shards = plan.context_shards(group, k)
            total = int(plan.padded[docs].sum())
            assert (
                restore_order(shards).tolist()
                == np.argsort(np.concatenate([s.tokens for s in shards]), kind="stable").tolist()
            )
            assert np.sort(np.concatenate([s.tokens for s in shards])).tolist() == list(
                range(total)
            )
            for c, shard in enumerate(shards):
                device = group * g + c
                assert shard.tokens.size <= plan.packing.max_tokens
                assert shard.position_ids.tolist() == plan.position_ids(device, k).tolist()
                assert shard.cu_seqlens.tolist() == plan.cu_seqlens(device, k).tolist()
                held += [
                    (int(docs[d]), int(p))
                    for d, p in zip(shard.documents, shard.position_ids, strict=True)
                ]
    return held


@settings(max_examples=60, deadline=None)
@given(case=cp_steps())
def test_every_token_once_and_the_layout_consistent(case):
    lengths, w, packing, cost = case
    plan = plan_step(lengths, w, packing, cost=cost)
    g = packing.context_parallel
    held = _tokens(plan)
    want = [(i, p) for i in range(lengths.shape[0]) for p in range(int(plan.padded[i]))]
    assert sorted(held) == want
    # Sharded documents: on every CP rank of one group, in one micro-batch and row slot.
    for i in np.flatnonzero(plan.sharded):
        assert plan.rank[i] % g == 0
        for c in range(g):
            assert i in plan.micro_batches(int(plan.rank[i]) + c)[int(plan.micro[i])]
    # Devices hold the predicted costs: whole documents, and 1/g of every sharded one.
    doc_costs = CostModel.linear() if cost == "linear" else CostModel.quadratic()
    costs = np.asarray(doc_costs(plan.padded.astype(np.float64)))
    for r in range(w):
        for k, docs in enumerate(plan.micro_batches(r)):
            share = np.where(plan.sharded[docs], costs[docs] / g, costs[docs])
            assert plan.micro_costs[r, k] == pytest.approx(share.sum(), rel=1e-9, abs=1e-9)
            for in_row in plan.rows(r, k):
                tokens = np.where(
                    plan.sharded[in_row], plan.padded[in_row] // g, plan.padded[in_row]
                )
                assert tokens.sum() <= packing.length
    assert (plan.micro_costs.sum(1) > 0).all() or lengths.sum() == 0
    weights = sum(plan.loss_weights(r).sum() for r in range(w))
    assert weights == pytest.approx(w)


@settings(max_examples=40, deadline=None)
@given(case=cp_steps())
def test_sharded_documents_give_every_cp_rank_equal_causal_work(case):
    lengths, w, packing, cost = case
    plan = plan_step(lengths, w, packing, cost=cost)
    g = packing.context_parallel
    for group in range(w // g):
        for k in range(plan.num_micro):
            docs = plan.context_documents(group, k)
            shards = plan.context_shards(group, k)
            work = []
            for shard in shards:
                mine = plan.sharded[docs][shard.documents]
                work.append(int((shard.position_ids[mine] + 1).sum()))
            assert len(set(work)) == 1
            assert sum(causal_work(s) for s in shards) == int(
                sum(p * (p + 1) // 2 for p in plan.padded[docs])
            )


def test_the_outliers_are_sharded_and_the_wall_falls():
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(6, 1.5, 4 * 64)), 1, 16384).astype(np.int64)
    cost = CostModel(0.0, 24576.0, 1.0)
    today = plan_step(lengths, 64, Packing(max_tokens=16384), cost=cost)
    assert today.rank_costs.max() / today.rank_costs.mean() > 2
    for g in (4, 8):
        plan = plan_step(lengths, 64, Packing(max_tokens=16384, context_parallel=g,
                                              pad_multiple=2 * g), cost=cost)  # fmt: skip
        costs = cost(plan.padded.astype(np.float64))
        # Within 15% of what g-way sharding allows: the mean, or the largest document's 1/g.
        wall = max(plan.rank_costs.mean(), costs.max() / g)
        assert plan.rank_costs.max() < 1.15 * wall < today.rank_costs.max() / 2
        assert costs[plan.sharded].min() > costs[~plan.sharded].max()


def test_long_documents_are_sharded_up_to_g_rows():
    packing = Packing(max_tokens=16, context_parallel=2, pad_multiple=4)
    plan = plan_step([32, 4, 4, 4], 2, packing)
    assert plan.sharded.tolist() == [True, False, False, False]
    assert [s.tokens.size for s in plan.context_shards(0, 0)] == [16, 16]
    with pytest.raises(ValueError, match="context_parallel · row_length = 32"):
        plan_step([36, 4, 4, 4], 2, packing)


def test_context_parallel_one_is_the_plan_of_today():
    packing = Packing(max_tokens=64, pad_multiple=2)
    assert Packing(max_tokens=64, pad_multiple=2, context_parallel=1) == packing
    assert (
        packing.to_tuple() == Packing(max_tokens=64, pad_multiple=2, context_parallel=1).to_tuple()
    )
    assert "context_parallel" not in repr(packing)
    assert repr(Packing(max_tokens=64, pad_multiple=4, context_parallel=2)) == (
        "Packing(max_tokens=64, pad_multiple=4, context_parallel=2)"
    )
    # The digest of a configuration reads Packing.to_tuple (a sampler's configuration
    # refuses context_parallel > 1, so the tuples are compared).
    assert (
        Packing(max_tokens=64, pad_multiple=4, context_parallel=2).to_tuple()
        != Packing(max_tokens=64, pad_multiple=4).to_tuple()
    )
    with pytest.raises(ValueError, match=r"context_parallel=2.*chronica\.plan_step"):
        ScheduleConfig(
            num_replicas=2,
            batch_size=4,
            packing=Packing(max_tokens=64, pad_multiple=4, context_parallel=2),
        )
    lengths = np.array([30, 3, 9, 12, 5, 7, 1, 20])
    assert shard_choice(lengths, lengths * 1.0, np.ones(8, np.int64), 4, packing).sum() == 0


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="pad_multiple=4"):
        Packing(max_tokens=64, context_parallel=2)
    with pytest.raises(TypeError, match="context_parallel"):
        Packing(max_tokens=64, context_parallel=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context_parallel"):
        Packing(max_tokens=64, context_parallel=0)
    cp = {"max_tokens": 64, "pad_multiple": 4, "context_parallel": 2}
    with pytest.raises(ValueError, match="multiple of context_parallel=2"):
        plan_step([4] * 6, 3, Packing(**cp))
    with pytest.raises(ValueError, match="balance='rank'"):
        plan_step([4] * 6, 2, Packing(**cp, balance="micro"))
    with pytest.raises(ValueError, match="balance='rank'"):
        plan_step([4] * 6, 2, Packing(**cp, pipeline=Pipeline(stages=2)))
    with pytest.raises(ValueError, match="loss='token'"):
        plan_step([4] * 6, 2, Packing(**cp, loss="sample"))
    with pytest.raises(ValueError, match="plan_step"):
        pack_step(np.array([4] * 6), np.ones(6), 2, Packing(**cp))
    with pytest.raises(ValueError, match="speeds"):
        pack_context_step(np.array([4] * 6), np.ones(6), 2, Packing(**cp), np.array([1.0]))


def test_device_speeds_are_respected_and_no_device_is_left_empty():
    rng = np.random.default_rng(3)
    lengths = np.clip(np.rint(rng.lognormal(6, 1.5, 48)), 1, 2048).astype(np.int64)
    speeds = np.array([1.0, 1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.0])
    packing = Packing(max_tokens=2048, context_parallel=4, pad_multiple=8)
    plan = plan_step(lengths, 8, packing, cost="quadratic", speeds=speeds)
    held = _tokens(plan)
    assert sorted(held) == [(i, p) for i in range(48) for p in range(int(plan.padded[i]))]
    assert (plan.rank_costs > 0).all()
    assert plan.rank_costs[4:].sum() > plan.rank_costs[:4].sum()
    assert plan.rank_time <= plan_step(lengths, 8, packing, cost="quadratic").rank_costs.max()
    slow = plan_step(lengths, 8, packing, cost="quadratic", speeds=[1.0] * 7 + [1e-3])
    assert (slow.rank_costs > 0).all()
