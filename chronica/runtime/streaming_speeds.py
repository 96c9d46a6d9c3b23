"""``StreamSpeeds``: measured rank speeds for a ``kind="dynamic"`` stream, so that a slower
rank gets less work in later windows.

The measurement and its smoothing are the map-style packed dynamic mode's
(``chronica.core.calibration.CostCalibration``): a rank reports its own compute time of a
step (``report(seconds)``: forward and backward, before the gradient all-reduce), which is
kept with that step's work on the rank ``(documents, tokens, squared tokens)``; the fit of
a cost model shared by the ranks times each rank's slowness gives the speeds that
``plan_window`` plans with (``chronica.plan_step``'s ``speeds``: faster ranks get more
cost, every micro-batch stays under the cap, every rank runs the same count).

How the reports travel, deterministically: the reports a rank received before its
consumer took window ``k`` (its *hand-off* ``k + 2``) ride in the all-gather that builds
window ``k + 2`` (the planning thread builds that one once window ``k + 1`` is queued, so it
never waits for it); every rank feeds every rank's reports, in rank order, to the same
calibration, so every rank plans with the same speeds. A training loop reports each step
before taking the next window's first micro-batch or not, always in the same order, so an
uninterrupted run and a resumed one exchange the same reports.

The state: the window's speeds and the exchanged reports are global
(``StreamState.speeds``, ``StreamState.reports``); the hand-offs not exchanged yet and the
reports since the last one are the rank's own (``rank_state()``, under ``"reports_due"`` of
the rank's ``state_dict()``): a rank that resumes from its own state exchanges exactly what
the uninterrupted run did, so the resumed run plans the same windows bitwise. Another
rank's state, or another world size, starts those empty (the plan keeps exactly-once and
equal counts; the speeds follow the reports from there).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from chronica.core import ScheduleConfig
from chronica.core.calibration import CostCalibration
from chronica.core.modes import DYNAMIC
from chronica.core.streaming import StreamState, WindowPlan

__all__ = ["StreamSpeeds"]

_WAIT = 0.1  # seconds between looks at the stop signal while waiting for a hand-off


class StreamSpeeds:
    """One rank's side of a dynamic stream's speed measurement (see the module docstring);
    inactive (no reports kept, none awaited, no speeds) unless ``config.kind`` is
    ``"dynamic"``.

    Args:
        config: the plan (its ``kind``, ``cost`` the prior, ``controller.history`` the
            reports kept per rank).
        rank: this rank.
        start: the stream state the engine starts from.
        saved: the ``state_dict()`` it was resumed from (its ``"reports_due"``), or ``None``.

    Example::

        speeds = StreamSpeeds(config, rank, start, None)
        speeds.report(0.12)  # this rank's compute time of the step last served
    """

    def __init__(
        self, config: ScheduleConfig, rank: int, start: StreamState, saved: dict[str, Any] | None
    ) -> None:
        self.active = config.mode == DYNAMIC
        self.rank = rank
        self._history = config.controller.history
        self._calibration = CostCalibration(start.world_size, config.cost, self._history)
        for row in start.reports.tolist():
            self._calibration.observe(int(row[0]), np.array(row[1:4]), row[4])
        self._features: dict[int, np.ndarray] = {}
        self._last_step = -1
        self._first = -1
        self._pending: list[list[float]] = []
        saved = saved or {}
        due = saved.get("reports_due") or {}
        same = due.get("rank") == rank and saved.get("world_size") == start.world_size
        following = start.sequence + 1
        self._handoffs: dict[int, list[list[float]]] = {
            following: [],
            following + 1: [],
        }
        if same:
            self._handoffs.update({int(k): list(v) for k, v in due.get("handoffs", [])})
            self._pending = [list(r) for r in due.get("pending", [])]
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"StreamSpeeds(rank={self.rank}, active={self.active}, history={self._history})"

    def report(self, seconds: float, step: int | None = None) -> None:
        """This rank computed ``step`` (default: the step of the micro-batch last served)
        in ``seconds``; a step this rank has no work in, one reported before, or one no
        longer served is ignored.

        Args:
            seconds: the rank's own compute time of the step.
            step: the global step, or ``None``.
        """
        if not self.active:
            return
        with self._changed:
            key = self._last_step if step is None else int(step)
            work = self._features.pop(key, None)
            if work is not None and work.any():
                self._pending.append([float(key), *work.tolist(), float(seconds)])

    def served(self, step: int) -> None:
        """The consumer serves a micro-batch of ``step`` (the default of ``report``).

        Args:
            step: the global step.
        """
        self._last_step = step

    def taken(self, state: StreamState, plan: WindowPlan, resumed: bool) -> None:
        """The consumer took the window of ``state`` (planned as ``plan``): its steps' work
        on this rank becomes reportable, and the reports so far become the hand-off of the
        window two later (not for the window a resume starts inside: that hand-off was made
        before the state was saved).

        Args:
            state: the window's state.
            plan: its plan.
            resumed: the window is the one a resume starts inside.
        """
        if not self.active:
            return
        with self._changed:
            # The window before stays reportable for one window (a loop that reports a
            # step after taking the next micro-batch).
            kept = {k: v for k, v in self._features.items() if k >= self._first}
            self._first = state.step
            self._features = kept | {
                state.step + i: _work(s.lengths[s.rank == self.rank])
                for i, s in enumerate(plan.steps)
            }
            if not resumed:
                self._handoffs[state.sequence + 2] = self._pending
                self._pending = []
            for key in [k for k in self._handoffs if k <= state.sequence]:
                del self._handoffs[key]
            self._changed.notify_all()

    def due(self, sequence: int, stop: threading.Event) -> list[list[float]]:
        """The reports this rank sends in the all-gather of window ``sequence``: its
        hand-off, waited for (the consumer makes it when it takes window ``sequence - 2``),
        unless the planning thread is stopping (then none).

        Args:
            sequence: the window being built.
            stop: the planning thread's stop signal.
        """
        if not self.active:
            return []
        with self._changed:
            while sequence not in self._handoffs and sequence >= 2:
                if stop.is_set():
                    return []
                self._changed.wait(_WAIT)
            return list(self._handoffs.get(sequence, []))

    def absorb(self, state: StreamState, sent: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's reports of one all-gather (``sent[r]``, rank order) fed to the
        calibration: the speeds to plan the window with and the reports kept, after
        ``state``'s (the window before).

        Args:
            state: the state of the window before.
            sent: what each rank sent (``due``).
        """
        if not self.active:
            return np.zeros(0), np.zeros((0, 5))
        rows = [state.reports]
        for r, reports in enumerate(sent):
            for step, n, tokens, squares, seconds in reports:
                del step  # kept for the rank's own records; the fit needs the work
                self._calibration.observe(r, np.array([n, tokens, squares]), seconds)
                rows.append(np.array([[r, n, tokens, squares, seconds]], np.float64))
        reports = np.concatenate(rows)
        ranks = reports[:, 0]
        keep = np.zeros(reports.shape[0], bool)
        for r in np.unique(ranks):
            keep[np.flatnonzero(ranks == r)[-self._history :]] = True
        return self._calibration.speeds(), reports[keep]

    def rank_state(self) -> dict[str, Any]:
        """This rank's reports not exchanged yet (``{}`` unless active): the hand-offs still
        to travel and the reports since the last one, as plain lists."""
        if not self.active:
            return {}
        with self._changed:
            handoffs = [[k, list(v)] for k, v in sorted(self._handoffs.items())]
            return {
                "reports_due": {
                    "rank": self.rank,
                    "handoffs": handoffs,
                    "pending": list(self._pending),
                }
            }


def _work(lengths: np.ndarray) -> np.ndarray:
    """``(documents, tokens, squared tokens)`` of a rank's samples in a step."""
    values = lengths.astype(np.float64)
    return np.array([float(values.shape[0]), values.sum(), (values**2).sum()])
