"""Shuffle policies (``chronica.core.shuffle``): every kind's epoch order and behaviour
flags, validation and repr; through the scheduler, exactly-once coverage, locality,
determinism, movement and label skew of every policy."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy, label_skew, movement
from chronica.core.rng import Stream, derive_key, permutation
from chronica.core.shuffle import as_shuffle_policy, epoch_order, stratified_order

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
            if not sch.config.shuffle.exchanges:
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


# --- the policy object ----------------------------------------------------------------------

FLAGS = {
    # kind: (partitioned, shuffles, needs_labels, permutes_all)
    "global": (False, True, False, True),
    "local": (True, True, False, False),
    "partial": (True, True, False, False),
    "block": (False, True, False, False),
    "stratified": (False, True, True, False),
    "none": (False, False, False, False),
}


@pytest.mark.parametrize("kind", sorted(FLAGS))
def test_every_kind_has_its_behaviour_flags(kind):
    policy = ShufflePolicy(kind)
    assert (
        policy.partitioned,
        policy.shuffles,
        policy.needs_labels,
        policy.permutes_all,
    ) == FLAGS[kind]
    assert not policy.exchanges  # q = 0
    assert ShufflePolicy.partial(0.2).exchanges


def test_epoch_orders_are_the_documented_draws():
    key = derive_key(3, 1, Stream.ORDER)
    n = 23
    assert epoch_order(ShufflePolicy("global"), n, 3, 1, None).tolist() == (
        permutation(n, key).tolist()
    )
    assert epoch_order(ShufflePolicy("none"), n, 3, 1, None).tolist() == list(range(n))
    blocks = epoch_order(ShufflePolicy.block(5), n, 3, 1, None)
    starts = permutation(5, key) * 5
    expected = [s + i for s in starts.tolist() for i in range(5) if s + i < n]
    assert blocks.tolist() == expected
    labels = np.arange(n) % 3
    assert epoch_order(ShufflePolicy("stratified"), n, 3, 1, labels).tolist() == (
        stratified_order(labels, key).tolist()
    )


def test_a_partitioned_policy_has_no_epoch_order_and_stratified_needs_labels():
    with pytest.raises(ValueError, match="partitioned; use the partition planner"):
        epoch_order(ShufflePolicy.local(), 10, 0, 0, None)
    with pytest.raises(ValueError, match="needs labels"):
        epoch_order(ShufflePolicy("stratified"), 10, 0, 0, None)


def test_as_shuffle_policy_accepts_the_documented_forms():
    assert as_shuffle_policy(True) == ShufflePolicy("global")
    assert as_shuffle_policy(False) == ShufflePolicy("none")
    assert as_shuffle_policy("block") == ShufflePolicy("block")
    policy = ShufflePolicy.partial(0.5)
    assert as_shuffle_policy(policy) is policy
    with pytest.raises(ValueError, match=r"needs a fraction: ShufflePolicy.partial"):
        as_shuffle_policy("partial")
    with pytest.raises(ValueError, match=r"^shuffle='random' is not one of"):
        as_shuffle_policy("random")
    for bad in (1, None, 0.5):
        with pytest.raises(TypeError, match=r"^shuffle=.* must be True, False"):
            as_shuffle_policy(bad)


@pytest.mark.parametrize(
    "kwargs,error,name",
    [
        ({"kind": "random"}, ValueError, "shuffle"),
        ({"kind": 3}, TypeError, "shuffle"),
        ({"kind": "global", "q": 0.5}, ValueError, "q"),
        ({"kind": "partial", "q": 1.5}, ValueError, "q"),
        ({"kind": "block", "block_size": 0}, ValueError, "block_size"),
        ({"kind": "block", "block_size": 2.0}, TypeError, "block_size"),
        ({"kind": "local", "partition": "random"}, ValueError, "partition"),
        ({"kind": "local", "partition": None}, TypeError, "partition"),
        ({"kind": "local", "pre_shuffle": 1}, TypeError, "pre_shuffle"),
    ],
)
def test_bad_fields_are_refused_by_name_and_class(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name}="):
        ShufflePolicy(**kwargs)


@pytest.mark.parametrize(
    "policy,shown",
    [
        (ShufflePolicy(), "ShufflePolicy('global')"),
        (ShufflePolicy.block(8), "ShufflePolicy('block', block_size=8)"),
        (
            ShufflePolicy.partial(0.25, "strided", pre_shuffle=True),
            "ShufflePolicy('partial', q=0.25, partition='strided', pre_shuffle=True)",
        ),
    ],
)
def test_repr_shows_the_configuration_and_rebuilds_an_equal_policy(policy, shown):
    assert repr(policy) == shown
    assert eval(shown, {"ShufflePolicy": ShufflePolicy}) == policy


def test_the_digest_tuple_is_unchanged():
    assert ShufflePolicy.partial(0.25, "strided").to_tuple() == (
        "partial",
        0.25,
        64,
        "strided",
        False,
    )
