"""chronica.runtime.agreement: the ranks' vote on a window, over a plain ``total`` and over a
key-value store (ranks are threads of this process; every wait is on a condition)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from kv_store import LocalStore
from thread_total import ThreadTotal
from workers import scaled

from chronica.core import ScheduleConfig, Scheduler
from chronica.core.multiset import HASH_WORDS, KEY_WORDS, MODULUS
from chronica.runtime.agreement import (
    NO_PLAN,
    TOKEN_WORDS,
    VOTE_WORDS,
    Agreement,
    KeyValueAgreement,
    agreement_timeout,
    key_prefix,
    key_value_agreement,
)

ZERO = np.zeros(HASH_WORDS, np.int64)


def _alone():
    """One rank: the sum over ranks is the rank's own vector."""
    return Agreement(np.asarray, 0, 1)


def test_one_rank_uses_a_plan_only_for_a_token_and_a_zero_imbalance():
    agree = _alone()
    token = (7, 1, 2, 3)
    assert agree(token, lambda key: ZERO) is True
    assert agree(NO_PLAN, lambda key: ZERO) is False
    off = ZERO.copy()
    off[0] = 1
    assert agree(token, lambda key: off) is False


def test_the_vote_is_one_all_reduce_of_the_imbalances_and_the_token_chunks():
    seen = []

    def total(vector):
        seen.append(np.array(vector))
        return vector

    agree = Agreement(total, 0, 1)
    agree((1, 2, 3, 4), lambda key: ZERO)
    key, vote = seen
    assert key.shape == (KEY_WORDS,) and key.dtype == np.int64
    assert vote.shape == (VOTE_WORDS,) and VOTE_WORDS == HASH_WORDS + 8 * TOKEN_WORDS


def test_rank_0_draws_the_key_and_the_others_add_zeros():
    keys = []
    for rank in (0, 1):
        agree = Agreement(lambda v, rank=rank: keys.append((rank, v.copy())) or v, rank, 2)
        agree.key()
    (_, drawn), (_, zeros) = keys
    assert drawn.any() and not zeros.any()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((np.asarray, 0, 0), ValueError, r"world=0 must be an int in \[1, "),
        ((np.asarray, 2, 2), ValueError, r"rank=2 must be an int in \[0, 1\]"),
        (("sum", 0, 1), TypeError, "total='sum' must be a function"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, error, match):
    with pytest.raises(error, match=match):
        Agreement(*args)


def _agree_in_threads(agreements, rounds):
    """Every rank votes ``rounds`` (per round, every rank's token and imbalance words);
    returns each rank's answers and the keys its imbalance was asked for."""
    results = [[] for _ in agreements]
    keys = [[] for _ in agreements]
    errors = []

    def run(i):
        try:
            for tokens, words in rounds:

                def imbalance(key, i=i, words=words):
                    keys[i].append(key.tolist())
                    return np.array(words[i], np.int64)

                results[i].append(agreements[i](tokens[i], imbalance))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(agreements))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(60))
    assert not errors and not any(t.is_alive() for t in threads), errors
    return results, keys


def test_key_value_agreement_gives_every_rank_the_same_answer():
    """A window is used only if every token is the same one, not NO_PLAN, and the
    imbalances sum to 0 modulo the prime; every rank gets the same answer, and the same
    fresh key, drawn by rank 0, in every vote."""
    store = LocalStore()
    world = 3
    agreements = [
        KeyValueAgreement(
            store.put, store.get, r, world, prefix="job", timeout_ms=30_000, delete=store.delete
        )
        for r in range(world)
    ]
    a, b, c = (7, 1, 2, 3), (7, 1, 2, 4), (1 << 61, 5, 0, (1 << 62) - 1)
    # Tokens with a's sum but not a's chunks: the squares tell them apart.
    low, high = (5, 1, 2, 3), (9, 1, 2, 3)
    zero = [[0] * HASH_WORDS] * world
    split = [[MODULUS - 1] * HASH_WORDS, [1] * HASH_WORDS, [0] * HASH_WORDS]
    off = [[1] + [0] * (HASH_WORDS - 1), [0] * HASH_WORDS, [0] * HASH_WORDS]
    rounds = [
        ((a, a, a), zero),
        ((a, NO_PLAN, a), zero),
        ((a, b, a), zero),
        ((NO_PLAN,) * 3, zero),
        ((c, c, c), split),
        ((a, a, a), off),
        ((low, a, high), zero),
    ]
    results, keys = _agree_in_threads(agreements, rounds)
    expected = [True, False, False, False, True, False, False]
    assert results == [expected] * world
    assert keys[0] == keys[1] == keys[2]
    assert len({tuple(k) for k in keys[0]}) == len(rounds)  # a fresh key for every vote
    # Each rank dropped its key of a round once every rank had read it (two per vote).
    assert sorted(store.values) == [f"job/{2 * len(rounds) - 1}/{r}" for r in range(world)]


def test_without_delete_the_store_keeps_every_round():
    store = LocalStore()
    agreements = [
        KeyValueAgreement(store.put, store.get, r, 2, prefix="p", timeout_ms=30_000)
        for r in range(2)
    ]
    _agree_in_threads(agreements, [(((1, 2, 3, 4),) * 2, [[0] * HASH_WORDS] * 2)])
    assert sorted(store.values) == ["p/0/0", "p/0/1", "p/1/0", "p/1/1"]


def test_a_rank_that_never_answers_is_named_in_a_time_out():
    store = LocalStore()
    alone = KeyValueAgreement(store.put, store.get, 0, 2, prefix="job", timeout_ms=50)
    with pytest.raises(TimeoutError, match="rank 1 did not take part in agreement round 0"):
        alone((5, 0, 0, 0), lambda key: ZERO)


def test_key_value_agreement_refuses_a_bad_time_out():
    store = LocalStore()
    with pytest.raises(ValueError, match="timeout_ms=0 must be an int >= 1"):
        KeyValueAgreement(store.put, store.get, 0, 1, prefix="p", timeout_ms=0)


def test_key_prefixes_number_the_streams_of_one_configuration():
    digest = "ab" * 16
    first, second = key_prefix(digest), key_prefix(digest)
    assert first.startswith(f"chronica/agree/{digest[:16]}/")
    assert int(second.rsplit("/", 1)[1]) == int(first.rsplit("/", 1)[1]) + 1
    assert key_prefix("cd" * 16).endswith("/0")


def test_the_agreement_waits_longer_than_a_plan():
    assert agreement_timeout(1.0) == 60.0
    assert agreement_timeout(30.0) == 180.0


def test_key_value_agreement_factory_keys_by_digest_and_needs_a_store():
    store = LocalStore()
    scheduler = Scheduler(np.arange(1, 50), ScheduleConfig(num_replicas=2, batch_size=8))
    assert key_value_agreement(0, 1.0, lambda world: None)(scheduler) is None
    asked = []
    built = key_value_agreement(1, 1.0, lambda world: asked.append(world) or store.calls())(
        scheduler
    )
    assert asked == [2]
    assert isinstance(built, KeyValueAgreement)
    assert built.prefix.startswith(f"chronica/agree/{scheduler.digest[:16]}/")
    assert (built.rank, built.world, built.timeout_ms) == (1, 2, 60_000)


def test_a_rank_holding_a_plan_learns_how_many_ranks_had_none():
    world, token = 3, (5, 6, 7, 8)
    total = ThreadTotal(world)
    votes = {0: token, 1: token, 2: NO_PLAN}
    seen: dict[int, int | None] = {}

    def vote(rank: int) -> None:
        agree = total.agreement(rank)
        agree(votes[rank], lambda key: np.zeros(HASH_WORDS, np.int64))
        seen[rank] = agree.without_plan

    threads = [threading.Thread(target=vote, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {0: 1, 1: 1, 2: None}
