"""Dynamic scheduling: plan window after window from the ranks' measured speeds.

``DynamicPlanner`` runs where the feedback arrives (the coordinator at rank 0, or the
simulator). Every step keeps the samples of the static exact plan (``Scheduler.plan_epoch``),
so coverage is exactly-once however the feedback looks and whichever windows fall back to
the static plan; only the split of each step between ranks follows the measured speeds:

1. reports ``(rank, load, seconds)`` update every rank's ``t = alpha + beta·load`` fit
   (``chronica.core.controller.RankTimeModel``);
2. at the start of each window (``config.window`` steps), with ``variable_batch=True``,
   the ``BatchController`` chooses per-rank counts (speed-proportional, bounded, adding up
   to each node's share of the global batch), else counts stay equal;
3. every step of the window is split by the balancing kernel so that the predicted
   *times* ``alpha_r + beta_r·load_r``, not the loads, are as equal as they can be: slow
   ranks get lighter samples.

A packed configuration (``ScheduleConfig(packing=...)``) instead re-packs every step's
pieces of the static plan (``chronica.core.packing.pack_steps``) for the ranks' speeds and
the cost coefficients that ``CostCalibration`` fits from reports carrying each rank's work
``(n, ΣL, ΣL²)``: faster ranks get more tokens, every micro-batch stays under the cap.

A window's plan depends only on (sizes, configuration, epoch, the reports received before
it was planned); once planned it is cached and served unchanged to every rank that asks.
"""

from __future__ import annotations

import numpy as np

from chronica.core.balance import balance_steps
from chronica.core.calibration import CostCalibration
from chronica.core.controller import BatchController, RankTimeModel
from chronica.core.cost import CostModel
from chronica.core.packing import pack_steps
from chronica.core.plan import MicroLayout, WindowPlan
from chronica.core.scheduler import Scheduler

__all__ = ["DynamicPlanner"]

# Windows kept per epoch are all of them; epochs kept are the current and the one before
# (a rank resuming late in the previous epoch must get the windows the others trained on).
_EPOCHS_KEPT = 2


class DynamicPlanner:
    """Plans the windows of ``kind="dynamic"`` epochs from feedback.

    ``plan_window(epoch, first_step)`` (``first_step`` a multiple of ``window``) returns the
    window's plan, planning it on first request; ``observe(rank, step, load, seconds)``
    feeds a rank's own compute time for a step. Guarantees: every window's steps contain
    exactly the samples of the same steps of ``scheduler.plan_epoch(epoch)``; per-rank
    counts add up to the step's size, equal on every rank unless ``variable_batch``, and
    within ``[min_batch, max_batch]``; the same window is never planned twice.

    Args:
        scheduler: the static plans the windows re-split; its mode must open a session.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        config = scheduler.config
        if not config.mode.opens_session:
            raise ValueError(f"DynamicPlanner needs kind='dynamic', not {config.mode.name!r}")
        self.scheduler = scheduler
        self.config = config
        self.window = config.window
        self.times = RankTimeModel(config.num_replicas, config.controller)
        low, high = config.batch_bounds()
        self._controllers = [
            BatchController(ranks.shape[0], low, high, config.controller)
            for ranks in scheduler.owners.ranks
        ]
        self._plans: dict[tuple[int, int], WindowPlan] = {}
        # 1 + the newest epoch whose windows were dropped: planning one of them again could
        # split a step differently from what ranks already trained on.
        self.forgotten = 0
        self.calibration = (
            None
            if config.packing is None
            else CostCalibration(config.num_replicas, config.cost, config.controller.history)
        )
        self._piece_costs: tuple[CostModel, np.ndarray] | None = None

    def num_windows(self, epoch: int) -> int:
        """Windows in ``epoch`` (the last one may be shorter)."""
        return -(-self.scheduler.num_steps(epoch) // self.window)

    def observe(
        self,
        rank: int,
        step: int,
        load: float,
        seconds: float,
        work: np.ndarray | None = None,
    ) -> None:
        """Rank ``rank`` computed ``step`` (``load`` predicted cost; packed: ``work``, its
        pieces, tokens and squared tokens) in ``seconds``."""
        del step  # reports are used in arrival order; the step is for the caller's records
        if self.calibration is not None:
            if work is not None:
                self.calibration.observe(rank, work, float(seconds))
            return
        self.times.observe(rank, float(load), float(seconds))

    def planned(self, epoch: int, first_step: int) -> WindowPlan | None:
        """The window's plan if it was already planned, else ``None``."""
        return self._plans.get((epoch, first_step))

    def plan_window(self, epoch: int, first_step: int) -> WindowPlan:
        """The plan of the window starting at ``first_step`` of ``epoch``."""
        key = (int(epoch), int(first_step))
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        steps = self.scheduler.num_steps(key[0])
        if first_step % self.window or not 0 <= first_step < max(steps, 1):
            raise ValueError(
                f"first_step={first_step} must be a multiple of window={self.window} below "
                f"the epoch's {steps} steps"
            )
        plan = self._plan(key[0], key[1], min(first_step + self.window, steps))
        self._plans[key] = plan
        for old in [k for k in self._plans if k[0] <= key[0] - _EPOCHS_KEPT]:
            del self._plans[old]
            self.forgotten = max(self.forgotten, old[0] + 1)
        return plan

    def _plan_packed(self, epoch: int, first: int, stop: int) -> WindowPlan:
        scheduler, config = self.scheduler, self.config
        assert self.calibration is not None and scheduler.pieces is not None
        assert config.packing is not None
        static = scheduler.plan_epoch(epoch)
        layout = static.micro
        assert layout is not None
        model = self.calibration.model()
        if self._piece_costs is None or self._piece_costs[0] != model:
            self._piece_costs = (model, model(scheduler.pieces.length))
        step_pieces = [
            [
                np.concatenate(
                    [layout.pieces[static.bounds[s, r] : static.bounds[s, r + 1]] for r in ranks]
                )
                for ranks in scheduler.owners.ranks
            ]
            for s in range(first, stop)
        ]
        packed = pack_steps(
            step_pieces,
            scheduler.owners.ranks,
            config.num_replicas,
            scheduler.pieces,
            self._piece_costs[1],
            config.packing,
            self.calibration.speeds(),
        )
        capacity = config.packing.rows * config.packing.length
        plan = WindowPlan(
            epoch=epoch,
            first_step=first,
            num_replicas=config.num_replicas,
            indices=packed.indices,
            bounds=packed.bounds,
            loads=packed.loads,
            digest=scheduler.digest,
            micro=MicroLayout(**packed.layout, capacity=capacity),
        )
        for array in (plan.indices, plan.bounds, plan.loads, *packed.layout.values()):
            array.setflags(write=False)
        return plan

    def _plan(self, epoch: int, first: int, stop: int) -> WindowPlan:
        if self.calibration is not None:
            return self._plan_packed(epoch, first, stop)
        static = self.scheduler.plan_epoch(epoch)
        w = self.config.num_replicas
        owners = self.scheduler.owners
        costs = self.scheduler.costs
        alpha, beta = self.times.params()
        num_steps = stop - first
        counts = np.zeros((num_steps, w), np.int64)
        loads = np.zeros((num_steps, w))
        pieces: list[list[np.ndarray]] = [[None] * w for _ in range(num_steps)]  # type: ignore[list-item]
        for ranks, controller in zip(owners.ranks, self._controllers, strict=True):
            # The owner's samples of every step of the window, step after step.
            per_step = [
                np.concatenate([static.local(s, int(r)) for r in ranks]) for s in range(first, stop)
            ]
            lengths = np.array([p.shape[0] for p in per_step], np.int64)
            samples = np.concatenate(per_step)
            owner_counts = self._owner_counts(controller, ranks, lengths, samples, alpha, beta)
            starts = np.concatenate([[0], np.cumsum(lengths)])
            perm, owner_loads = balance_steps(
                costs[samples],
                starts,
                ranks.shape[0],
                counts=owner_counts,
                alpha=alpha[ranks],
                beta=beta[ranks],
            )
            ordered = samples[perm]
            for i in range(num_steps):
                offsets = starts[i] + np.concatenate([[0], np.cumsum(owner_counts[i])])
                for j, r in enumerate(ranks):
                    pieces[i][r] = ordered[offsets[j] : offsets[j + 1]]
            counts[:, ranks] = owner_counts
            loads[:, ranks] = owner_loads
        indices = np.concatenate([p for step in pieces for p in step] or [np.empty(0, np.int64)])
        bounds = np.concatenate([[0], np.cumsum(counts.ravel())])[:-1].reshape(num_steps, w)
        ends = bounds[:, -1:] + counts[:, -1:]
        plan = WindowPlan(
            epoch=epoch,
            first_step=first,
            num_replicas=w,
            indices=indices.astype(np.int64, copy=False),
            bounds=np.concatenate([bounds, ends], axis=1),
            loads=loads,
            digest=self.scheduler.digest,
        )
        for array in (plan.indices, plan.bounds, plan.loads):
            array.setflags(write=False)
        return plan

    def _owner_counts(
        self,
        controller: BatchController,
        ranks: np.ndarray,
        lengths: np.ndarray,
        samples: np.ndarray,
        alpha: np.ndarray,
        beta: np.ndarray,
    ) -> np.ndarray:
        """Samples per (step, rank of this owner) for the window."""
        n = ranks.shape[0]
        if not self.config.variable_batch:
            return np.repeat((lengths // n)[:, None], n, axis=1)
        unit = float(self.scheduler.costs[samples].mean()) if samples.shape[0] else 1.0
        # One decision per window: full steps first, then a shorter trailing step scaled.
        decided = {
            int(t): controller.counts(int(t), alpha[ranks], beta[ranks], unit)
            for t in sorted(set(lengths.tolist()), reverse=True)
        }
        return np.stack([decided[int(t)] for t in lengths])
