"""Owners and partitions (``chronica.core.partition``): node numbering, torch's padding and
dropping, contiguous and strided base partitions, explicit partitions fitted to their sizes,
per-epoch exchange and permutation, and the compact fitted order of a global shuffle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.partition import (
    Owners,
    _fitted,
    base_partitions,
    epoch_partitions,
    fitted_order,
)
from chronica.core.shuffle import ShufflePolicy, as_shuffle_policy, epoch_order


def test_owners_number_nodes_by_their_first_rank():
    owners = Owners.of(["b", "a", "b", "c", "a"], 5)
    assert owners.rank_owner.tolist() == [0, 1, 0, 2, 1]
    assert [r.tolist() for r in owners.ranks] == [[0, 2], [1, 4], [3]]
    assert owners.count == 3 and owners.sizes().tolist() == [2, 2, 1]


def test_without_groups_every_rank_is_its_own_owner():
    owners = Owners.of(None, 3)
    assert owners.rank_owner.tolist() == [0, 1, 2]
    assert [r.tolist() for r in owners.ranks] == [[0], [1], [2]]


def test_groups_of_the_wrong_length_are_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"groups has 3 entries but there are 2 ranks.*0, 0, 1"):
        Owners.of([0, 0, 1], 2)


@pytest.mark.parametrize("n,total", [(5, 5), (5, 3), (5, 12), (1, 3)])
def test_fitted_pads_from_the_start_or_drops_the_tail_as_torch(n, total):
    order = np.arange(10, 10 + n)
    fitted, padded, dropped = _fitted(order, total)
    assert fitted.tolist() == np.resize(order, total).tolist()
    assert (padded, dropped) == (max(0, total - n), max(0, n - total))


@pytest.mark.parametrize("n,total", [(10, 10), (10, 7), (10, 13), (3, 11), (1, 4)])
@pytest.mark.parametrize("policy", ["global", "block", "none"])
def test_fitted_order_is_the_padded_epoch_order_in_a_compact_type(n, total, policy):
    shuffle = as_shuffle_policy(policy)
    got, padded, dropped = fitted_order(shuffle, n, 5, 2, None, total)
    expect = _fitted(epoch_order(shuffle, n, 5, 2, None), total)
    assert got.tolist() == expect[0].tolist()
    assert (padded, dropped) == expect[1:]
    assert got.dtype == (np.int32 if shuffle.permutes_all else np.int64)


@given(n=st.integers(1, 60), w=st.integers(1, 6), per_rank=st.integers(1, 15))
def test_contiguous_and_strided_partitions_have_the_owners_sizes(n, w, per_rank):
    owners = Owners.of([r // 2 for r in range(w)], w)
    for partition in ("contiguous", "strided"):
        policy = ShufflePolicy.local(partition)
        parts, padded, dropped = base_partitions(policy, n, owners, per_rank, seed=1)
        assert [p.shape[0] for p in parts] == (owners.sizes() * per_rank).tolist()
        total = w * per_rank
        assert (padded, dropped) == (max(0, total - n), max(0, n - total))
        every = np.concatenate(parts)
        assert sorted(every.tolist()) == sorted(np.resize(np.arange(n), total).tolist())


def test_contiguous_is_blocks_and_strided_deals_like_torch():
    owners = Owners.of(None, 2)
    contiguous, _, _ = base_partitions(ShufflePolicy.local(), 6, owners, 3, seed=0)
    strided, _, _ = base_partitions(ShufflePolicy.local("strided"), 6, owners, 3, seed=0)
    assert [p.tolist() for p in contiguous] == [[0, 1, 2], [3, 4, 5]]
    assert [p.tolist() for p in strided] == [[0, 2, 4], [1, 3, 5]]
    shuffled, _, _ = base_partitions(ShufflePolicy.local(pre_shuffle=True), 6, owners, 3, seed=0)
    assert sorted(np.concatenate(shuffled).tolist()) == list(range(6))
    assert [p.tolist() for p in shuffled] != [[0, 1, 2], [3, 4, 5]]


def test_explicit_partitions_move_surplus_in_owner_order_and_pad_the_short():
    owners = Owners.of(None, 3)
    given_parts = [np.array([0, 1, 2, 3, 4]), np.array([5]), np.array([6, 7])]
    parts, padded, dropped = base_partitions(
        ShufflePolicy.local(), 8, owners, 3, seed=0, explicit=given_parts
    )
    # Owner 0 keeps its first 3, its surplus (3, 4) goes to owner 1; owner 2 repeats its own.
    assert [p.tolist() for p in parts] == [[0, 1, 2], [5, 3, 4], [6, 7, 6]]
    assert (padded, dropped) == (1, 0)
    parts, padded, dropped = base_partitions(
        ShufflePolicy.local(), 8, owners, 2, seed=0, explicit=given_parts
    )
    assert [p.tolist() for p in parts] == [[0, 1], [5, 2], [6, 7]]
    assert (padded, dropped) == (0, 2)


def test_explicit_partitions_must_cover_every_sample_once_one_list_per_node():
    owners = Owners.of(None, 2)
    with pytest.raises(ValueError, match="exactly once"):
        base_partitions(ShufflePolicy.local(), 4, owners, 2, 0, explicit=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="one index list per node"):
        base_partitions(ShufflePolicy.local(), 4, owners, 2, 0, explicit=[[0, 1, 2, 3]])


@given(q=st.sampled_from([0.0, 0.25, 1.0]), epoch=st.integers(0, 4))
def test_epoch_partitions_keep_sizes_and_exchange_only_under_partial(q, epoch):
    base = [np.arange(0, 8), np.arange(8, 20), np.arange(20, 24)]
    policy = ShufflePolicy.partial(q)
    parts = epoch_partitions(policy, base, seed=7, epoch=epoch)
    assert [p.shape[0] for p in parts] == [8, 12, 4]
    assert sorted(np.concatenate(parts).tolist()) == list(range(24))
    local = epoch_partitions(ShufflePolicy.local(), base, seed=7, epoch=epoch)
    for mine, original in zip(local, base, strict=True):
        assert sorted(mine.tolist()) == original.tolist()
    if q == 0.0:
        assert all(np.array_equal(a, b) for a, b in zip(parts, local, strict=True))
    # Pure: the same inputs give the same bytes, the base is left as it was.
    again = epoch_partitions(policy, base, seed=7, epoch=epoch)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(parts, again, strict=True))
    assert base[0].tolist() == list(range(8))
