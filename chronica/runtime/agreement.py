"""All ranks agree on one source for each dynamic window.

A dynamic window is served either by the coordinator's plan or by the static plan; both
hold the same samples at every step, so exactly-once holds only if *every* rank takes the
same source and, for the coordinator's, the ranks' parts together are exactly the static
window, step by step. Before each window every rank calls its ``Agreement`` once with

* a token, ``TOKEN_WORDS`` integers in ``[0, 2**62)``: the digest of what must be the same
  on every rank (``chronica.runtime.window.token``), or ``NO_PLAN`` to fall back;
* ``imbalance(key)``: its part's multiset hash minus its static part's, ``HASH_WORDS``
  words in ``[0, MODULUS)`` (``chronica.runtime.window.imbalance``), under a key that rank
  0 draws (``os.urandom``) only now, after the plans were made, and shares over the
  framework's own channel, never over ZeroMQ.

It returns ``True`` only if every rank passed the same token other than ``NO_PLAN`` and
the imbalances sum to 0 modulo ``MODULUS`` (the union of the parts is the static window's
multiset, see ``chronica.core.multiset`` for the collision bound), and the same answer on
every rank. Both rounds are one all-reduce ``SUM`` of a few int64 (``total``): the key is
rank 0's words plus zeros; the vote sums the imbalances and, for the tokens, each 16-bit
chunk and its square: a rank's chunks ``c`` are everyone's exactly when the sums are
``world * c`` and ``world * c**2`` (the chunks' variance is then 0), which, holding on one
rank, holds on all. At ``MAX_REPLICAS`` ranks every sum stays below ``2**48``.

Adapters give ``total`` from their framework's own machinery: the torch adapter one gloo
all-reduce, the JAX and TensorFlow adapters the key-value store of their coordination
service (``KeyValueAgreement``), which needs no device and runs from any thread.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from chronica.core.checks import check_int
from chronica.core.config import MAX_REPLICAS
from chronica.core.multiset import HASH_WORDS, KEY_WORDS, MODULUS
from chronica.core.scheduler import Scheduler

__all__ = [
    "NO_PLAN",
    "TOKEN_WORDS",
    "VOTE_WORDS",
    "Agreement",
    "KeyValueAgreement",
    "KeyValueStore",
    "Token",
    "agreement_timeout",
    "key_prefix",
    "key_value_agreement",
]

# 4 words of 62 bits: two different tokens are equal only by a 248-bit collision, which no
# coordinator can search for.
TOKEN_WORDS = 4
Token = tuple[int, ...]
NO_PLAN: Token = (0,) * TOKEN_WORDS
Total = Callable[[np.ndarray], np.ndarray]

_CHUNK_BITS = 16
_CHUNKS = TOKEN_WORDS * 4  # a 62-bit word in four 16-bit chunks
# The vote's all-reduce: the imbalance words, then every token chunk and its square.
VOTE_WORDS = HASH_WORDS + 2 * _CHUNKS


def _chunks(token: Token) -> np.ndarray:
    words = np.array(token, np.int64)
    shifts = np.arange(4, dtype=np.int64) * _CHUNK_BITS
    return ((words[:, None] >> shifts) & ((1 << _CHUNK_BITS) - 1)).ravel()


class Agreement:
    """The ranks' vote on a window (module docstring) over an all-reduce ``total``.

    Guarantees: ``agreement(token, imbalance)`` returns the same answer on every rank, and
    ``True`` only if every rank passed the same ``token`` (not ``NO_PLAN``) and the ranks'
    ``imbalance(key)`` sum to 0 modulo ``MODULUS``. Every rank calls it in the same order;
    each call runs ``total`` twice (the key, then the vote).

    Args:
        total: an all-reduce ``SUM`` of an int64 vector over the ``world`` ranks (the same
            result on every rank), e.g. one gloo ``all_reduce``.
        rank: this rank, in ``[0, world)``.
        world: the number of ranks voting, in ``[1, MAX_REPLICAS]``.

    Example::

        >>> agree = Agreement(np.asarray, rank=0, world=1)  # one rank: the sum is its own
        >>> agree((7, 1, 2, 3), lambda key: np.zeros(HASH_WORDS, np.int64))
        True
    """

    def __init__(self, total: Total, rank: int, world: int) -> None:
        self.world = check_int("world", world, 1, MAX_REPLICAS)
        self.rank = check_int("rank", rank, 0, self.world - 1)
        if not callable(total):
            raise TypeError(
                f"total={total!r} must be a function (int64 vector -> its sum over ranks), "
                "e.g. an all-reduce SUM of the framework's process group"
            )
        self._total = total
        # After a vote this rank passed a plan's token in: how many ranks voted for the
        # static plan (``NO_PLAN``), when the sums say so unambiguously; else ``None``.
        self.without_plan: int | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world={self.world})"

    def key(self) -> np.ndarray:
        """A fresh key (``KEY_WORDS`` int64) drawn by rank 0, the same on every rank."""
        mine = np.zeros(KEY_WORDS, np.int64)
        if self.rank == 0:
            mine = np.frombuffer(os.urandom(8 * KEY_WORDS), np.int64).copy()
        return np.asarray(self._total(mine), np.int64)

    def __call__(self, token: Token, imbalance: Callable[[np.ndarray], np.ndarray]) -> bool:
        """Whether every rank passed the same ``token`` (not ``NO_PLAN``) and the ranks'
        ``imbalance(key)`` sum to 0 modulo ``MODULUS``; the same answer on every rank.

        Args:
            token: ``TOKEN_WORDS`` ints in ``[0, 2**62)`` (``chronica.runtime.window.token``),
                or ``NO_PLAN`` to vote for the static plan.
            imbalance: called once with the vote's fresh key; returns ``HASH_WORDS`` int64
                in ``[0, MODULUS)`` (``chronica.runtime.window.imbalance``).
        """
        words = np.asarray(imbalance(self.key()), np.int64)
        assert words.shape == (HASH_WORDS,) and ((words >= 0) & (words < MODULUS)).all()
        chunks = _chunks(token)
        sums = np.asarray(self._total(np.concatenate([words, chunks, chunks * chunks])), np.int64)
        balanced = not (sums[:HASH_WORDS] % MODULUS).any()
        same = np.array_equal(sums[HASH_WORDS:], self.world * np.concatenate([chunks, chunks**2]))
        copies = None if tuple(token) == NO_PLAN else _copies(sums, chunks)
        self.without_plan = None if copies is None else self.world - copies
        return balanced and same and tuple(token) != NO_PLAN


def _copies(sums: np.ndarray, chunks: np.ndarray) -> int | None:
    """How many ranks passed this rank's token, when the token sums are that many copies of
    it and nothing else (every other rank passed ``NO_PLAN``, all zeros); else ``None``."""
    tokens, squares = sums[HASH_WORDS : HASH_WORDS + _CHUNKS], sums[HASH_WORDS + _CHUNKS :]
    nonzero = np.flatnonzero(chunks)
    if nonzero.size == 0:
        return None
    copies = int(tokens[nonzero[0]] // chunks[nonzero[0]])
    if np.array_equal(tokens, copies * chunks) and np.array_equal(squares, copies * chunks**2):
        return copies
    return None


_PREFIXES: Counter[str] = Counter()
_PREFIXES_LOCK = threading.Lock()


def key_prefix(digest: str) -> str:
    """A key-value prefix for the next agreement of a stream with configuration ``digest``:
    the same on every rank, as long as every rank builds its streams in the same order (the
    ``n``-th stream of a configuration in each process gets the same prefix).

    Args:
        digest: the stream's configuration digest (``Scheduler.digest``).

    Example::

        >>> key_prefix(scheduler.digest)  # the first stream of this configuration
        'chronica/agree/3f2a9c0d1e4b5a67/0'
    """
    with _PREFIXES_LOCK:
        n = _PREFIXES[digest]
        _PREFIXES[digest] += 1
    return f"chronica/agree/{digest[:16]}/{n}"


def agreement_timeout(timeout: float) -> float:
    """How long, in seconds, a rank waits for the others' tokens given the plan time-out
    ``timeout``: ranks reach a window within a step or two of each other (each step ends in
    a gradient all-reduce), so this only fires when a rank stopped.

    Args:
        timeout: the longest wait for a window's plan, in seconds (``DynamicOptions.timeout``).

    Example::

        >>> agreement_timeout(10.0)  # at least a minute
        60.0
    """
    return max(60.0, 6.0 * timeout)


class KeyValueAgreement(Agreement):
    """An ``Agreement`` whose ``total`` goes through a key-value store shared by the ranks
    (a coordination service).

    Round ``n``: rank ``r`` writes its vector under ``{prefix}/{n}/{r}``, then reads every
    rank's key of round ``n``, waiting up to ``timeout_ms`` for each, and sums them: all
    ranks read the same ``world`` vectors. A ``get`` that fails is re-raised as
    ``TimeoutError`` naming the rank that did not answer (a rank that stopped; the job
    cannot go on).

    Args:
        put: ``put(key, value)`` writes a string under a key.
        get: ``get(key, timeout_ms) -> str`` blocks until the key exists and raises when
            the time is up.
        rank: this rank, in ``[0, world)``.
        world: the number of ranks voting.
        prefix: the keys' prefix, the same on every rank (``key_prefix``).
        timeout_ms: the longest wait for one rank's key, in milliseconds (``>= 1``).
        delete: ``delete(key)``, when given, drops this rank's key of the round before the
            last, so the store holds at most two rounds of keys per rank.

    Example::

        >>> client = jax._src.distributed.global_state.client  # JAX's coordination service
        >>> agree = KeyValueAgreement(
        ...     client.key_value_set, client.blocking_key_value_get, rank, world,
        ...     prefix=key_prefix(scheduler.digest), timeout_ms=60_000,
        ... )
    """

    def __init__(
        self,
        put: Callable[[str, str], None],
        get: Callable[[str, int], str],
        rank: int,
        world: int,
        *,
        prefix: str,
        timeout_ms: int,
        delete: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(self._sum, rank, world)
        self.timeout_ms = check_int("timeout_ms", timeout_ms, 1)
        for name, call in (("put", put), ("get", get), ("delete", delete)):
            if call is not None and not callable(call):
                raise TypeError(f"{name}={call!r} must be the key-value store's {name} function")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix={prefix!r} must be a str, e.g. key_prefix(scheduler.digest)")
        self.prefix = prefix
        self._put, self._get, self._delete = put, get, delete
        self._rounds = itertools.count()

    def __repr__(self) -> str:
        return (
            f"KeyValueAgreement(rank={self.rank}, world={self.world}, prefix={self.prefix!r}, "
            f"timeout_ms={self.timeout_ms})"
        )

    def _sum(self, vector: np.ndarray) -> np.ndarray:
        round_ = next(self._rounds)
        self._put(f"{self.prefix}/{round_}/{self.rank}", " ".join(str(int(w)) for w in vector))
        total = np.zeros(len(vector), np.int64)
        for peer in range(self.world):
            key = f"{self.prefix}/{round_}/{peer}"
            try:
                total += np.array(self._get(key, self.timeout_ms).split(), np.int64)
            except Exception as error:
                raise TimeoutError(
                    f"chronica: rank {peer} did not take part in agreement round {round_} "
                    f"within {self.timeout_ms} ms ({type(error).__name__}: {error}); a rank "
                    "stopped or iterates another epoch"
                ) from error
        if self._delete is not None and round_ >= 1:
            self._delete(f"{self.prefix}/{round_ - 1}/{self.rank}")
        return total


KeyValueStore = tuple[Callable[[str, str], None], Callable[[str, int], str], Callable[[str], None]]


def key_value_agreement(
    rank: int, timeout: float, store: Callable[[int], KeyValueStore | None]
) -> Callable[[Scheduler], Agreement | None]:
    """What an adapter hands the runtime as ``agree``: for a stream's scheduler, a
    ``KeyValueAgreement`` of rank ``rank`` over ``store(world)``, keyed by the stream's
    configuration digest (``key_prefix``) and waiting ``agreement_timeout(timeout)`` for
    the other ranks; ``None`` (no agreement, and the runtime warns) when ``store`` gives
    none.

    Args:
        rank: this process's rank.
        timeout: the plan time-out in seconds (``DynamicOptions.timeout``).
        store: ``store(world)`` returns the framework's ``(put, get, delete)`` when it runs
            one process per rank of ``world``, else ``None``.

    Example::

        >>> build = key_value_agreement(rank, 10.0, lambda world: (put, get, delete))
        >>> agree = build(scheduler)  # a KeyValueAgreement, or None without a store
    """

    def build(scheduler: Scheduler) -> Agreement | None:
        world = scheduler.config.num_replicas
        calls = store(world)
        if calls is None:
            return None
        put, get, delete = calls
        return KeyValueAgreement(
            put,
            get,
            rank,
            world,
            prefix=key_prefix(scheduler.digest),
            timeout_ms=int(1000 * agreement_timeout(timeout)),
            delete=delete,
        )

    return build
