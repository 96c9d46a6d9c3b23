"""What a plan costs besides compute: data movement between nodes and label skew.

Movement counts, per node (per rank without ``groups``), the samples it trains on in an epoch
that it does not hold. A node holds its own partition under the partitioned policies
(``local``, ``partial``: the partition stays on its disk, exchanged samples are streamed in),
and otherwise what it trained on in the previous epoch (a cache of one epoch; at epoch 0, its
contiguous share of the data set, as after a plain sharded copy). With these definitions the
expected movement is ``N(1-1/W)`` per epoch for ``global``, ``0`` for ``local`` and
``q·N(1-1/W)`` for ``partial(q)``, W being the number of nodes.

Label skew is the Jensen–Shannon divergence (base 2, in [0, 1]) between the label
frequencies of each global batch, or each node's epoch share, and those of the whole data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LabelSkew", "Movement", "js_divergence", "label_skew", "movement"]


@dataclass(frozen=True)
class Movement:
    """Samples (and bytes, when per-sample bytes are known) every node fetches in an epoch.
    Built by ``movement``.

    Args:
        epoch: the epoch.
        samples: ``int64``, the samples every node fetches.
        bytes: ``int64``, the bytes every node fetches, or ``None`` without sample bytes.

    Example::

        >>> Movement(0, np.array([3, 1]), None).total_samples
        4
    """

    epoch: int
    samples: np.ndarray  # per node
    bytes: np.ndarray | None  # per node

    @property
    def total_samples(self) -> int:
        """Samples fetched by all nodes together."""
        return int(self.samples.sum())

    @property
    def total_bytes(self) -> int | None:
        """Bytes fetched by all nodes together (``None`` without sample bytes)."""
        return None if self.bytes is None else int(self.bytes.sum())


@dataclass(frozen=True)
class LabelSkew:
    """Jensen–Shannon divergence of label frequencies from the data set's, mean and max.
    Built by ``label_skew``.

    Args:
        epoch: the epoch.
        batch_mean: the mean over the epoch's global batches.
        batch_max: the largest of a global batch.
        node_mean: the mean over the nodes' epoch shares.
        node_max: the largest of a node's share.
    """

    epoch: int
    batch_mean: float
    batch_max: float
    node_mean: float
    node_max: float


def movement(scheduler: Any, epoch: int, sample_bytes: Any = None) -> Movement:
    """How many samples (and bytes) every node must fetch for ``epoch`` (see module doc).

    Args:
        scheduler: a ``chronica.core.Scheduler`` (its ``node_samples`` and
            ``base_partitions``).
        epoch: the epoch.
        sample_bytes: one non-negative int per sample, or ``None`` to count samples only.

    Example::

        >>> from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy
        >>> local = Scheduler(np.ones(64), ScheduleConfig(4, 8, shuffle=ShufflePolicy.local()))
        >>> movement(local, 1).total_samples
        0
    """
    n = scheduler.num_samples
    nbytes = None
    if sample_bytes is not None:
        nbytes = np.asarray(sample_bytes, dtype=np.int64)
        if nbytes.shape != (n,) or (nbytes < 0).any():
            raise ValueError(f"sample_bytes must hold one non-negative int per sample ({n})")
    now = scheduler.node_samples(epoch)
    held = scheduler.base_partitions()
    if held is None:
        held = scheduler.node_samples(epoch - 1) if epoch > 0 else _initial_shares(n, len(now))
    fetched = [np.setdiff1d(mine, have) for mine, have in zip(now, held, strict=True)]
    samples = np.array([f.shape[0] for f in fetched], dtype=np.int64)
    moved = None if nbytes is None else np.array([int(nbytes[f].sum()) for f in fetched])
    return Movement(epoch=epoch, samples=samples, bytes=moved)


def _initial_shares(n: int, nodes: int) -> list[np.ndarray]:
    return list(np.array_split(np.arange(n), nodes))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence (base 2, in ``[0, 1]``) of two frequency vectors over the
    same classes.

    Args:
        p: counts or frequencies (not all zero).
        q: counts or frequencies of the same classes (not all zero).

    Example::

        >>> js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
        1.0
    """
    p = p / p.sum()
    q = q / q.sum()
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float((a[nz] * np.log2(a[nz] / m[nz])).sum())

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def label_skew(scheduler: Any, epoch: int, labels: Any) -> LabelSkew:
    """Label skew of every global batch and every node's share of ``epoch``.

    Args:
        scheduler: a ``chronica.core.Scheduler``.
        epoch: the epoch.
        labels: one class label per sample.

    Example::

        >>> from chronica.core import ScheduleConfig, Scheduler
        >>> plain = Scheduler(np.ones(64), ScheduleConfig(2, 16, shuffle=False))
        >>> round(label_skew(plain, 0, np.arange(64) // 32).batch_max, 3)  # one class a batch
        0.311
    """
    values = np.asarray(labels)
    if values.shape != (scheduler.num_samples,):
        raise ValueError(f"labels must hold one label per sample ({scheduler.num_samples})")
    _, codes = np.unique(values, return_inverse=True)
    classes = int(codes.max()) + 1 if codes.size else 0
    whole = np.bincount(codes, minlength=classes).astype(np.float64)
    plan = scheduler.plan_epoch(epoch)
    batches = [
        js_divergence(np.bincount(codes[plan.indices[b[0] : b[-1]]], minlength=classes), whole)
        for b in plan.bounds
        if b[-1] > b[0]
    ]
    nodes = [
        js_divergence(np.bincount(codes[share], minlength=classes), whole)
        for share in scheduler.node_samples(epoch)
        if share.size
    ]
    return LabelSkew(
        epoch=epoch,
        batch_mean=float(np.mean(batches)) if batches else 0.0,
        batch_max=float(np.max(batches)) if batches else 0.0,
        node_mean=float(np.mean(nodes)) if nodes else 0.0,
        node_max=float(np.max(nodes)) if nodes else 0.0,
    )
