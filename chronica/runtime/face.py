"""What every adapter's face offers besides its batches, forwarded to its ``RankStream``.

The torch samplers, the ``tf.data`` transformation and the JAX iterator inherit these, so
the same method means the same thing everywhere: ``set_epoch``, ``plan``, ``stats``,
``loss_weights``/``loss_weight``, ``report``, ``movement``, ``label_skew``, ``close`` and
one pair of state methods, ``get_state``/``set_state`` (the torch samplers add torch's
names, ``state_dict``/``load_state_dict``, for the same two).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chronica.core import LabelSkew, Movement, PlanStats, Scheduler
from chronica.core.plan import EpochPlan
from chronica.runtime.stream import RankStream

__all__ = ["StreamFace"]


class StreamFace:
    """Forwards the stream-level calls of an adapter to ``self.stream``."""

    stream: RankStream

    def __repr__(self) -> str:
        stream = getattr(self, "stream", None)
        if stream is None:
            return f"{type(self).__name__}(not built)"
        return (
            f"{type(self).__name__}(rank={stream.rank}, num_replicas={stream.num_replicas}, "
            f"epoch={stream.epoch}, samples={stream.scheduler.num_samples}, "
            f"config={stream.config!r})"
        )

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler every plan comes from (sizes, configuration, digest)."""
        return self.stream.scheduler

    @property
    def num_replicas(self) -> int:
        return self.stream.num_replicas

    @property
    def rank(self) -> int:
        return self.stream.rank

    @property
    def epoch(self) -> int:
        """The epoch being iterated (``set_epoch`` selects it)."""
        return self.stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate next; call it before each epoch, as with torch.
        Selecting the current epoch again keeps a position loaded by ``set_state``.

        Args:
            epoch: the epoch, an int >= 0.
        """
        self.stream.set_epoch(epoch)

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``, the current one by default (after an
        elastic ``set_state``, the plan of the current epoch's remainder).

        Args:
            epoch: the epoch, or ``None`` for the current one.
        """
        return self.stream.plan(epoch)

    def stats(self, epoch: int | None = None) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan.

        Args:
            epoch: the epoch, or ``None`` for the current one.
        """
        return self.stream.stats(epoch)

    def loss_weights(self, epoch: int | None = None) -> np.ndarray:
        """This rank's loss weight for every step of ``epoch``: multiply the local mean loss
        by it so the all-reduced average gradient is the mean over the step's global batch
        (all ones while every rank has the same count). With ``kind="dynamic"`` a step's
        weight is known once its batch was yielded; the others are NaN.

        Args:
            epoch: the epoch, or ``None`` for the current one.
        """
        return self.stream.loss_weights(epoch)

    def loss_weight(self, step: int) -> float:
        """This rank's loss weight at ``step`` of the current epoch (see ``loss_weights``).

        Args:
            step: the step of the current epoch.
        """
        return float(self.stream.loss_weights()[step])

    def report(self, seconds: float, step: int | None = None, epoch: int | None = None) -> None:
        """Tell the dynamic scheduler this rank's own compute time for a step: forward and
        backward, *before* waiting for the gradient all-reduce (the synchronised step time
        is the same on every rank and says nothing). ``step`` defaults to the step after
        the one reported last, ``epoch`` to the one being iterated. Without
        ``kind="dynamic"`` this does nothing.

        Args:
            seconds: this rank's compute time of the step.
            step: the step, or ``None`` for the one after the step reported last.
            epoch: the epoch, or ``None`` for the one being iterated.

        Example::

            for step, batch in enumerate(loader):
                started = time.perf_counter()
                loss = model(batch).mean(); loss.backward()
                sampler.report(time.perf_counter() - started)
                optimizer.step()
        """
        self.stream.report(seconds, step, epoch)

    def movement(self, epoch: int | None = None, sample_bytes: Any = None) -> Movement:
        """Samples (and bytes, given ``sample_bytes`` per sample) each node fetches for
        ``epoch``; see ``chronica.core.accounting`` for what a node holds.

        Args:
            epoch: the epoch, or ``None`` for the current one.
            sample_bytes: bytes of every sample (one number, or one per sample), or ``None``.
        """
        return self.stream.movement(epoch, sample_bytes)

    def label_skew(self, epoch: int | None = None, labels: Any = None) -> LabelSkew:
        """Jensen–Shannon divergence of batch and node label frequencies from the data
        set's, for ``epoch``.

        Args:
            epoch: the epoch, or ``None`` for the current one.
            labels: one class per sample; ``None`` for those given at construction.
        """
        return self.stream.label_skew(epoch, labels)

    def get_state(self) -> dict[str, Any]:
        """Resumable position, a small JSON-ready dict that does not depend on the rank
        (see ``chronica.runtime.RankStream.state``); every adapter reads every adapter's."""
        return self.stream.state()

    def set_state(self, state: Any) -> None:
        """Continue from ``state`` (``get_state`` of any rank, from any adapter): exactly
        where it stopped at the same world size and global batch size, or with the epoch's
        remaining samples at another (elastic resume; see
        ``chronica.runtime.RankStream.load_state``).

        Args:
            state: what ``get_state`` returned (any rank's, any adapter's).
        """
        self.stream.load_state(state)

    def close(self) -> None:
        """Release the coordinator connection (and, on rank 0, stop the coordinator).
        Idempotent; also done at interpreter exit."""
        self.stream.close()
