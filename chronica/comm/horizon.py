"""How far ahead of its ranks the coordinator plans: the planning horizon.

One job: say whether a window may be planned now, from the job's progress (the slowest
rank's position, ``chronica.comm.peers.Peers.progress``) and the windows the planner has
dropped. A window in a dropped epoch could hand a rank a split the other ranks did not
train on, and one far ahead of the slowest rank would spend memory and time on windows
nobody needs yet: both are refused with a ``ProtocolError`` of code ``"stale"`` (the rank
uses the static plan), before anything is planned for them.
"""

from __future__ import annotations

from chronica.comm.peers import Peers
from chronica.comm.protocol import ProtocolError
from chronica.core.dynamic import DynamicPlanner

__all__ = ["HORIZON_STEPS", "Horizon"]

# Planning runs at most this many steps (and at least 4 windows) ahead of the slowest rank:
# room for prefetching data loaders, never whole epochs that no rank needs yet.
HORIZON_STEPS = 64


class Horizon:
    """The windows ``planner`` may plan, given the positions ``peers`` hold.

    Guarantees: ``check`` refuses every window of an epoch the planner dropped and every
    window more than ``steps`` steps after the job's progress (counted across one epoch
    boundary); it plans nothing itself.

    Args:
        planner: the coordinator's ``DynamicPlanner`` (its scheduler counts the steps).
        peers: the coordinator's table of connections (the job's progress).

    Example::

        >>> horizon = Horizon(planner, peers)
        >>> horizon.check(epoch=0, first=0)  # nothing planned yet: any window of epoch 0
        >>> horizon.epoch_steps(0)
        31
    """

    def __init__(self, planner: DynamicPlanner, peers: Peers) -> None:
        self.planner = planner
        self.peers = peers
        self.steps = max(4 * planner.window, HORIZON_STEPS)

    def __repr__(self) -> str:
        return f"Horizon(steps={self.steps}, window={self.planner.window})"

    def epoch_steps(self, epoch: int | None) -> int:
        """Steps of ``epoch`` (a packed token budget cuts every epoch anew; ``None``: the
        job's current one). A packed epoch outside the horizon is refused first, since
        counting its steps plans it.

        Args:
            epoch: the epoch, or ``None`` for the job's current one.
        """
        scheduler = self.planner.scheduler
        if scheduler.config.packing is None:
            return scheduler.num_steps()
        if epoch is None:
            progress = self.peers.progress()
            return scheduler.num_steps(0 if progress is None else progress[0])
        self.check(epoch, 0, counting=True)
        return scheduler.num_steps(epoch)

    def check(self, epoch: int, first: int, counting: bool = False) -> None:
        """Refuse a window more than ``steps`` steps after the job's progress (or in an
        epoch whose windows were dropped) before anything is planned for it.

        Args:
            epoch: the window's epoch.
            first: the window's first step.
            counting: only the epoch's step count is wanted (the next epoch's is needed to
                place a window in it, so it passes).
        """
        if epoch < self.planner.forgotten:
            raise ProtocolError(
                f"epoch {epoch} was dropped (the job planned epoch {self.planner.forgotten + 1}"
                f"); the static plan serves it",
                code="stale",
            )
        progress = self.peers.progress()
        if progress is None:
            return
        at, step = progress
        if epoch < at or (epoch == at and first <= step + self.steps):
            return
        if epoch == at + 1:
            if counting:
                return  # the next epoch's step count is needed to place it
            ahead = self.planner.scheduler.num_steps(at) - step + first
            if ahead <= self.steps:
                return
        raise ProtocolError(
            f"epoch {epoch} step {first} is more than {self.steps} steps ahead of the job "
            f"(its slowest rank is at epoch {at} step {step}); the static plan serves it",
            code="stale",
        )
