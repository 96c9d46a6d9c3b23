"""The peers of the packing benchmark (``benchmarks/packing_peers.py``) on tiny cases.

Each peer places every document exactly once, gives every rank the same number of
micro-batches, and keeps the token cap where its algorithm guarantees it; verl's second
Karmarkar–Karp split, which balances cost and ignores tokens, breaks the cap on a hand-made
case, which the benchmark counts.
"""

import numpy as np
import pytest

from benchmarks import packing_peers as peers
from chronica.core import CostModel

W = 3
MAX_TOKENS = 16
LENGTHS = np.array([9, 3, 7, 1, 16, 4, 4, 12, 2, 8, 5, 6, 11, 1, 3, 10, 2, 7], dtype=np.int64)


def _plan(key: str, lengths: np.ndarray) -> peers.MicroBatches:
    costs = CostModel.attention(4)(lengths)
    if key == "verl":
        return peers.verl(lengths, costs, W, MAX_TOKENS)
    if key == "ffd":
        return peers.ffd(lengths, W, MAX_TOKENS)
    if key == "grain":
        return peers.grain(lengths, W, MAX_TOKENS, MAX_TOKENS, open_rows=2)
    return peers.padding(lengths, W, MAX_TOKENS)


@pytest.mark.parametrize("key", ["verl", "ffd", "grain", "padding"])
def test_every_document_once_and_equal_micro_batch_counts(key):
    mb = _plan(key, LENGTHS)
    n = LENGTHS.shape[0]
    assert mb.rank.shape == mb.micro.shape == (n,)
    assert mb.rank.min() >= 0 and mb.rank.max() < W
    assert mb.micro.min() >= 0 and mb.micro.max() < mb.num_micro
    # Every rank runs num_micro micro-batches; the count is what the busiest rank needs.
    used = [int(mb.micro[mb.rank == r].max()) + 1 for r in range(W) if (mb.rank == r).any()]
    assert max(used) == mb.num_micro
    tokens = mb.tokens(W)
    assert tokens.shape == (W, mb.num_micro)
    assert tokens.sum() == pytest.approx(mb.padded.sum())
    assert np.all(mb.padded >= LENGTHS)


@pytest.mark.parametrize("key", ["ffd", "grain", "padding"])
def test_the_cap_holds_where_the_peer_guarantees_it(key):
    rng = np.random.default_rng(7)
    for _ in range(20):
        lengths = rng.integers(1, MAX_TOKENS + 1, size=W * rng.integers(1, 12))
        mb = _plan(key, lengths)
        assert mb.tokens(W).max() <= MAX_TOKENS
        if key == "grain":  # and no row of 8 tokens holds more than 8
            short = np.minimum(lengths, 8)
            rows, count = peers._grain_rows(short, 8, 3)
            assert np.bincount(rows, weights=short, minlength=count).max() <= 8
            assert peers.grain(short, W, MAX_TOKENS, 8, open_rows=3).tokens(W).max() <= 16


def test_ffd_bins_are_first_fit_decreasing_and_dealt_round_robin():
    lengths = np.array([3, 9, 5, 7, 2], dtype=np.int64)
    mb = peers.ffd(lengths, 2, 10)
    # 9 -> bin 0, 7 -> bin 1, 5 -> bin 2, 3 -> bin 1, 2 -> bin 2; bin b to rank b % 2.
    assert mb.rank.tolist() == [1, 0, 0, 1, 0]
    assert mb.micro.tolist() == [0, 0, 1, 0, 1]
    assert mb.num_micro == 2


def test_grain_packs_in_stream_order_and_emits_its_open_rows_when_full():
    lengths = np.array([6, 6, 6, 3, 5, 1], dtype=np.int64)
    rows, count = peers._grain_rows(lengths, 10, 2)
    # 6, 6 open two rows; the third 6 fits in neither: both rows go, a new set starts.
    assert rows.tolist() == [0, 1, 2, 2, 3, 2]
    assert count == 4
    mb = peers.grain(lengths, 1, 20, 10, open_rows=2)  # 2 rows per micro-batch
    assert mb.micro.tolist() == [0, 0, 1, 1, 1, 1]


def test_padding_pads_to_the_longest_and_splits_like_distributed_sampler():
    lengths = np.array([4, 1, 4, 1, 8, 1, 2, 1], dtype=np.int64)
    mb = peers.padding(lengths, 2, 8)
    assert mb.rank.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    # Rank 0 sees 4, 4, 8, 2: [4, 4] (2 x 4 = 8), [8], [2].
    assert mb.micro[mb.rank == 0].tolist() == [0, 0, 1, 2]
    assert mb.padded[mb.rank == 0].tolist() == [4, 4, 8, 2]
    assert mb.num_micro == 3
    counts = np.bincount(mb.rank * mb.num_micro + mb.micro, minlength=6).reshape(2, 3)
    longest = np.zeros((2, 3))
    np.maximum.at(longest, (mb.rank, mb.micro), mb.padded)
    assert np.all(counts * longest <= 8)


def test_karmarkar_karp_is_largest_differencing():
    parts = peers.karmarkar_karp([4, 5, 6, 7, 8], 2, equal_size=False)
    sums = sorted(sum([4, 5, 6, 7, 8][i] for i in p) for p in parts)
    assert sums == [14, 16]  # the differencing method's answer; 15/15 exists
    equal = peers.karmarkar_karp(list(range(12)), 3, equal_size=True)
    assert sorted(len(p) for p in equal) == [4, 4, 4]
    assert sorted(i for p in equal for i in p) == list(range(12))


def test_verl_breaks_the_token_cap_on_a_hand_made_case():
    # One rank, cap 10, lengths 8, 4, 4, 4 (20 tokens: 2 micro-batches) and a quadratic
    # cost 64, 16, 16, 16: the cost split {64} | {16, 16, 16} puts 12 tokens in one.
    lengths = np.array([8, 4, 4, 4], dtype=np.int64)
    costs = CostModel.quadratic()(lengths)
    mb = peers.verl(lengths, costs, 1, 10)
    assert mb.num_micro == 2
    assert sorted(mb.tokens(1)[0].tolist()) == [8, 12]
    # First-fit decreasing keeps the cap with one more micro-batch.
    assert peers.ffd(lengths, 1, 10).tokens(1).max() <= 10
