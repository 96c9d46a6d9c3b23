"""``mode="auto"`` of the gradient shims: a bounded search of the scheduling settings, decided
on the step time the user pays for, agreed by every rank, and watched for drift.

Framework-free. A shim measures windows of steps (median step time, CPU seconds, seconds from
the end of backward to the last reduction and the link's busy time per step), gathers every
rank's window through its process group and feeds the mean (``Window.agreed``, the same
floats on every rank) to ``AutoTrial.observe``. The trial answers which setting to run next
(a ``Candidate``: DDP's bucketed all-reduce, or priority scheduling with a partition size and
a credit) and keeps the decision and its reason. The shim only measures and switches, so the
three shims (torch, TF, JAX) decide alike and say why in the same words.

The trial, in order:

1. ``"measure"``: one bucketed window. If the communication it exposed could save less than
   ``min_saving`` of the step (``Window.saving_bound``: what is exposed, but no more than
   the step time the link leaves to hide it in), bucketed is kept. Where that bound lies
   between half ``min_saving`` and ``min_saving``, a second bucketed window is measured and
   their mean decides: a bucketed decision stands until the communication's share drifts,
   and one window of a few steps near the threshold is a coin's toss.
2. ``"search"``: successive halving over the candidates (``candidates``): every round,
   each candidate gets ``MIN_WINDOWS_KEPT`` windows (one of each in turn), bucketed windows
   interleaved after every second one; a candidate's score is the median, over its windows,
   of its cost over the mean of the bucketed windows beside it. The better half goes on to
   the next round until one is left.
3. The survivor gets windows of its own after the search chose it (``MIN_WINDOWS_KEPT`` at
   first, each beside bucketed ones): the windows that made it the best of several are the
   luckiest of their round, so the fresh ones must on their own save ``margin``. It is
   kept only if that holds and its score over all its windows is below
   ``1 - max(margin, need)``: ``noise`` is how much two neighbouring bucketed windows of
   this same trial differ (the root mean square of their relative differences: the median
   of the few a trial has is often far below the truth), and ``need`` is
   ``CONFIDENCE`` times that noise as the median over more paired windows shrinks it
   (``1.5 * noise * sqrt(2 / windows)``). Where the noise cannot tell, the trial does not
   decide: the survivor and bucketed get as many fresh windows again, interleaved, and it
   is judged anew, up to ``MAX_WINDOWS_KEPT`` fresh windows (the whole trial at most
   ``budget_steps`` steps: 410 for three settings). It stops early only where the
   survivor is hopeless (the median of its fresh windows above ``1 - margin`` by more
   than that noise term over them: the noise's benefit of the doubt does not bring it to
   ``margin``); at the budget, what is not confirmed stays
   bucketed. Simulated (three settings, lognormal window noise of 8%, 200 seeds), none
   faster than bucketed: one kept 16% of the time (harmless: as fast as bucketed); all 5%
   slower (11% noise): 3%; one 6% faster: kept 71% (81% as the only setting); one 15%
   faster: 99%.
4. ``"settled"``: the decision is printed once (WARNING, rank 0) and kept in ``decision``.
   Windows of ``WATCH_STEPS`` then watch the share of the step the communication takes; if
   it moves by more than ``drift`` (or half its value) in ``DRIFT_WINDOWS`` windows in a
   row, the trial starts again from 1 (hysteresis: one odd window changes nothing).

The cost is the step time when compute runs on an accelerator. On CPU-only training the
extra CPU seconds a setting spends per step (its CPU time minus bucketed's) are added to its
step time, less what the process's cores left idle in the bucketed steps (``cores`` times
their step time, minus their CPU time): extra CPU that idle cores absorbed took nothing from
the computation (and its cost, if any, is in the step time already), extra CPU beyond that
is taken from the computation or from whatever else runs on the machine.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BUCKETED",
    "CONFIDENCE",
    "DRIFT",
    "DRIFT_WINDOWS",
    "MARGIN",
    "MAX_WINDOWS_KEPT",
    "MEASURE_STEPS",
    "MIN_WINDOWS_KEPT",
    "MODES",
    "WATCH_STEPS",
    "AutoTrial",
    "Candidate",
    "Window",
    "candidates",
    "check_mode",
    "usable_cores",
]

log = logging.getLogger("chronica")

MEASURE_STEPS = 4  # measured steps per window while deciding (after one unmeasured step)
WATCH_STEPS = 32  # steps per window once settled, watching for drift
MARGIN = 0.02  # a setting is kept only if it costs at least this much less than bucketed
DRIFT = 0.05  # change of the communication's share of the step that counts as drift
DRIFT_WINDOWS = 2  # drifted watch windows in a row before the trial starts again
MODES = ("auto", "scheduled", "bucketed")  # what a gradient shim's ``mode=`` accepts
_KIB = 1 << 10
_PARTITIONS = (256 * _KIB, 1024 * _KIB, 4096 * _KIB)  # the search's partition sizes
_CREDIT_FACTOR = 4  # credit = this many partitions in flight
MIN_WINDOWS_KEPT = 2  # fresh windows of the search's survivor its decision rests on, at least
MAX_WINDOWS_KEPT = 32  # ... and at most, where the noise leaves the first ones undecided
CONFIDENCE = 1.5  # a kept setting saves this many times the noise of its median, at least


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


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it).

    Example::

        >>> usable_cores() >= 1
        True
    """
    affinity = getattr(os, "sched_getaffinity", None)
    return max(1, len(affinity(0)) if affinity is not None else os.cpu_count() or 1)


def _size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that divides it (MiB, KiB or bytes)."""
    for unit, name in ((1 << 20, "MiB"), (_KIB, "KiB")):
        if nbytes >= unit and not nbytes % unit:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class Candidate:
    """One setting ``mode="auto"`` can run: bucketed, or scheduled with its knobs.

    Args:
        engine: ``"bucketed"`` (DDP's buckets) or ``"scheduled"`` (priority scheduling).
        partition_bytes: the partition size when scheduled (0 when bucketed).
        credit_bytes: the credit when scheduled (0 when bucketed).

    Example::

        >>> str(Candidate("scheduled", 256 << 10, 1 << 20))
        'scheduled (256 KiB partitions, 1 MiB credit)'
    """

    engine: str
    partition_bytes: int = 0
    credit_bytes: int = 0

    def __post_init__(self) -> None:
        if self.engine not in ("bucketed", "scheduled"):
            raise ValueError(f"engine={self.engine!r} must be 'bucketed' or 'scheduled'")
        if self.engine == "scheduled" and min(self.partition_bytes, self.credit_bytes) < 1:
            raise ValueError("a scheduled candidate needs partition_bytes and credit_bytes >= 1")

    def __str__(self) -> str:
        if self.engine == "bucketed":
            return "bucketed"
        return (
            f"scheduled ({_size(self.partition_bytes)} partitions, "
            f"{_size(self.credit_bytes)} credit)"
        )


BUCKETED = Candidate("bucketed")


def candidates(total_bytes: int, partition_bytes: int, credit_bytes: int) -> list[Candidate]:
    """The scheduled settings the search tries for ``total_bytes`` of gradients: partitions of
    256 KiB, 1 MiB and 4 MiB (no bigger than all the gradients) with a credit of four
    partitions, and the configured ``(partition_bytes, credit_bytes)``, without repeats.

    Args:
        total_bytes: the gradients' bytes.
        partition_bytes: the configured partition size.
        credit_bytes: the configured credit.

    Example::

        >>> [str(c) for c in candidates(8 << 20, 1 << 20, 4 << 20)][0]
        'scheduled (256 KiB partitions, 1 MiB credit)'
    """
    if min(total_bytes, partition_bytes, credit_bytes) < 1:
        raise ValueError("total_bytes, partition_bytes and credit_bytes must be >= 1")
    found: list[Candidate] = []
    for p in _PARTITIONS:
        p = min(p, int(total_bytes))
        found.append(Candidate("scheduled", p, _CREDIT_FACTOR * p))
    found.append(Candidate("scheduled", int(partition_bytes), int(credit_bytes)))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Window:
    """Medians over one window of measured steps (seconds), agreed over the ranks.

    Args:
        step_time: median seconds from one step to the next.
        cpu_time: median process CPU seconds per step (0 where not measured).
        after_backward: median seconds from the end of backward to the last reduction.
        link_busy: median seconds per step the link was busy (0 where unknown).

    Example::

        >>> Window(0.120, 0.110)
        Window(step_time=0.12, cpu_time=0.11, after_backward=0.0, link_busy=0.0)
    """

    step_time: float
    cpu_time: float = 0.0
    after_backward: float = 0.0
    link_busy: float = 0.0

    def __post_init__(self) -> None:
        for name in ("step_time", "cpu_time", "after_backward", "link_busy"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}={value!r} must be a number of seconds")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite, non-negative number")

    def values(self) -> list[float]:
        """The four numbers, in field order, to send to the other ranks."""
        return [self.step_time, self.cpu_time, self.after_backward, self.link_busy]

    @classmethod
    def agreed(cls, rows: Sequence[Sequence[float]] | np.ndarray) -> Window:
        """The mean over ranks of every rank's ``values()`` (one row per rank, in rank order):
        the same rows give the same floats, so every rank that gathered them decides alike.

        Args:
            rows: every rank's ``values()``, rank 0 first.

        Example::

            >>> Window.agreed([[0.1, 0.1, 0.0, 0.0], [0.3, 0.1, 0.0, 0.0]]).step_time
            0.2
        """
        table = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        mean = [float(math.fsum(col) / len(col)) for col in table.T.tolist()]
        return cls(*(max(0.0, v) if math.isfinite(v) else 0.0 for v in mean))

    @property
    def comm_share(self) -> float:
        """The share of the step from the end of backward to the last reduction."""
        return min(1.0, self.after_backward / self.step_time) if self.step_time > 0 else 0.0

    @property
    def saving_bound(self) -> float:
        """Of a bucketed window: the largest share of the step scheduling could save. It can
        hide no more than what is exposed after backward, and the step can get no shorter
        than the time the link needs per step (``link_busy``, where measured)."""
        if self.step_time <= 0:
            return 0.0
        room = self.step_time - self.link_busy if self.link_busy > 0 else self.step_time
        return max(0.0, min(self.after_backward, room)) / self.step_time


class AutoTrial:
    """Searches the scheduling settings, decides on the step time the user pays for, and
    re-decides when the communication's share of the step drifts.

    Guarantees: the decision is a pure function of the windows fed in (feed ``Window.agreed``
    rows on every rank and every rank switches at the same step to the same setting); each
    decision is printed once (WARNING on the ``chronica`` logger, where ``announce``) and
    kept in ``decision``, which starts with the engine's name once settled and with
    ``"trial: "`` while deciding. ``current`` is the setting to run now; ``generation``
    counts the times the trial was reopened (a shim starts a fresh window when it changes).

    Args:
        settings: the scheduled candidates to search (``candidates(...)``), best guess first.
        min_saving: the share of the step (0 to 1) the bucketed window's ``saving_bound`` must
            reach before the search runs; 1 never searches (and never watches).
        accelerator: compute runs on an accelerator: decide on step time alone (else the
            extra CPU a setting spends beyond the cores' idle time is added to its step time).
        cores: the cores the process may use, for that idle time (default
            ``usable_cores()``).
        margin: the least share of the cost a setting must save to be kept.
        drift: the change of the communication's share of the step that starts the trial
            again (or half that share, whichever is larger).
        announce: print each decision (rank 0 only, so it shows once per job).

    Example::

        >>> trial = AutoTrial([Candidate("scheduled", 1024, 4096)], accelerator=True)
        >>> str(trial.observe(Window(0.100, after_backward=0.04)))   # bucketed: 40% exposed
        'scheduled (1 KiB partitions, 4 KiB credit)'
        >>> for t in (0.080, 0.100, 0.080, 0.100):
        ...     current = trial.observe(Window(t))
        >>> trial.settled, trial.decision.split(":")[0]
        (True, 'scheduled')
    """

    def __init__(
        self,
        settings: Sequence[Candidate],
        min_saving: float = 0.05,
        *,
        accelerator: bool = False,
        cores: int | None = None,
        margin: float = MARGIN,
        drift: float = DRIFT,
        announce: bool = True,
    ) -> None:
        settings = list(settings)
        if not settings or not all(
            isinstance(c, Candidate) and c.engine == "scheduled" for c in settings
        ):
            raise TypeError("settings must be a non-empty list of scheduled Candidate")
        for name, value in (("min_saving", min_saving), ("margin", margin), ("drift", drift)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}={value!r} must be a number (a fraction of step time)")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} must be between 0 and 1 (a fraction)")
        self.settings = settings
        self.min_saving = float(min_saving)
        self.accelerator = bool(accelerator)
        cores = usable_cores() if cores is None else cores
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"cores={cores!r} must be an int >= 1 (the cores the process uses)")
        self.cores = cores
        self.margin = float(margin)
        self.drift = float(drift)
        self.announce = bool(announce)
        self.decision = ""
        self.decisions = 0  # how many times the trial settled
        self.generation = -1  # how many times the trial was reopened
        self._start()

    def __repr__(self) -> str:
        return (
            f"AutoTrial(settings={len(self.settings)}, min_saving={self.min_saving}, "
            f"accelerator={self.accelerator}, margin={self.margin}, phase={self.phase!r}, "
            f"current='{self.current}')"
        )

    @property
    def engine(self) -> str:
        """The engine of ``current``: ``"bucketed"`` or ``"scheduled"``."""
        return self.current.engine

    @property
    def settled(self) -> bool:
        """True while a decision is in force (the watch windows may still re-open it)."""
        return self.phase == "settled"

    @property
    def window_steps(self) -> int:
        """Measured steps the next window needs (0: no more windows, ever)."""
        if self.settled:
            return WATCH_STEPS if self.min_saving < 1.0 else 0
        return MEASURE_STEPS

    @property
    def budget_steps(self) -> int:
        """The most steps one trial can take, from its first window to its decision: two
        bucketed windows, the search's rounds (``MIN_WINDOWS_KEPT`` windows of each survivor
        and a bucketed one after every second, per round) and ``MAX_WINDOWS_KEPT`` windows of
        the last survivor beside as many bucketed ones, each window ``MEASURE_STEPS`` steps
        after an unmeasured one. A setting no better than bucketed costs nothing by running
        that long; one clearly worse is dropped early.

        Example::

            >>> AutoTrial([Candidate("scheduled", 1, 4)] * 3).budget_steps
            410
        """
        windows, left = 2 + 2 * MAX_WINDOWS_KEPT, len(self.settings)
        while left > 1:
            windows += MIN_WINDOWS_KEPT * (left + (left + 1) // 2)
            left = (left + 1) // 2
        return windows * (MEASURE_STEPS + 1)

    @property
    def measuring_cpu(self) -> bool:
        """Whether the next window needs the CPU time (while deciding, on CPU-only training)."""
        return not self.settled and not self.accelerator

    def observe(self, window: Window) -> Candidate:
        """Feed the window just measured with ``current``; returns the setting to run next.

        Args:
            window: the agreed medians over the window (``Window.agreed``).

        Example::

            >>> AutoTrial([Candidate("scheduled", 1, 4)], 0.5).observe(Window(0.1))
            Candidate(engine='bucketed', partition_bytes=0, credit_bytes=0)
        """
        if not isinstance(window, Window):
            raise TypeError(f"window={window!r} must be a Window(step_time, ...)")
        if not self.window_steps:
            raise ValueError("the trial is settled for good (min_saving >= 1): no more windows")
        if self.phase == "measure":
            self._measured(window)
        elif self.phase == "search":
            self._searched(window)
        else:
            self._watched(window)
        return self.current

    # -- phases ---------------------------------------------------------------------------

    def _start(self) -> None:
        self.generation += 1  # a shim that sees it change starts a fresh window
        self.phase = "measure"
        self.current = BUCKETED
        self._log: list[tuple[Candidate, Window]] = []
        self._queue: list[Candidate] = []
        self._round: list[Candidate] = []
        self._judged_from = 0  # the survivor's windows from this index of _log on count
        self._reference: float | None = None
        self._drifted = 0

    def _measured(self, window: Window) -> None:
        self._log.append((BUCKETED, window))
        bound = float(np.mean([w.saving_bound for _, w in self._log]))
        near = self.min_saving / 2 <= bound < self.min_saving < 1.0
        if near and len(self._log) < 2:
            return  # one window near the threshold does not decide: measure another
        if bound < self.min_saving or self.min_saving >= 1.0:
            below = "<" if bound < self.min_saving else "never searched at"
            over = f" (mean of {len(self._log)} windows)" if len(self._log) > 1 else ""
            self._settle(
                BUCKETED,
                f"the ranks measured that priority scheduling would save at most {bound:.1%} "
                f"of step time{over} ({below} min_saving={self.min_saving:.0%})",
            )
            return
        self.phase = "search"
        self.decision = (
            f"trial: the ranks measured that priority scheduling could save up to {bound:.1%} "
            f"of step time (>= min_saving={self.min_saving:.0%}); searching "
            f"{len(self.settings)} settings"
        )
        log.info("chronica gradients: %s", self.decision)
        self._next_round(self.settings)

    def _next_round(self, survivors: list[Candidate]) -> None:
        """Queue a window of each survivor, a bucketed window after every second one; a
        last survivor gets fresh windows (from the first time it is alone) until it has
        ``MIN_WINDOWS_KEPT``, else it is judged."""
        if len(survivors) == 1 and len(self._round) != 1:
            self._judged_from = len(self._log)  # the search's windows chose it: fresh ones
        self._round = survivors
        queue: list[Candidate] = []
        if len(survivors) == 1:
            best = survivors[0]
            missing = MIN_WINDOWS_KEPT - len(self._ratios(best, self._judged_from))
            if missing <= 0:
                more = self._conclude(best)
                if not more:
                    return
                missing = more
            queue = [best, BUCKETED] * missing
        # every round, each survivor gets MIN_WINDOWS_KEPT windows (interleaved, one of each
        # in turn): a setting's score over its windows so far decides the halving
        for _ in range(MIN_WINDOWS_KEPT if len(survivors) > 1 else 0):
            for k, c in enumerate(survivors):
                queue.append(c)
                if k % 2 == 1 or k == len(survivors) - 1:
                    queue.append(BUCKETED)
        self._queue = queue
        self.current = self._queue.pop(0)

    def _searched(self, window: Window) -> None:
        self._log.append((self.current, window))
        if self._queue:
            self.current = self._queue.pop(0)
            return
        ranked = sorted(self._round, key=lambda c: (self._score(c), self._round.index(c)))
        self._next_round(ranked[: (len(ranked) + 1) // 2])

    def _ratios(self, candidate: Candidate, start: int = 0) -> list[float]:
        """Each window of ``candidate`` from ``_log[start]`` on: its cost over the mean of the
        bucketed windows just before and just after it (CPU counted against it on CPU-only
        training)."""
        ratios = []
        log_ = self._log
        for i, (c, w) in enumerate(log_):
            if c != candidate or i < start:
                continue
            before = next((b for cb, b in reversed(log_[:i]) if cb == BUCKETED), None)
            after = next((b for cb, b in log_[i + 1 :] if cb == BUCKETED), None)
            near = [b for b in (before, after) if b is not None]
            step = sum(b.step_time for b in near) / len(near)
            cpu = sum(b.cpu_time for b in near) / len(near)
            idle = max(0.0, self.cores * step - cpu)
            extra = 0.0 if self.accelerator else max(0.0, w.cpu_time - cpu - idle)
            ratios.append((w.step_time + extra) / step if step > 0 else 1.0)
        return ratios

    def _score(self, candidate: Candidate) -> float:
        return float(np.median(self._ratios(candidate)))

    def _noise(self) -> float:
        """Root mean square of the relative differences of neighbouring bucketed windows of
        this trial (not their median: of the few differences a trial has, the median is
        often far below the truth, and a decision trusted it)."""
        steps = [w.step_time for c, w in self._log if c == BUCKETED]
        diffs = [b / a - 1 for a, b in itertools.pairwise(steps) if a > 0]
        return float(np.sqrt(np.mean(np.square(diffs)))) if diffs else 0.0

    def _conclude(self, best: Candidate) -> int:
        """Keep ``best`` or bucketed, or (0 returned where decided) how many more windows of
        ``best`` beside bucketed ones the noise asks for before deciding. Its score is the
        median over all its windows; the median over those after the search (``fresh``)
        must also save ``margin``: the search's windows chose it, the fresh ones test it."""
        ratios, noise = self._ratios(best), self._noise()
        fresh = self._ratios(best, self._judged_from)
        spread = CONFIDENCE * noise * math.sqrt(2 / len(ratios))
        need = max(self.margin, spread)
        score, tested = float(np.median(ratios)), float(np.median(fresh))
        beaten = score <= 1.0 - need and tested <= 1.0 - self.margin
        # hopeless: on the fresh windows (the search's chose it), even the noise's benefit
        # of the doubt leaves it short of the margin
        doubt = CONFIDENCE * noise * math.sqrt(2 / len(fresh))
        hopeless = tested > 1.0 - self.margin + doubt
        if not beaten and not hopeless and len(fresh) < MAX_WINDOWS_KEPT:
            return min(len(fresh), MAX_WINDOWS_KEPT - len(fresh))  # the noise cannot tell
        basis = "step time" if self.accelerator else "step time, extra CPU beyond idle counted"
        searched = len(self.settings)
        chosen = (
            f", {len(fresh)} of them after the search at {tested:.3f}x; the best of "
            f"{searched} settings searched"
            if searched > 1
            else ""
        )
        measured = (
            f"cost {score:.3f}x bucketed ({basis}, median of {len(ratios)} windows beside "
            f"bucketed ones{chosen}; noise between bucketed windows {noise:.1%}, {need:.1%} "
            f"over {len(ratios)} windows)"
        )
        if beaten:
            self._settle(best, f"{best} {measured}")
        else:
            after = f", and {self.margin:.1%} after the search" if searched > 1 else ""
            self._settle(
                BUCKETED, f"the best, {best}, {measured}: it must save more than {need:.1%}{after}"
            )
        return 0

    def _settle(self, chosen: Candidate, why: str) -> None:
        previous = self.decision if self.decisions else ""
        self.current = chosen
        self.phase = "settled"
        self.decision = f"{chosen.engine}: {why}"
        self.decisions += 1
        self._reference, self._drifted = None, 0
        if self.announce:
            again = "re-decided" if previous else "decided"
            log.warning(
                "chronica gradients: mode='auto' %s for every rank: %s", again, self.decision
            )

    def reopen(self, why: str) -> None:
        """Start the trial again from a bucketed window (the watch does so on drift; a job
        that knows its link changed may too, on every rank at the same step).

        Args:
            why: the reason, kept in ``decision`` while the trial runs.

        Example::

            >>> trial = AutoTrial([Candidate("scheduled", 1, 4)], 0.5)
            >>> trial.reopen("the link changed"); trial.phase, trial.decision
            ('measure', 'trial: the link changed')
        """
        if not isinstance(why, str):
            raise TypeError(f"why={why!r} must be a string (the reason)")
        self._start()
        self.decision = f"trial: {why}"
        log.info("chronica gradients: %s", self.decision)

    def _watched(self, window: Window) -> None:
        share = window.comm_share
        if self._reference is None:
            self._reference = share
            return
        limit = max(self.drift, 0.5 * self._reference)
        self._drifted = self._drifted + 1 if abs(share - self._reference) > limit else 0
        if self._drifted >= DRIFT_WINDOWS:
            self.reopen(
                f"communication took {share:.1%} of the step for {DRIFT_WINDOWS} windows "
                f"against {self._reference:.1%} when decided; measuring again"
            )
