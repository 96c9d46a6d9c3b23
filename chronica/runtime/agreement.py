"""All ranks agree on one source for each dynamic window.

A dynamic window is served either by the coordinator's plan or by the static plan; both
hold the same samples at every step, so exactly-once holds only if *every* rank takes the
same source and, for the coordinator's, parts of one and the same window. Before each
window every rank passes a token to an ``Agreement``: a function that returns ``True`` only
if every rank passed the same token other than ``NO_PLAN``, and returns the same answer on
every rank. A token is ``TOKEN_WORDS`` integers in ``[0, 2**62)``: the digest of the whole
window the rank checked (``chronica.runtime.window``), or ``NO_PLAN`` to fall back.

Adapters build one from their framework's own machinery: the torch adapter with one gloo
all-reduce, the JAX and TensorFlow adapters with the key-value store of their coordination
service (``KeyValueAgreement``), which needs no device and runs from any thread.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from chronica.core.checks import check_int
from chronica.core.scheduler import Scheduler

__all__ = [
    "NO_PLAN",
    "TOKEN_WORDS",
    "Agreement",
    "KeyValueAgreement",
    "KeyValueStore",
    "Token",
    "agreement_timeout",
    "key_prefix",
    "key_value_agreement",
    "unanimous",
]

# 4 words of 62 bits: two different windows share a token only by a 248-bit collision, which
# no coordinator can search for; each word and its negation fit an int64 all-reduce.
TOKEN_WORDS = 4
Token = tuple[int, ...]
NO_PLAN: Token = (0,) * TOKEN_WORDS
Agreement = Callable[[Token], bool]


_PREFIXES: Counter[str] = Counter()
_PREFIXES_LOCK = threading.Lock()


def key_prefix(digest: str) -> str:
    """A key-value prefix for the next agreement of a stream with configuration ``digest``:
    the same on every rank, as long as every rank builds its streams in the same order (the
    ``n``-th stream of a configuration in each process gets the same prefix)."""
    with _PREFIXES_LOCK:
        n = _PREFIXES[digest]
        _PREFIXES[digest] += 1
    return f"chronica/agree/{digest[:16]}/{n}"


def agreement_timeout(timeout: float) -> float:
    """How long, in seconds, a rank waits for the others' tokens given the plan time-out
    ``timeout``: ranks reach a window within a step or two of each other (each step ends in
    a gradient all-reduce), so this only fires when a rank stopped."""
    return max(60.0, 6.0 * timeout)


def unanimous(tokens: Sequence[Token]) -> bool:
    """Whether every token is the same one, other than ``NO_PLAN`` (the agreement rule)."""
    return len(tokens) > 0 and all(t == tokens[0] for t in tokens) and tokens[0] != NO_PLAN


class KeyValueAgreement:
    """An ``Agreement`` over a key-value store shared by the ranks (a coordination service).

    Round ``n``: rank ``r`` writes its token under ``{prefix}/{n}/{r}``, then reads every
    rank's key of round ``n``, waiting up to ``timeout_ms`` for each. All ranks read the
    same ``world`` tokens, so all return the same ``unanimous(tokens)``. ``put(key, value)``
    and ``get(key, timeout_ms) -> str`` are the store's calls; ``get`` blocks until the key
    exists and raises when the time is up, which ``__call__`` re-raises as ``TimeoutError``
    naming the rank that did not answer (a rank that stopped; the job cannot go on).
    ``delete(key)``, when given, drops this rank's key of the round before the last, so
    the store holds at most two rounds of keys per rank.
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
        self.world = check_int("world", world, 1)
        self.rank = check_int("rank", rank, 0, self.world - 1)
        self.timeout_ms = check_int("timeout_ms", timeout_ms, 1)
        self.prefix = prefix
        self._put, self._get, self._delete = put, get, delete
        self._rounds = itertools.count()

    def __call__(self, token: Token) -> bool:
        round_ = next(self._rounds)
        self._put(f"{self.prefix}/{round_}/{self.rank}", " ".join(str(int(w)) for w in token))
        tokens = []
        for peer in range(self.world):
            key = f"{self.prefix}/{round_}/{peer}"
            try:
                tokens.append(tuple(int(w) for w in self._get(key, self.timeout_ms).split()))
            except Exception as error:
                raise TimeoutError(
                    f"chronica: rank {peer} did not take part in agreement round {round_} "
                    f"within {self.timeout_ms} ms ({type(error).__name__}: {error}); a rank "
                    "stopped or iterates another epoch"
                ) from error
        if self._delete is not None and round_ >= 1:
            self._delete(f"{self.prefix}/{round_ - 1}/{self.rank}")
        return unanimous(tokens)


KeyValueStore = tuple[Callable[[str, str], None], Callable[[str, int], str], Callable[[str], None]]


def key_value_agreement(
    rank: int, timeout: float, store: Callable[[int], KeyValueStore | None]
) -> Callable[[Scheduler], Agreement | None]:
    """What an adapter hands ``open_stream`` as ``agree``: for a stream's scheduler, a
    ``KeyValueAgreement`` of rank ``rank`` over ``store(world)`` (the framework's
    ``(put, get, delete)`` when it runs one process per rank of ``world``, else ``None``:
    no agreement, and the runtime warns), keyed by the stream's configuration digest
    (``key_prefix``) and waiting ``agreement_timeout(timeout)`` for the other ranks."""

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
