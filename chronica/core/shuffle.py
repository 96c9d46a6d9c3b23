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
from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_bool, check_int, check_number
from chronica.core.rng import Stream, derive_key, permutation, uniforms

__all__ = ["POLICIES", "ShufflePolicy", "as_shuffle_policy", "epoch_order"]

POLICIES = ("global", "local", "partial", "block", "stratified", "none")
_PARTITIONS = ("contiguous", "strided")


@dataclass(frozen=True)
class ShufflePolicy:
    """How the samples of an epoch are ordered and, for ``local``/``partial``, partitioned.

    Validated on construction; see the module docstring for the meaning of every kind.
    """

    kind: str = "global"
    q: float = 0.0
    block_size: int = 64
    partition: str = "contiguous"
    pre_shuffle: bool = False

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"shuffle={self.kind!r} is not one of {POLICIES}")
        check_number("q", self.q, 0.0, 1.0, hint=" (the exchanged fraction)")
        if self.kind != "partial" and self.q:
            raise ValueError(f"q={self.q} only applies to shuffle='partial'")
        object.__setattr__(self, "block_size", check_int("block_size", self.block_size, 1))
        if self.partition not in _PARTITIONS:
            raise ValueError(f"partition={self.partition!r} must be one of {_PARTITIONS}")
        object.__setattr__(self, "pre_shuffle", check_bool("pre_shuffle", self.pre_shuffle))

    @classmethod
    def local(cls, partition: str = "contiguous", pre_shuffle: bool = False) -> ShufflePolicy:
        return cls("local", partition=partition, pre_shuffle=pre_shuffle)

    @classmethod
    def partial(
        cls, q: float, partition: str = "contiguous", pre_shuffle: bool = False
    ) -> ShufflePolicy:
        return cls("partial", q=q, partition=partition, pre_shuffle=pre_shuffle)

    @classmethod
    def block(cls, block_size: int) -> ShufflePolicy:
        return cls("block", block_size=block_size)

    @property
    def partitioned(self) -> bool:
        """True for policies that keep every sample on one owner's partition."""
        return self.kind in ("local", "partial")

    @property
    def shuffles(self) -> bool:
        """False only for ``none``: the order is then the data set's own."""
        return self.kind != "none"

    def to_tuple(self) -> tuple[Any, ...]:
        return (self.kind, float(self.q), self.block_size, self.partition, self.pre_shuffle)


def as_shuffle_policy(shuffle: Any) -> ShufflePolicy:
    """The ``shuffle=`` argument as a policy: ``True`` (global), ``False`` (none), a policy
    name, or a ``ShufflePolicy``."""
    if isinstance(shuffle, ShufflePolicy):
        return shuffle
    if shuffle is True:
        return ShufflePolicy("global")
    if shuffle is False:
        return ShufflePolicy("none")
    if isinstance(shuffle, str):
        if shuffle == "partial":
            raise ValueError("shuffle='partial' needs a fraction: ShufflePolicy.partial(q=0.1)")
        return ShufflePolicy(shuffle)
    raise ValueError(
        f"shuffle={shuffle!r} must be True, False, one of {POLICIES} or a ShufflePolicy"
    )


def stratified_order(labels: np.ndarray, key: np.uint64) -> np.ndarray:
    """A permutation in which each class is spread evenly: the j-th of a class's ``n_c``
    samples (in random order) sits at fractional position ``(j + u) / n_c``, ``u`` uniform."""
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


def epoch_order(
    policy: ShufflePolicy, n: int, seed: int, epoch: int, labels: np.ndarray | None
) -> np.ndarray:
    """The epoch's order of all ``n`` samples under a non-partitioned policy (int64)."""
    key = derive_key(seed, epoch, Stream.ORDER)
    if policy.kind == "global":
        return permutation(n, key)
    if policy.kind == "none":
        return np.arange(n, dtype=np.int64)
    if policy.kind == "block":
        blocks = math.ceil(n / policy.block_size)
        starts = permutation(blocks, key) * policy.block_size
        order = (starts[:, None] + np.arange(policy.block_size)[None, :]).ravel()
        return order[order < n]
    if policy.kind == "stratified":
        if labels is None:
            raise ValueError("shuffle='stratified' needs labels= (one class label per sample)")
        return stratified_order(labels, key)
    raise ValueError(f"shuffle={policy.kind!r} is partitioned; use the partition planner")
