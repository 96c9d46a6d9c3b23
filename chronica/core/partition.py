"""Owners and their partitions: which ranks share a node, and which samples a node holds.

An *owner* is a node when ``groups`` (rank -> node id) are given, otherwise a single rank.
Partitioned policies (``local``, ``partial``) keep every sample on one owner's partition, and
a rank only ever trains on samples of its owner's partition.

Every owner's partition holds exactly what its ranks train on per epoch: ``ranks × m``
samples, ``m`` being torch's per-rank count. Partitions built here (``contiguous`` or
``strided``) have those sizes by construction, after torch's padding (repeating from the
start) or dropping (the tail). Explicit partitions (what is on each node's disk) are fitted:
the tail of an oversized partition (its *surplus*) is moved, in owner order, to partitions
that are short, once and for the whole run; with ``drop_last=True`` surplus that no owner
needs is left out, and with ``drop_last=False`` an owner still short repeats its own samples
from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.rng import Stream, derive_key, permutation
from chronica.core.shuffle import ShufflePolicy, epoch_order

__all__ = ["Owners", "base_partitions", "epoch_partitions", "fitted_order"]


@dataclass(frozen=True)
class Owners:
    """Owner ``i`` holds ranks ``ranks[i]`` (ascending); ``rank_owner[r]`` is rank r's owner.
    Built by ``Owners.of``.

    Args:
        rank_owner: ``int64``, every rank's owner.
        ranks: every owner's ranks, ascending.

    Example::

        >>> owners = Owners.of(["a", "a", "b", "b"], 4)
        >>> owners.count, owners.rank_owner.tolist(), owners.sizes().tolist()
        (2, [0, 0, 1, 1], [2, 2])
    """

    rank_owner: np.ndarray
    ranks: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, groups: Sequence[Any] | None, num_replicas: int) -> Owners:
        """Owners from ``groups`` (a node id per rank), or one owner per rank. Nodes are
        numbered by their first rank, so owner order follows rank order.

        Args:
            groups: a node id per rank (any values, compared as strings), or ``None``.
            num_replicas: the world's ranks.
        """
        if groups is None:
            ids = np.arange(num_replicas)
        else:
            if len(groups) != num_replicas:
                raise ValueError(
                    f"groups has {len(groups)} entries but there are {num_replicas} ranks; "
                    f"give the node id of every rank, e.g. [0, 0, 1, 1]"
                )
            _, ids = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
            # Number nodes by their first rank so owner order follows rank order.
            first: dict[int, int] = {}
            for node in ids:
                first.setdefault(int(node), len(first))
            ids = np.array([first[int(node)] for node in ids])
        # One stable sort groups the ranks of every owner: linear in the world's size, so a
        # huge num_replicas is refused by later checks instead of hanging here.
        ids = np.asarray(ids, dtype=np.int64)
        by_owner = np.argsort(ids, kind="stable")
        ends = np.cumsum(np.bincount(ids))
        ranks = tuple(np.split(by_owner, ends[:-1]))
        return cls(rank_owner=ids.astype(np.int64), ranks=ranks)

    @property
    def count(self) -> int:
        """The number of owners."""
        return len(self.ranks)

    def sizes(self) -> np.ndarray:
        """Ranks per owner."""
        return np.array([r.shape[0] for r in self.ranks], dtype=np.int64)


def _fitted(order: np.ndarray, total: int) -> tuple[np.ndarray, int, int]:
    """torch's padding (repeat from the start) or dropping (the tail) to ``total``."""
    n = order.shape[0]
    if total <= n:
        return order[:total], 0, n - total
    return np.concatenate([order, np.resize(order, total - n)]), total - n, 0


def fitted_order(
    policy: ShufflePolicy,
    n: int,
    seed: int,
    epoch: int,
    labels: np.ndarray | None,
    total: int,
) -> tuple[np.ndarray, int, int]:
    """``epoch_order`` fitted to ``total`` like ``_fitted``: ``(order, padded, dropped)``,
    the same values. A permutation of every sample (``policy.permutes_all``) is drawn into
    its padded buffer, in the narrowest integer type that numbers every sample (int32 below
    2**31), so a large epoch holds one compact copy of its order.

    Args:
        policy: a non-partitioned shuffle policy.
        n: the number of samples.
        seed: the run's seed.
        epoch: the epoch.
        labels: one class label per sample (``stratified``), or ``None``.
        total: the samples the epoch trains on (torch pads from the start or drops the tail).

    Example::

        >>> from chronica.core.shuffle import ShufflePolicy
        >>> order, padded, dropped = fitted_order(ShufflePolicy("none"), 3, 0, 0, None, 5)
        >>> order.tolist(), padded, dropped
        ([0, 1, 2, 0, 1], 2, 0)
    """
    if not policy.permutes_all:
        return _fitted(epoch_order(policy, n, seed, epoch, labels), total)
    buffer = np.empty(max(n, total), dtype=np.int32 if max(n, total) < 2**31 else np.int64)
    order = permutation(n, derive_key(seed, epoch, Stream.ORDER), out=buffer[:n])
    if total <= n:
        return order[:total], 0, n - total
    for start in range(n, total, max(n, 1)):  # repeat from the start, as np.resize does
        piece = min(n, total - start)
        buffer[start : start + piece] = order[:piece]
    return buffer, total - n, 0


def base_partitions(
    policy: ShufflePolicy,
    n: int,
    owners: Owners,
    per_rank: int,
    seed: int,
    explicit: Sequence[Any] | None = None,
) -> tuple[list[np.ndarray], int, int]:
    """Every owner's fixed partition, sized ``ranks × per_rank``; returns
    ``(partitions, num_padded, num_dropped)``.

    Args:
        policy: a partitioned policy (its ``partition`` and ``pre_shuffle``).
        n: the number of samples.
        owners: the owners and their ranks.
        per_rank: samples every rank trains on per epoch.
        seed: the run's seed (for ``pre_shuffle``).
        explicit: one index list per owner (what is on each node's disk), fitted to the
            sizes, or ``None`` to cut partitions here.

    Example::

        >>> from chronica.core.shuffle import ShufflePolicy
        >>> parts, padded, dropped = base_partitions(
        ...     ShufflePolicy.local(), 5, Owners.of(None, 2), 3, seed=0)
        >>> [p.tolist() for p in parts], padded, dropped
        ([[0, 1, 2], [3, 4, 0]], 1, 0)
    """
    targets = owners.sizes() * per_rank
    if explicit is not None:
        return _fit_explicit(explicit, n, targets)
    if policy.pre_shuffle:
        order = permutation(n, derive_key(seed, 0, Stream.PARTITION))
    else:
        order = np.arange(n, dtype=np.int64)
    order, padded, dropped = _fitted(order, int(targets.sum()))
    if policy.partition == "contiguous":
        cuts = np.cumsum(targets)[:-1]
        return list(np.split(order, cuts)), padded, dropped
    # Strided: position j goes to rank j % W, as torch deals; a node collects its ranks'.
    holder = owners.rank_owner[np.arange(order.shape[0]) % owners.rank_owner.shape[0]]
    return [order[holder == i] for i in range(owners.count)], padded, dropped


def _fit_explicit(
    explicit: Sequence[Any], n: int, targets: np.ndarray
) -> tuple[list[np.ndarray], int, int]:
    if len(explicit) != targets.shape[0]:
        raise ValueError(
            f"partitions has {len(explicit)} entries but there are {targets.shape[0]} nodes; "
            f"give one index list per node, in node order"
        )
    parts = [np.asarray(p, dtype=np.int64).ravel() for p in explicit]
    every = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if every.shape[0] != n or not np.array_equal(np.sort(every), np.arange(n)):
        raise ValueError(
            "partitions must hold every sample index 0..N-1 exactly once across nodes "
            f"(got {every.shape[0]} entries for N={n}, duplicated or missing indices)"
        )
    surplus = np.concatenate(
        [p[t:] for p, t in zip(parts, targets, strict=True)] or [np.empty(0, np.int64)]
    )
    fitted, used, padded = [], 0, 0
    for p, t in zip(parts, targets, strict=True):
        mine = p[:t]
        take = min(int(t) - mine.shape[0], surplus.shape[0] - used)
        mine = np.concatenate([mine, surplus[used : used + take]])
        used += take
        short = int(t) - mine.shape[0]
        if short:
            source = mine if mine.shape[0] else every
            mine = np.concatenate([mine, np.resize(source, short)])
            padded += short
        fitted.append(mine)
    return fitted, padded, surplus.shape[0] - used


def epoch_partitions(
    policy: ShufflePolicy, base: list[np.ndarray], seed: int, epoch: int
) -> list[np.ndarray]:
    """Every owner's samples for ``epoch``, in training order: for ``partial``, a seeded
    fraction ``q`` of every partition is pooled and dealt back at random first; then every
    partition is permuted. Sizes never change, so no owner gains or loses samples.

    Args:
        policy: a partitioned policy (``exchanges`` and ``q``).
        base: every owner's fixed partition (``base_partitions``).
        seed: the run's seed.
        epoch: the epoch.

    Example::

        >>> from chronica.core.shuffle import ShufflePolicy
        >>> parts = epoch_partitions(ShufflePolicy.local(), [np.arange(3), np.arange(3, 6)], 0, 1)
        >>> [sorted(p.tolist()) for p in parts]
        [[0, 1, 2], [3, 4, 5]]
    """
    parts = [p.copy() for p in base]
    if policy.exchanges:
        picks = []
        for i, p in enumerate(parts):
            count = round(policy.q * p.shape[0])
            chosen = permutation(p.shape[0], derive_key(seed, epoch, Stream.EXCHANGE, i))
            picks.append(np.sort(chosen[:count]))
        pool = np.concatenate([p[s] for p, s in zip(parts, picks, strict=True)])
        pool = pool[permutation(pool.shape[0], derive_key(seed, epoch, Stream.DEAL))]
        start = 0
        for p, s in zip(parts, picks, strict=True):
            p[s] = pool[start : start + s.shape[0]]
            start += s.shape[0]
    return [
        p[permutation(p.shape[0], derive_key(seed, epoch, Stream.ORDER, i))]
        for i, p in enumerate(parts)
    ]
