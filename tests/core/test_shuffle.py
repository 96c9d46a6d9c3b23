from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy, label_skew, movement
from chronica.core.shuffle import stratified_order

POLICIES = [
    ShufflePolicy("global"),
    ShufflePolicy("none"),
    ShufflePolicy.block(5),
    ShufflePolicy("stratified"),
    ShufflePolicy.local(),
    ShufflePolicy.local("strided"),
    ShufflePolicy.local("contiguous", pre_shuffle=True),
    ShufflePolicy.partial(0.3),
    ShufflePolicy.partial(1.0, "strided", pre_shuffle=True),
]
KINDS = [("static", True), ("static", False), ("guided", True)]


def _make(n, w, k, policy, kind=("static", True), groups=None, drop_last=False, **extra):
    sizes = np.random.default_rng(n + w).lognormal(3, 1, n)
    labels = np.arange(n) % 7
    cfg = ScheduleConfig(
        w,
        None if k is None else w * k,
        kind=kind[0],
        exact=kind[1],
        shuffle=policy,
        drop_last=drop_last,
        groups=groups,
    )
    return Scheduler(sizes, cfg, labels=labels, **extra)


def _check(sch, epoch):
    n, w = sch.num_samples, sch.config.num_replicas
    plan = sch.plan_epoch(epoch)
    per_rank = n // w if sch.config.drop_last else -(-n // w)
    streams = [plan.rank_indices(r) for r in range(w)]
    assert all(s.shape[0] == per_rank for s in streams)
    assert np.all(plan.counts == plan.counts[:, :1])  # equal counts every step
    seen = Counter(np.concatenate(streams).tolist())
    assert sum(seen.values()) == per_rank * w
    if per_rank * w >= n:
        assert set(seen) == set(range(n))  # nothing lost; repeats only as padding
        assert sum(c - 1 for c in seen.values()) == per_rank * w - n
    else:
        assert all(c == 1 for c in seen.values())  # dropping never repeats
    base = sch.base_partitions()
    if base is not None:  # locality: a rank only sees its node's samples
        epoch_parts = sch.node_samples(epoch)
        for r in range(w):
            node = sch.nodes.rank_owner[r]
            assert set(streams[r].tolist()) <= set(epoch_parts[node].tolist())
            if sch.config.shuffle.kind == "local":
                assert set(streams[r].tolist()) <= set(base[node].tolist())
    return plan


@given(
    n=st.integers(0, 120),
    w=st.integers(1, 6),
    k=st.one_of(st.none(), st.integers(1, 4)),
    policy=st.sampled_from(POLICIES),
    kind=st.sampled_from(KINDS),
    drop_last=st.booleans(),
    nodes=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_every_policy_is_exactly_once_local_and_equal(
    n, w, k, policy, kind, drop_last, nodes, epoch
):
    if k is None and kind != ("static", True):
        return
    groups = [r // 2 for r in range(w)] if nodes else None
    _check(_make(n, w, k, policy, kind, groups, drop_last), epoch)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", [ShufflePolicy.local(), ShufflePolicy.partial(0.2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_explicit_unequal_partitions_are_fitted_and_local(drop_last, policy, kind):
    n = 103
    parts = [np.arange(0, 70), np.arange(70, 80), np.arange(80, 103)]
    groups = [0, 0, 1, 2]
    sch = _make(n, 4, 3, policy, kind, groups=groups, drop_last=drop_last, partitions=parts)
    base = sch.base_partitions()
    per_rank = n // 4 if drop_last else -(-n // 4)
    assert [b.shape[0] for b in base] == [2 * per_rank, per_rank, per_rank]
    # Every node keeps what it had, up to its size; only the first node's surplus moves.
    for mine, given_part in zip(base, parts, strict=True):
        kept = set(mine.tolist()) & set(given_part.tolist())
        assert len(kept) == min(len(given_part), len(mine))
    for epoch in range(3):
        _check(sch, epoch)


def test_bad_partitions_and_groups_are_named():
    with pytest.raises(ValueError, match="exactly once"):
        _make(10, 2, 1, ShufflePolicy.local(), groups=[0, 1], partitions=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="one index list per node"):
        _make(10, 2, 1, ShufflePolicy.local(), groups=[0, 1], partitions=[np.arange(10)])
    with pytest.raises(ValueError, match="groups has 3 entries"):
        ScheduleConfig(2, groups=[0, 0, 1])
    with pytest.raises(ValueError, match="only applies"):
        _make(10, 2, 1, ShufflePolicy("global"), partitions=[np.arange(5), np.arange(5, 10)])
    with pytest.raises(ValueError, match="needs labels"):
        Scheduler(np.ones(4), ScheduleConfig(2, shuffle="stratified"))
    with pytest.raises(ValueError, match="needs a fraction"):
        ScheduleConfig(2, shuffle="partial")
    with pytest.raises(ValueError, match="q="):
        ShufflePolicy.partial(1.5)


def test_partial_with_q_zero_is_local():
    a = _make(500, 4, 8, ShufflePolicy.local(), groups=[0, 0, 1, 1])
    b = _make(500, 4, 8, ShufflePolicy.partial(0.0), groups=[0, 0, 1, 1])
    for epoch in range(3):
        assert a.plan_epoch(epoch).indices.tobytes() == b.plan_epoch(epoch).indices.tobytes()


@pytest.mark.parametrize("nodes", [4, 16])
def test_movement_matches_the_analytic_figures(nodes):
    n = 16000
    w = nodes
    expect_global = n * (1 - 1 / nodes)
    # torch's split of a global permutation (balancing keeps heavy samples on the same
    # ranks a little more often, which moves slightly less)
    glob = _make(n, w, None, ShufflePolicy("global"))
    assert movement(glob, 2).total_samples == pytest.approx(expect_global, rel=0.03)
    local = _make(n, w, 4, ShufflePolicy.local())
    assert movement(local, 2).total_samples == 0
    for q in (0.1, 0.5, 1.0):
        part = _make(n, w, 4, ShufflePolicy.partial(q))
        assert movement(part, 2).total_samples == pytest.approx(q * expect_global, rel=0.05)
    sample_bytes = np.full(n, 10)
    assert movement(glob, 2, sample_bytes).total_bytes == 10 * movement(glob, 2).total_samples


def test_stratified_batches_follow_the_label_frequencies():
    n = 4000
    labels = np.random.default_rng(0).integers(0, 10, n)
    cfg = dict(num_replicas=4, batch_size=64)
    strat = Scheduler(np.ones(n), ScheduleConfig(**cfg, shuffle="stratified"), labels=labels)
    plain = Scheduler(np.ones(n), ScheduleConfig(**cfg, shuffle="global"))
    assert label_skew(strat, 0, labels).batch_mean < label_skew(plain, 0, labels).batch_mean / 3
    order = stratified_order(labels, np.uint64(5))
    assert np.array_equal(np.sort(order), np.arange(n))


def test_local_policy_balances_within_nodes_and_pool_across_steps():
    sizes = np.random.default_rng(1).lognormal(5, 1, 4096)
    groups = [r // 4 for r in range(8)]
    exact = Scheduler(sizes, ScheduleConfig(8, 256, shuffle=ShufflePolicy.local(), groups=groups))
    pool = Scheduler(
        sizes, ScheduleConfig(8, 256, exact=False, shuffle=ShufflePolicy.local(), groups=groups)
    )
    unbalanced = Scheduler(
        sizes, ScheduleConfig(8, None, shuffle=ShufflePolicy.local(), groups=groups)
    )
    assert pool.stats(1).load_ratio_mean < exact.stats(1).load_ratio_mean
    assert exact.stats(1).load_ratio_mean < 1.2
    assert unbalanced.base_partitions() is not None


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}-{p.partition}-{p.q}")
def test_every_policy_is_deterministic_and_reshuffles(policy):
    groups = [0, 0, 1, 1]
    a = _make(400, 4, 4, policy, ("static", False), groups)
    b = _make(400, 4, 4, policy, ("static", False), groups)
    for epoch in (0, 3):
        assert a.plan_epoch(epoch).indices.tobytes() == b.plan_epoch(epoch).indices.tobytes()
    if policy.shuffles:
        assert a.plan_epoch(0).indices.tobytes() != a.plan_epoch(1).indices.tobytes()


@pytest.mark.parametrize("n,total", [(10, 10), (10, 7), (10, 13), (3, 11), (1, 4)])
@pytest.mark.parametrize("policy", ["global", "block", "none"])
def test_fitted_order_is_the_padded_epoch_order_in_a_compact_type(n, total, policy):
    from chronica.core.partition import _fitted, fitted_order
    from chronica.core.shuffle import as_shuffle_policy, epoch_order

    shuffle = as_shuffle_policy(policy)
    got, padded, dropped = fitted_order(shuffle, n, 5, 2, None, total)
    expect = _fitted(epoch_order(shuffle, n, 5, 2, None), total)
    assert got.tolist() == expect[0].tolist()
    assert (padded, dropped) == expect[1:]
    assert got.dtype == (np.int32 if policy == "global" else np.int64)


def test_permutation_into_a_narrow_buffer_is_the_same_permutation():
    from chronica.core.rng import permutation

    out = np.empty(1000, np.int32)
    assert permutation(1000, np.uint64(9), out=out) is out
    assert out.tolist() == permutation(1000, np.uint64(9)).tolist()
    with pytest.raises(ValueError, match="out has shape"):
        permutation(10, np.uint64(9), out=np.empty(9, np.int32))
