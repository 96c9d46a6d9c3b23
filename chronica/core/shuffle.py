"""Shuffle policies: which samples form each epoch's order, and where they live.

Non-partitioned policies produce one epoch order over all samples; plain data-parallel
training cuts it into global batches:

``global``      a new permutation of all samples every epoch (torch's semantics);
``block``       the order of contiguous blocks of ``block_size`` samples is shuffled, samples
                inside a block stay in order (sequential reads);
``stratified``  a new permutation every epoch in which every class (given ``labels``) is
                spread evenly, so every window of the order, hence every batch, has close to
                the data set's label frequencies;
``none``        the data set's own order.

Partitioned policies give every *owner* (a node when ``groups`` are given, otherwise a rank)
a partition of the data, sized to what its ranks train on per epoch:

``local``       the partition is fixed; its order is re-permuted every epoch (no movement);
``partial``     every epoch a seeded fraction ``q`` of every partition is pooled and dealt
                back at random (partial-local shuffling), then each partition is permuted.
                The exchange is drawn afresh from the fixed base partitions every epoch, so
                any epoch can be planned without its predecessors; ``q = 0`` is ``local``.

Base partitions are built ``contiguous`` (blocks) or ``strided`` (every W-th sample), from
the data set's order or, with ``pre_shuffle``, from one seed-fixed permutation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_bool, check_int, check_number
from chronica.core.rng import Stream, derive_key, permutation, uniforms

__all__ = ["POLICIES", "ShufflePolicy", "as_shuffle_policy", "epoch_order", "stratified_order"]

_PARTITIONS = ("contiguous", "strided")

# An epoch order of a non-partitioned policy: (policy, n, key, labels) -> int64 order.
_Order = Callable[["ShufflePolicy", int, np.uint64, "np.ndarray | None"], np.ndarray]


@dataclass(frozen=True)
class _Rule:
    """What one kind of policy does; ``ShufflePolicy`` reads its behaviour from here, so no
    module compares kind names."""

    order: _Order | None  # the epoch order; None: partitioned (the partition planner's job)
    shuffles: bool = True  # False: the data set's own order
    takes_q: bool = False  # ``q`` (the exchanged fraction) applies
    needs_labels: bool = False  # the order is drawn from class labels
    permutes_all: bool = False  # the order is one seeded permutation of every sample


def stratified_order(labels: np.ndarray, key: np.uint64) -> np.ndarray:
    """A permutation in which each class is spread evenly: the j-th of a class's ``n_c``
    samples (in random order) sits at fractional position ``(j + u) / n_c``, ``u`` uniform.

    Args:
        labels: one class label per sample (any comparable dtype).
        key: the stream's key (``chronica.core.rng.derive_key``).

    Example::

        >>> order = stratified_order(np.array([0, 0, 1, 1]), np.uint64(7))
        >>> sorted(order.tolist())
        [0, 1, 2, 3]
    """
    n = labels.shape[0]
    within = permutation(n, key)
    if n == 0:
        return within
    classes, inverse = np.unique(labels[within], return_inverse=True)
    counts = np.bincount(inverse, minlength=classes.shape[0])
    rank_in_class = np.empty(n, dtype=np.int64)
    order_by_class = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_in_class[order_by_class] = np.arange(n) - np.repeat(starts, counts)
    jitter = uniforms(n, key)
    position = (rank_in_class + jitter) / counts[inverse]
    return within[np.argsort(position, kind="stable")]


def _global(policy: ShufflePolicy, n: int, key: np.uint64, labels: np.ndarray | None) -> np.ndarray:
    return permutation(n, key)


def _none(policy: ShufflePolicy, n: int, key: np.uint64, labels: np.ndarray | None) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def _block(policy: ShufflePolicy, n: int, key: np.uint64, labels: np.ndarray | None) -> np.ndarray:
    blocks = math.ceil(n / policy.block_size)
    starts = permutation(blocks, key) * policy.block_size
    order = (starts[:, None] + np.arange(policy.block_size)[None, :]).ravel()
    return order[order < n]


def _stratified(
    policy: ShufflePolicy, n: int, key: np.uint64, labels: np.ndarray | None
) -> np.ndarray:
    if labels is None:
        raise ValueError("shuffle='stratified' needs labels= (one class label per sample)")
    return stratified_order(labels, key)


_RULES: dict[str, _Rule] = {
    "global": _Rule(_global, permutes_all=True),
    "local": _Rule(None),
    "partial": _Rule(None, takes_q=True),
    "block": _Rule(_block),
    "stratified": _Rule(_stratified, needs_labels=True),
    "none": _Rule(_none, shuffles=False),
}
POLICIES = tuple(_RULES)


@dataclass(frozen=True, repr=False)
class ShufflePolicy:
    """How the samples of an epoch are ordered and, for ``local``/``partial``, partitioned.

    Validated on construction (``TypeError`` for a wrong type, ``ValueError`` for a wrong
    value, both naming the field); see the module docstring for the meaning of every kind.
    The behaviour of a kind is read from the policy's properties (``partitioned``,
    ``shuffles``, ``exchanges``, ``needs_labels``, ``permutes_all``), never from its name.

    Args:
        kind: one of ``POLICIES``: ``"global"`` (default), ``"local"``, ``"partial"``,
            ``"block"``, ``"stratified"`` or ``"none"``.
        q: for ``partial``, the fraction of every partition exchanged each epoch, in
            ``[0, 1]`` (``0`` is ``local``); ``0`` for every other kind.
        block_size: for ``block``, the samples of one contiguous block, ``>= 1``.
        partition: how base partitions are cut (``local``/``partial``): ``"contiguous"``
            blocks or ``"strided"`` (every W-th sample, as torch deals).
        pre_shuffle: cut base partitions from one seed-fixed permutation instead of the
            data set's order.

    Example::

        >>> policy = ShufflePolicy.partial(0.1, partition="strided")
        >>> policy
        ShufflePolicy('partial', q=0.1, partition='strided')
        >>> policy.partitioned, policy.exchanges
        (True, True)
    """

    kind: str = "global"
    q: float = 0.0
    block_size: int = 64
    partition: str = "contiguous"
    pre_shuffle: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise TypeError(
                f"shuffle={self.kind!r} must be a policy name, one of {POLICIES}, "
                "or a ShufflePolicy"
            )
        rule = _RULES.get(self.kind)
        if rule is None:
            raise ValueError(f"shuffle={self.kind!r} is not one of {POLICIES}")
        check_number("q", self.q, 0.0, 1.0, hint=" (the exchanged fraction)")
        if not rule.takes_q and self.q:
            raise ValueError(
                f"q={self.q} only applies to shuffle='partial'; use ShufflePolicy.partial(q)"
            )
        object.__setattr__(self, "block_size", check_int("block_size", self.block_size, 1))
        if not isinstance(self.partition, str):
            raise TypeError(f"partition={self.partition!r} must be one of {_PARTITIONS}")
        if self.partition not in _PARTITIONS:
            raise ValueError(f"partition={self.partition!r} must be one of {_PARTITIONS}")
        object.__setattr__(self, "pre_shuffle", check_bool("pre_shuffle", self.pre_shuffle))

    def __repr__(self) -> str:
        """The kind and the fields that differ from their defaults, as a call."""
        shown = [repr(self.kind)]
        defaults: tuple[tuple[str, object], ...] = (
            ("q", 0.0),
            ("block_size", 64),
            ("partition", "contiguous"),
            ("pre_shuffle", False),
        )
        shown += [f"{k}={getattr(self, k)!r}" for k, v in defaults if getattr(self, k) != v]
        return f"ShufflePolicy({', '.join(shown)})"

    @classmethod
    def local(cls, partition: str = "contiguous", pre_shuffle: bool = False) -> ShufflePolicy:
        """Fixed partitions, re-permuted every epoch (no movement between owners).

        Args:
            partition: ``"contiguous"`` or ``"strided"``.
            pre_shuffle: cut the partitions from one seed-fixed permutation.

        Example::

            >>> ShufflePolicy.local("strided").partitioned
            True
        """
        return cls("local", partition=partition, pre_shuffle=pre_shuffle)

    @classmethod
    def partial(
        cls, q: float, partition: str = "contiguous", pre_shuffle: bool = False
    ) -> ShufflePolicy:
        """Partial-local shuffling: a seeded fraction ``q`` of every partition is exchanged
        every epoch.

        Args:
            q: the exchanged fraction, in ``[0, 1]``.
            partition: ``"contiguous"`` or ``"strided"``.
            pre_shuffle: cut the partitions from one seed-fixed permutation.

        Example::

            >>> ShufflePolicy.partial(0.25).q
            0.25
        """
        return cls("partial", q=q, partition=partition, pre_shuffle=pre_shuffle)

    @classmethod
    def block(cls, block_size: int) -> ShufflePolicy:
        """Contiguous blocks of ``block_size`` samples in a shuffled order.

        Args:
            block_size: samples per block, ``>= 1``.

        Example::

            >>> ShufflePolicy.block(128).block_size
            128
        """
        return cls("block", block_size=block_size)

    @property
    def _rule(self) -> _Rule:
        return _RULES[self.kind]

    @property
    def partitioned(self) -> bool:
        """True for policies that keep every sample on one owner's partition."""
        return self._rule.order is None

    @property
    def shuffles(self) -> bool:
        """False only for ``none``: the order is then the data set's own."""
        return self._rule.shuffles

    @property
    def exchanges(self) -> bool:
        """True when partitions exchange samples every epoch (``partial`` with ``q > 0``)."""
        return self._rule.takes_q and self.q > 0

    @property
    def needs_labels(self) -> bool:
        """True when the order is drawn from class labels (``stratified``)."""
        return self._rule.needs_labels

    @property
    def permutes_all(self) -> bool:
        """True when the epoch order is one seeded permutation of every sample (``global``),
        which ``chronica.core.partition.fitted_order`` draws straight into its buffer."""
        return self._rule.permutes_all

    def to_tuple(self) -> tuple[Any, ...]:
        """Every field, JSON-ready (part of the configuration digest)."""
        return (self.kind, float(self.q), self.block_size, self.partition, self.pre_shuffle)


def as_shuffle_policy(shuffle: Any) -> ShufflePolicy:
    """The ``shuffle=`` argument as a policy.

    Args:
        shuffle: ``True`` (global), ``False`` (none), a policy name other than
            ``"partial"`` (which needs its fraction: ``ShufflePolicy.partial(q)``), or a
            ``ShufflePolicy``. Anything else raises ``TypeError``.

    Example::

        >>> as_shuffle_policy("block")
        ShufflePolicy('block')
        >>> as_shuffle_policy(False).shuffles
        False
    """
    if isinstance(shuffle, ShufflePolicy):
        return shuffle
    if shuffle is True:
        return ShufflePolicy("global")
    if shuffle is False:
        return ShufflePolicy("none")
    if isinstance(shuffle, str):
        rule = _RULES.get(shuffle)
        if rule is not None and rule.takes_q:
            raise ValueError(f"shuffle={shuffle!r} needs a fraction: ShufflePolicy.partial(q=0.1)")
        return ShufflePolicy(shuffle)
    raise TypeError(
        f"shuffle={shuffle!r} must be True, False, one of {POLICIES} or a ShufflePolicy"
    )


def epoch_order(
    policy: ShufflePolicy, n: int, seed: int, epoch: int, labels: np.ndarray | None
) -> np.ndarray:
    """The epoch's order of all ``n`` samples under a non-partitioned policy (int64).

    Args:
        policy: a policy that is not ``partitioned``.
        n: the number of samples.
        seed: the run's seed.
        epoch: the epoch.
        labels: one class label per sample (needed by ``stratified``), or ``None``.

    Example::

        >>> epoch_order(ShufflePolicy("none"), 4, seed=0, epoch=0, labels=None).tolist()
        [0, 1, 2, 3]
    """
    order = policy._rule.order
    if order is None:
        raise ValueError(f"shuffle={policy.kind!r} is partitioned; use the partition planner")
    return order(policy, n, derive_key(seed, epoch, Stream.ORDER), labels)
