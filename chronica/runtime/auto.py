"""``mode="auto"`` of the gradient shims: the trial of priority scheduling, as a state machine.

Framework-free. A shim measures windows of steps (median step time and CPU seconds per step,
rank 0's values shared with every rank) and feeds them to ``AutoTrial.observe``; the trial
answers which engine to run next (``"bucketed"``: DDP's bucketed all-reduce, ``"scheduled"``:
priority scheduling) and keeps the decision and its reason. The shim only measures and
switches engines, so the three shims decide alike and say why in the same words.

The trial, in order:

1. ``"measure"``: bucketed steps are measured. If the exposed communication could save less
   than ``min_saving`` of the step time (or ``min_saving >= 1``: no schedule saves a whole
   step), the trial settles on bucketed; else scheduling goes on trial.
2. ``"trial"``: scheduled steps are measured. Unless they are at least ``margin`` shorter
   than the bucketed ones, at no more than ``margin`` extra CPU, the trial settles on bucketed.
3. ``"recheck"``: bucketed steps are measured again (the machine's load drifts: one bucketed
   window may be slow by chance). Scheduling is kept only if it also beats this window.
4. ``"settled"``: the decision is final; ``observe`` must not be called again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

__all__ = ["MARGIN", "MEASURE_STEPS", "MODES", "AutoTrial", "Window", "check_mode"]

log = logging.getLogger("chronica")

MEASURE_STEPS = 4  # steps of each engine measured before the trial moves on
MARGIN = 0.02  # scheduling is kept only if its steps are this much shorter (and CPU no dearer)
MODES = ("auto", "scheduled", "bucketed")  # what a gradient shim's ``mode=`` accepts
_WHAT = {"scheduled": "priority scheduling", "bucketed": "bucketed all-reduce"}


def check_mode(mode: object) -> str:
    """``mode`` if it is one of ``MODES``; the error names the choices and what they do.

    Args:
        mode: a gradient shim's ``mode=`` argument.

    Example::

        >>> check_mode("auto")
        'auto'
    """
    if not isinstance(mode, str):
        raise TypeError(f"mode={mode!r} must be a string, one of {MODES}")
    if mode not in MODES:
        raise ValueError(
            f"mode={mode!r} must be one of {MODES}: 'auto' measures the first steps and "
            "schedules only where that can help"
        )
    return mode


@dataclass(frozen=True)
class Window:
    """Rank 0's medians over one window of measured steps (seconds).

    Args:
        step_time: median seconds from one step to the next.
        cpu_time: median process CPU seconds per step.

    Example::

        >>> Window(step_time=0.120, cpu_time=0.110)
        Window(step_time=0.12, cpu_time=0.11)
    """

    step_time: float
    cpu_time: float

    def __post_init__(self) -> None:
        for name in ("step_time", "cpu_time"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}={value!r} must be a number of seconds")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite, non-negative number")


class AutoTrial:
    """Decides once, from measured windows, whether priority scheduling beats bucketed.

    Guarantees: the decision is a pure function of the windows fed in (feed rank 0's
    values on every rank and all ranks switch at the same step); it is made once
    (``settled``), logged once, and ``decision`` says which engine and why, in the words
    every shim shows in ``stats().decision``. While scheduling is on trial ``decision``
    starts with ``"trial: "``; once settled it starts with the engine's name.

    Args:
        min_saving: fraction of the step time (0 to 1) that the exposed communication must
            amount to before scheduling is tried; 1 (or more) never tries it.
        margin: fraction by which scheduled steps must be shorter than bucketed ones (and
            by which their CPU time may exceed the bucketed one) for scheduling to be kept.

    Example::

        >>> trial = AutoTrial(min_saving=0.05)
        >>> trial.observe(Window(0.100, 0.090), saving_bound=0.30)
        'scheduled'
        >>> trial.observe(Window(0.080, 0.090))   # 20% shorter: measure bucketed again
        'bucketed'
        >>> trial.observe(Window(0.101, 0.090))
        'scheduled'
        >>> trial.settled, trial.decision.split(":")[0]
        (True, 'scheduled')
    """

    def __init__(self, min_saving: float = 0.05, margin: float = MARGIN) -> None:
        for name, value in (("min_saving", min_saving), ("margin", margin)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}={value!r} must be a number (a fraction of step time)")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} must be between 0 and 1 (a fraction)")
        self.min_saving = float(min_saving)
        self.margin = float(margin)
        self.phase = "measure"
        self.decision = ""
        self._windows: list[Window] = []

    def __repr__(self) -> str:
        return (
            f"AutoTrial(min_saving={self.min_saving}, margin={self.margin}, "
            f"phase={self.phase!r}, engine={self.engine!r})"
        )

    @property
    def engine(self) -> str:
        """The engine to run now: ``"scheduled"`` on trial or once kept, else ``"bucketed"``."""
        if self.phase == "trial" or (self.phase == "settled" and self.decision[:1] == "s"):
            return "scheduled"
        return "bucketed"

    @property
    def settled(self) -> bool:
        """True once the decision is final."""
        return self.phase == "settled"

    def observe(self, window: Window, saving_bound: float | None = None) -> str:
        """Feed the window just measured with the engine in force; returns the engine to run.

        Args:
            window: rank 0's medians over the window (``Window``).
            saving_bound: in phase ``"measure"`` only: rank 0's ``Exposure.saving_bound`` of
                the bucketed window (the largest fraction of step time scheduling could save).

        Example::

            >>> AutoTrial(min_saving=0.5).observe(Window(0.1, 0.1), saving_bound=0.2)
            'bucketed'
        """
        if not isinstance(window, Window):
            raise TypeError(f"window={window!r} must be a Window(step_time, cpu_time)")
        if self.phase == "settled":
            raise ValueError("the trial is settled: observe() takes no further windows")
        if self.phase == "measure":
            if saving_bound is None:
                raise ValueError("saving_bound is needed for the first (bucketed) window")
            self._start(window, float(saving_bound))
        else:  # "trial" or "recheck"
            self._windows.append(window)
            self._conclude()
        return self.engine

    def _start(self, window: Window, bound: float) -> None:
        # No schedule saves a whole step (its compute stays), so min_saving=1 means never;
        # the measured bound itself can read 100%, being a ratio of two medians.
        if bound < self.min_saving or self.min_saving >= 1.0:
            below = "<" if bound < self.min_saving else "never tried at"
            self._settle(
                "bucketed",
                f"rank 0 measured that priority scheduling would save at most {bound:.1%} of "
                f"step time ({below} min_saving={self.min_saving:.0%})",
            )
            return
        self.decision = (
            f"trial: rank 0 measured that priority scheduling could save up to {bound:.1%} "
            f"of step time (>= min_saving={self.min_saving:.0%}); trying it"
        )
        log.info("chronica gradients: %s", self.decision)
        self._windows = [window]
        self.phase = "trial"

    def _conclude(self) -> None:
        """Keep scheduling only if rank 0's steps got shorter than the bucketed ones measured
        before *and* after it, without costing more CPU: on a machine whose cores compute,
        CPU time is the step's cost, and a wall-clock gain that costs CPU is an artefact of
        what else ran."""
        before, scheduled, *after = self._windows
        measured = (
            f"rank 0 measured {1e3 * scheduled.step_time:.1f} ms per step scheduled against "
            f"{1e3 * before.step_time:.1f} ms bucketed"
            + (f" before and {1e3 * after[0].step_time:.1f} ms after" if after else "")
            + f", CPU {1e3 * scheduled.cpu_time:.1f} against {1e3 * before.cpu_time:.1f} ms"
            + (f" and {1e3 * after[0].cpu_time:.1f} ms" if after else "")
        )
        better = all(
            scheduled.step_time <= w.step_time * (1 - self.margin)
            and scheduled.cpu_time <= w.cpu_time * (1 + self.margin)
            for w in (before, *after)
        )
        if not better:
            self._settle(
                "bucketed",
                measured + f" (scheduling must save {self.margin:.0%} and cost no more CPU)",
            )
        elif after:
            self._settle("scheduled", measured)
        else:
            self.phase = "recheck"  # measure bucketed steps again before keeping it

    def _settle(self, engine: str, why: str) -> None:
        running = self.engine
        self.decision = f"{engine}: {why}"
        self.phase = "settled"
        log.info(
            "chronica gradients: %s; %s %s",
            self.decision,
            "staying with" if engine == running else "switching to",
            _WHAT[engine],
        )
