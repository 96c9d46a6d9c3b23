"""One rank's scheduled stream of local batches: the object every adapter is a face of.

``RankStream`` owns, for one rank, what the torch samplers, the ``tf.data`` transformation
and the JAX iterator used to re-implement each: the scheduler built from sizes and
configuration, the epoch and the position in it, the dynamic session (coordinator on rank
0, client, all-ranks agreement, fallback to the static plan), the elastically resumed plan,
loss weights, diagnostics, the planning progress bar, and one state format.

The state (``state()`` / ``load_state()``) does not depend on the rank: ``epoch``, ``step``
(the steps of the epoch's plan this rank has completely yielded) and ``offset`` (samples
yielded of the next step, only by sample-level faces such as torch's
``DistributedSampler``), the configuration ``digest``, and for a change of world
``num_replicas``, ``batch_size``, ``history`` and ``fingerprint`` (``chronica.core.elastic``).
Plans are the same bytes in every adapter, so a state saved by one adapter resumes the same
epoch in any other.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from chronica.core import (
    LabelSkew,
    Movement,
    PlanStats,
    ScheduleConfig,
    Scheduler,
    label_skew,
    movement,
)
from chronica.core.checks import check_int
from chronica.core.elastic import Segment, StateFormat, load_state, state_fields
from chronica.core.plan import EpochPlan
from chronica.runtime.agreement import Agreement
from chronica.runtime.micro import MicroBatch, planned_micro_batches
from chronica.runtime.options import DynamicOptions
from chronica.runtime.progress import plan_epoch
from chronica.runtime.session import DynamicSession

__all__ = ["STATE_VERSION", "LocalBatch", "MicroBatch", "RankStream", "state_format"]

logger = logging.getLogger("chronica")

STATE_VERSION = 3


def state_format(owner: str, batch: str = "global_batch_size") -> StateFormat:
    """How a face's state messages read: ``owner`` names what builds it (``"sampler"``,
    ``"iterator"``...), ``batch`` its global batch size argument."""
    return StateFormat(
        versions=(STATE_VERSION,), name="state", owner=owner, position="step", batch=batch
    )


class LocalBatch(NamedTuple):
    """This rank's part of one step: ``indices`` (int64) and the ``loss_weight`` to multiply
    its local mean loss by (1.0 while every rank has the same count). A packed step also
    has ``micro``: its micro-batches, the same number on every rank.

    Args:
        epoch: the epoch of the step.
        step: the step.
        indices: this rank's samples of the step.
        loss_weight: the factor of this rank's local mean loss.
        micro: the step's micro-batches on this rank, when packed.
    """

    epoch: int
    step: int
    indices: np.ndarray
    loss_weight: float
    micro: tuple[MicroBatch, ...] = ()


class RankStream:
    """Rank ``rank``'s local batches of ``scheduler``'s plans, epoch by epoch, resumable.

    Guarantees: ``batches()`` yields every step of the current epoch from the current
    position once, in order, with exactly ``plan().local(step, rank)`` (static kinds, or an
    elastically resumed epoch) or, with ``kind="dynamic"``, this rank's part of the
    coordinator's plan of the step's window when every rank holds the same planning of it
    and of the static plan otherwise (the same samples at every step, so every sample is
    used once per epoch either way). Every rank yields the same number of steps.

    Args:
        scheduler: the plans (sizes and plan request).
        rank: this process's rank.
        dynamic: the transport to rank 0's coordinator, when the mode opens a session.
        agree: the all-ranks agreement (``chronica.runtime.agreement``); without it (and
            more than one rank) no session opens and every window is the static plan.
        names: words the state's messages in the adapter's terms.

    Example::

        >>> import numpy as np
        >>> from chronica.core import ScheduleConfig, Scheduler
        >>> stream = RankStream(Scheduler(np.arange(1, 33), ScheduleConfig(2, 8)), rank=1)
        >>> [len(batch.indices) for batch in stream.batches()]
        [4, 4, 4, 4]
    """

    def __init__(
        self,
        scheduler: Scheduler,
        rank: int,
        *,
        dynamic: DynamicOptions | None = None,
        agree: Agreement | None = None,
        names: StateFormat | None = None,
    ) -> None:
        config = scheduler.config
        self.scheduler = scheduler
        self.num_replicas = config.num_replicas
        self.rank = check_int("rank", rank, 0, self.num_replicas - 1)
        self.names = names or state_format("stream")
        self.epoch = 0
        self._step = 0  # steps of the current plan completely yielded
        self._offset = 0  # samples yielded of step ``_step`` (sample-level faces only)
        self._count = 0  # samples of this rank in step ``_step``
        self._start: tuple[int, int] = (0, 0)  # where the next ``batches()`` begins
        # An elastically resumed epoch: the worlds it ran at (oldest first) and the plan of
        # the samples they left, which replaces the epoch's ordinary plan until it ends.
        self._resumed: tuple[tuple[Segment, ...], EpochPlan] | None = None
        self._weights: dict[int, float] = {}
        self.session: DynamicSession | None = None
        if config.mode.opens_session and agree is None and self.num_replicas > 1:
            # No rank could prove the others hold the same window: the static plan serves
            # every one (exactly-once), and no coordinator is started for nothing.
            logger.warning(
                "chronica: kind='dynamic' without an agreement between ranks: every window "
                "uses the static plan; initialise the framework's distributed runtime before "
                "building the data pipeline to balance dynamically"
            )
        elif config.mode.opens_session:
            options = dynamic or DynamicOptions()
            self.session = DynamicSession(
                scheduler,
                self.rank,
                host=options.host,
                port=options.port,
                timeout=options.timeout,
                agree=agree,
            )

    # -- the plan --------------------------------------------------------------------------

    @property
    def config(self) -> ScheduleConfig:
        return self.scheduler.config

    @property
    def dynamic(self) -> bool:
        """Whether steps come window by window from the coordinator (else from ``plan()``)."""
        return self.session is not None and self._resumed is None

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``, the current one by default; after an
        elastic ``load_state``, the current epoch's plan is that of its remainder. With
        ``kind="dynamic"`` this is the static plan the coordinator's windows re-split."""
        epoch = self.epoch if epoch is None else epoch
        if self._resumed is not None and epoch == self.epoch:
            return self._resumed[1]
        return plan_epoch(self.scheduler, epoch)

    @property
    def num_steps(self) -> int:
        """Steps of the current epoch, equal on every rank (of its remainder after an
        elastic ``load_state``)."""
        if self._resumed is not None:
            return self._resumed[1].num_steps
        return self.scheduler.num_steps(self.epoch)

    def step_counts(self) -> np.ndarray:
        """This rank's sample count at every step of the current epoch's static plan (a
        dynamic plan's are known as its windows arrive)."""
        if self._resumed is not None or self.packed:
            return self.plan().counts[:, self.rank]
        return np.asarray(self.scheduler.step_counts(), dtype=np.int64)

    @property
    def packed(self) -> bool:
        """Whether steps come as micro-batches (``ScheduleConfig(packing=...)``)."""
        return self.config.packing is not None

    def _units(self, plan: EpochPlan, step: int) -> int:
        """What a sample-level face counts of ``step`` of ``plan``: this rank's samples, or
        its micro-batches when packed."""
        if plan.micro is not None:
            return int(plan.micro.num_micro[step])
        return int(plan.counts[step, self.rank])

    # -- the position ----------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Steps of the current epoch this rank has completely yielded."""
        return self._step

    @property
    def offset(self) -> int:
        """Samples of step ``step`` already yielded (a sample-level face mid-step)."""
        return self._offset

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch that ``batches()`` iterates next. Selecting the current epoch
        again keeps a position loaded by ``load_state``."""
        epoch = check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self._start = (0, 0)
            self._step = self._offset = 0
            self._resumed = None
        self.epoch = epoch

    def rewind(self, epoch: int) -> None:
        """Select ``epoch`` and start it from its first step, forgetting a position loaded
        by ``load_state`` (a face whose every iteration starts afresh)."""
        self.set_epoch(check_int("epoch", epoch, 0))
        self._start = (0, 0)
        self._step = self._offset = 0
        self._resumed = None

    def advance(self, samples: int) -> None:
        """A sample-level face handed out ``samples`` more samples (micro-batches, when
        packed) of the current step (``batches(whole=False)``); the step counts as
        completed once all were."""
        self._offset += samples
        if self._offset >= self._count:
            self._step, self._offset = self._step + 1, 0

    def batches(self, whole: bool = True) -> Iterator[LocalBatch]:
        """This rank's local batches of the current epoch, from where the last
        ``load_state`` left it (else from the start).

        ``whole=True`` (batch-level faces): a step counts as completed as soon as its batch
        is handed out, so ``state()`` taken after a batch resumes at the next one.
        ``whole=False`` (sample-level faces): the face calls ``advance`` for the samples it
        hands out, and the first batch after a mid-step ``load_state`` still holds the
        ``offset`` samples already handed out (the face skips them)."""
        (start, offset), self._start = self._start, (0, 0)
        self._step, self._offset = start, offset
        if self.dynamic:
            assert self.session is not None
            if start == 0:
                self._weights = {}
            source = self.session.steps(self.epoch, start)
        else:
            source = self._planned(start)
        for step, indices, weight, micro in source:
            if self.session is not None:
                self._weights[step] = weight
            count = len(micro) if micro else int(indices.shape[0])
            self._step, self._offset, self._count = step, offset, count
            if whole:
                self._step, self._offset = step + 1, 0
            yield LocalBatch(self.epoch, step, indices, weight, micro)
            offset = 0

    def _planned(
        self, start: int
    ) -> Iterator[tuple[int, np.ndarray, float, tuple[MicroBatch, ...]]]:
        plan = self.plan()
        for step in range(start, plan.num_steps):
            batch = self.planned(plan, step)
            yield step, batch.indices, batch.loss_weight, batch.micro

    def planned(self, plan: EpochPlan, step: int) -> LocalBatch:
        """This rank's part of ``step`` of ``plan`` (a static plan, e.g. ``plan(epoch)``):
        ``plan.local(step, rank)``, its loss weight and, when packed, its micro-batches.
        Random access: the position does not move."""
        weight = float(plan.loss_weights[step, self.rank])
        micro = () if plan.micro is None else planned_micro_batches(plan, step, self.rank)
        return LocalBatch(plan.epoch, step, plan.local(step, self.rank), weight, micro)

    # -- feedback and diagnostics -----------------------------------------------------------

    def report(self, seconds: float, step: int | None = None, epoch: int | None = None) -> None:
        """This rank's own compute time for a step it yielded (forward and backward, before
        waiting for the gradient all-reduce); ``step`` defaults to the one after the step
        reported last, ``epoch`` to the one being yielded (a face that prefetches names the
        previous one for its last steps). Does nothing unless ``kind="dynamic"``."""
        if self.session is not None:
            self.session.report(seconds, step, epoch)

    def loss_weights(self, epoch: int | None = None) -> np.ndarray:
        """This rank's loss weight at every step of ``epoch`` (the current one by default).
        With ``kind="dynamic"`` a step's weight is known once its batch was yielded: the
        current epoch's yielded steps have theirs, the others are NaN."""
        current = epoch is None or epoch == self.epoch
        if self.session is None or (current and self._resumed is not None):
            return self.plan(epoch).loss_weights[:, self.rank]
        weights = np.full(self.plan(epoch).num_steps, np.nan)
        if current:
            for step, weight in self._weights.items():
                weights[step] = weight
        return weights

    def stats(self, epoch: int | None = None) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan (the current one by default)."""
        return self.scheduler.plan_stats(self.plan(epoch))

    def movement(self, epoch: int | None = None, sample_bytes: Any = None) -> Movement:
        """Samples (and bytes, given ``sample_bytes`` per sample) each node fetches for
        ``epoch``; see ``chronica.core.accounting``."""
        return movement(self.scheduler, self.epoch if epoch is None else epoch, sample_bytes)

    def label_skew(self, epoch: int | None = None, labels: Any = None) -> LabelSkew:
        """Jensen–Shannon divergence of batch and node label frequencies from the data
        set's, for ``epoch``; ``labels`` default to the scheduler's."""
        labels = self.scheduler.labels if labels is None else labels
        if labels is None:
            raise ValueError("label_skew needs labels= (one class label per sample)")
        return label_skew(self.scheduler, self.epoch if epoch is None else epoch, labels)

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Where this rank's stream stands, a small JSON-ready dict that does not depend on
        the rank: ``version``, ``epoch``, ``step``, ``offset``, ``digest`` (the whole
        configuration, world and batch size included) and, for a change of world,
        ``num_replicas``, ``batch_size``, ``history`` (``[W, B, step]`` of the worlds the
        epoch ran at before, oldest first) and ``fingerprint`` (everything else)."""
        history = () if self._resumed is None else self._resumed[0]
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "offset": self._offset,
            "digest": self.scheduler.digest,
            **state_fields(self.scheduler, history, self._step),
        }

    def load_state(self, state: Any) -> None:
        """Continue from ``state`` (any rank's ``state()``, from any adapter).

        Same world size and batch size: the next ``batches()`` continues exactly where the
        saved stream stopped, mid-step included, with the bytes an uninterrupted run yields.

        Another world size or global batch size (elastic resume, ``chronica.core.elastic``):
        the steps completed at the saved world count as trained (a partly yielded step does
        not); the epoch's remaining samples, in the saved plan's order, are planned for this
        world, balanced, with equal step counts on every rank, padded or cut as
        ``drop_last`` says; every sample appears exactly once over the trained steps and
        the remainder apart from that padding or cutting. ``plan()`` and ``num_steps``
        describe the remainder until ``set_epoch`` selects another epoch.

        Raises ``ValueError`` for another state version, state saved with other sizes,
        labels or arguments (naming the fields that differ; only the world size and global
        batch size may change) and, mid-epoch, for a change of world under
        ``kind="dynamic"`` or a node-partitioned shuffle.
        """
        resumed = load_state(state, self.scheduler, self.scheduler.digest, self.names)
        plan = resumed.plan
        steps = self.scheduler.num_steps(resumed.epoch) if plan is None else plan.num_steps
        if resumed.position > steps:
            raise ValueError(
                f"{self.names.name} {self.names.position}={resumed.position} is outside "
                f"this epoch's {steps} steps"
            )
        offset = state.get("offset", 0) if resumed.same_world else 0
        count = 0
        if offset and resumed.position < steps:
            whole = plan_epoch(self.scheduler, resumed.epoch) if plan is None else plan
            count = self._units(whole, resumed.position)
        offset = check_int(f"{self.names.name} offset", offset, 0, count)
        self.epoch = resumed.epoch
        self._resumed = None if plan is None else (resumed.history, plan)
        self._start = (resumed.position, offset)
        self._step, self._offset = resumed.position, offset
        self._weights = {}

    def close(self) -> None:
        """Release the coordinator connection (and, on rank 0, stop the coordinator).
        Idempotent; also done at interpreter exit."""
        if self.session is not None:
            self.session.close()
