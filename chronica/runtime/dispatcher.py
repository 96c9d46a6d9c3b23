"""The gradient dispatcher: threads that issue partitions in order under credit, the knobs
(arguments or ``CHRONICA_*`` environment variables) and an auto-tuner; the Chrome-trace
timeline it writes is ``chronica.runtime.timeline``.

Framework-free: an adapter passes in ``start(partition) -> handle`` (begin an asynchronous
all-reduce of that partition's bytes) and ``wait(partition, handle)`` (block until it is done
and the result is written back). Two threads run per dispatcher: one *issues* partitions in the
order of its ``GradientQueue`` (so collectives are issued from one thread, in one sequence,
on every rank), the other *waits* for them in issue order, returns their credit and calls
``on_complete(partition)``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chronica.core.checks import is_int
from chronica.core.priority import GradientQueue
from chronica.runtime.timeline import Timeline

__all__ = ["AutoTuner", "Dispatcher", "SchedulingOptions", "StepStats"]

log = logging.getLogger("chronica")

ORDERS = ("priority", "fifo")
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _parse_bytes(name: str, value: Any) -> int:
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("ib").removesuffix("b")
        unit = text[-1:] if text[-1:] in _SUFFIX else ""
        try:
            value = int(float(text[: len(text) - len(unit)]) * _SUFFIX[unit])
        except ValueError:
            raise ValueError(
                f"{name}={value!r} is not a byte count (e.g. 1048576 or 1MiB)"
            ) from None
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number of bytes")
    return int(value)


@dataclass(frozen=True)
class SchedulingOptions:
    """Knobs of gradient-priority scheduling; ``resolve`` fills unset ones from the environment.

    ``partition_bytes`` cuts large tensors and fuses small ones (``CHRONICA_PARTITION_BYTES``);
    ``credit_bytes`` bounds bytes in flight (``CHRONICA_CREDIT_BYTES``); ``order`` is
    ``"priority"`` (ByteScheduler) or ``"fifo"`` (backward order, still crossing the
    iteration barrier); ``auto_tune`` searches partition and credit online from measured step
    time (``CHRONICA_AUTOTUNE=1``); ``timeline`` is a Chrome-trace path (``CHRONICA_TIMELINE``;
    ``{rank}`` in it is replaced, else ``.rank<r>`` is inserted before the suffix when there
    is more than one rank).

    Args:
        partition_bytes: partition size in bytes (``"1MiB"`` accepted).
        credit_bytes: bytes in flight at most, plus one partition.
        order: ``"priority"`` or ``"fifo"``.
        auto_tune: search partition and credit sizes online.
        timeline: Chrome-trace path, or ``None``.

    Example::

        >>> SchedulingOptions.resolve(partition_bytes="256k").partition_bytes
        262144
    """

    partition_bytes: int = 1 << 20
    credit_bytes: int = 4 << 20
    order: str = "priority"
    auto_tune: bool = False
    timeline: str | None = None

    def __post_init__(self) -> None:
        _parse_bytes("partition_bytes", self.partition_bytes)
        _parse_bytes("credit_bytes", self.credit_bytes)
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} must be one of {ORDERS}")

    @classmethod
    def resolve(
        cls,
        partition_bytes: int | str | None = None,
        credit_bytes: int | str | None = None,
        order: str | None = None,
        auto_tune: bool | None = None,
        timeline: str | None = None,
    ) -> SchedulingOptions:
        """Arguments win; unset ones come from ``CHRONICA_*`` variables, then the defaults.

        Args:
            partition_bytes: partition size, or ``None`` for ``CHRONICA_PARTITION_BYTES``/default.
            credit_bytes: credit, or ``None`` for ``CHRONICA_CREDIT_BYTES``/default.
            order: ``"priority"``/``"fifo"``, or ``None`` for the default.
            auto_tune: or ``None`` for ``CHRONICA_AUTOTUNE``.
            timeline: path, or ``None`` for ``CHRONICA_TIMELINE``.

        Example::

            >>> SchedulingOptions.resolve(credit_bytes="1k").credit_bytes   # doctest: +SKIP
            1024
        """
        env = os.environ
        default = cls()

        def pick(value: Any, variable: str, fallback: int) -> Any:
            # An explicit 0 must reach validation and fail, not turn into the default.
            if value is not None:
                return value
            return env.get(variable) or fallback

        part = pick(partition_bytes, "CHRONICA_PARTITION_BYTES", default.partition_bytes)
        credit = pick(credit_bytes, "CHRONICA_CREDIT_BYTES", default.credit_bytes)
        if auto_tune is None:
            auto_tune = env.get("CHRONICA_AUTOTUNE", "0").lower() in ("1", "true", "yes")
        return cls(
            partition_bytes=_parse_bytes("partition_bytes", part),
            credit_bytes=_parse_bytes("credit_bytes", credit),
            order=order or default.order,
            auto_tune=bool(auto_tune),
            timeline=timeline or env.get("CHRONICA_TIMELINE") or None,
        )

    def with_knobs(self, partition_bytes: int, credit_bytes: int) -> SchedulingOptions:
        return replace(self, partition_bytes=int(partition_bytes), credit_bytes=int(credit_bytes))


@dataclass(frozen=True)
class StepStats:
    """What one step's communication looked like on this rank.

    ``tensor_ready``: seconds from the first gradient ready to each tensor's (NaN if never);
    ``bytes_per_second``: bytes reduced over the time at least one partition was in flight.

    The same options with other partition and credit sizes.

    Args:
        partition_bytes: the new partition size.
        credit_bytes: the new credit.

    Example::

        >>> SchedulingOptions().with_knobs(4096, 8192).credit_bytes
        8192

    Args:
        tensor_ready: per tensor, seconds after the first one was ready.
        bytes_per_second: the measured rate.

    Example::

        >>> dispatcher.stats().bytes_per_second   # doctest: +SKIP
        1.2e9
    """

    tensor_ready: np.ndarray
    bytes_per_second: float


class Dispatcher:
    """Issues one ``GradientQueue`` per step through ``start``/``wait`` on two threads.

    Guarantees: partitions are started in the queue's order, from one thread; ``on_complete``
    runs once per partition, in start order, after its ``wait`` returned; ``wait_all`` returns
    after every partition of the current step completed and re-raises the first error of a
    dispatcher thread, and ``on_failure`` (if given) runs once, on the failing thread, so a
    caller blocked on its own condition can wake and see ``failed``. ``ready`` is cheap and
    may be called from any thread.

    Args:
        start: ``start(partition) -> handle`` begins an asynchronous reduction.
        wait: ``wait(partition, handle)`` blocks until it is done and written back.
        on_complete: ``on_complete(partition)`` after each ``wait``, in start order.
        timeline: where queue and communication spans go, or ``None``.
        on_failure: called once, on the failing thread, when a dispatcher thread fails.

    Example::

        >>> dispatcher = Dispatcher(start, wait, on_complete)   # doctest: +SKIP
        >>> dispatcher.begin(queue); dispatcher.ready(0); dispatcher.wait_all()   # doctest: +SKIP
    """

    def __init__(
        self,
        start: Callable[[int], Any],
        wait: Callable[[int, Any], None],
        on_complete: Callable[[int], None],
        timeline: Timeline | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self._start, self._wait, self._on_complete = start, wait, on_complete
        self._on_failure = on_failure
        self._timeline = timeline
        self._names: Sequence[str] | None = None
        self.issued: list[int] = []
        self.max_in_flight = 0
        self._cond = threading.Condition()
        self._flight: deque[tuple[int, Any, float]] = deque()
        self._queue: GradientQueue | None = None
        self._remaining = 0
        self._error: BaseException | None = None
        self._closed = False
        self._ready_at: np.ndarray = np.zeros(0)
        self._part_ready: dict[int, float] = {}
        self._busy: list[tuple[float, float, int]] = []
        self._threads = [
            threading.Thread(target=self._guard(self._issue_loop), name="chronica-issue"),
            threading.Thread(target=self._guard(self._complete_loop), name="chronica-complete"),
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def begin(self, queue: GradientQueue, names: Sequence[str] | None = None) -> None:
        """Start a step with ``queue`` (reset); the previous step must have completed.

        ``names`` label the partitions on the timeline.

        Args:
            queue: the step's ``GradientQueue`` (reset here).
            names: partition labels for the timeline, or ``None``.

        Example::

            >>> dispatcher.begin(queue, record.labels)   # doctest: +SKIP
        """
        with self._cond:
            self._raise_if_failed()
            if self._remaining:
                raise RuntimeError("begin() while the previous step is still in flight")
            queue.reset()
            self._queue = queue
            self._names = names
            self.issued = []
            self._remaining = queue.layout.num_partitions
            self._ready_at = np.full(queue.layout.num_tensors, np.nan)
            self._part_ready.clear()
            self._busy = []

    def ready(self, tensor: int) -> None:
        """``tensor``'s gradient is final for this step.

        Args:
            tensor: the tensor's index in the layout.

        Example::

            >>> dispatcher.ready(3)   # doctest: +SKIP
        """
        now = time.perf_counter()
        with self._cond:
            self._ready_at[tensor] = now
            # begin() set the queue: before it, _ready_at is empty and the line above raised.
            assert self._queue is not None
            became = self._queue.mark_ready(tensor)
            for p in became:
                self._part_ready[p] = now
            if became:  # only then can the issue thread move on
                self._cond.notify_all()

    def wait_all(self) -> None:
        """Block until every partition of the current step has completed."""
        with self._cond:
            self._cond.wait_for(lambda: self._remaining == 0 or self._error is not None)
            self._raise_if_failed()

    @property
    def failed(self) -> bool:
        """True once a dispatcher thread failed (``wait_all`` re-raises its error)."""
        return self._error is not None

    def stats(self) -> StepStats:
        """Statistics of the current (or last completed) step."""
        with self._cond:
            ready = (
                self._ready_at - np.nanmin(self._ready_at)
                if self._ready_at.size
                else self._ready_at
            )
            busy = sorted(self._busy)
        covered, end, total = 0.0, -np.inf, 0
        for a, b, nbytes in busy:
            covered += max(0.0, b - max(a, end))
            end = max(end, b)
            total += nbytes
        rate = total / covered if covered > 0 else float("inf")
        return StepStats(tensor_ready=ready, bytes_per_second=rate)

    def close(self, timeline: bool = True) -> None:
        """Stop the threads (after the current step completed) and close the timeline
        (unless ``timeline=False``: its owner goes on writing to it).

        Args:
            timeline: also close the timeline.

        Example::

            >>> dispatcher.close(timeline=False)   # doctest: +SKIP
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=60)
        if timeline and self._timeline is not None:
            self._timeline.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("gradient dispatcher failed") from self._error

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except BaseException as exc:  # surfaced to the training thread by wait_all
                log.exception("chronica gradient dispatcher thread failed")
                with self._cond:
                    first = self._error is None
                    self._error = self._error or exc
                    self._cond.notify_all()
                if first and self._on_failure is not None:
                    self._on_failure()

        return run

    def _issue_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed or self._error is not None:
                        return
                    queue = self._queue
                    p = queue.next_dispatch() if queue is not None else None
                    if queue is not None and p is not None:
                        self.issued.append(p)
                        self.max_in_flight = max(self.max_in_flight, queue.in_flight)
                        break
                    self._cond.wait()
            issued = time.perf_counter()
            handle = self._start(p)
            with self._cond:
                self._flight.append((p, handle, issued))
                self._cond.notify_all()

    def _complete_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._flight or self._closed or self._error)
                if not self._flight:
                    return
                p, handle, issued = self._flight.popleft()
            self._wait(p, handle)
            done = time.perf_counter()
            queue = self._queue
            assert queue is not None  # p was issued from it; begin() waits for the step to end
            nbytes = int(queue.layout.part_bytes[p])
            with self._cond:
                queue.complete(p)
                self._busy.append((issued, done, nbytes))
                ready = self._part_ready.get(p, issued)
                self._cond.notify_all()
            if self._timeline is not None:
                name = self._names[p] if self._names else f"partition {p}"
                self._timeline.span(name, "queue", ready, issued, partition=p, bytes=nbytes)
                self._timeline.span(name, "communication", issued, done, partition=p, bytes=nbytes)
            self._on_complete(p)
            with self._cond:
                self._remaining -= 1
                if not self._remaining:  # what wait_all waits for
                    self._cond.notify_all()


class AutoTuner:
    """Online search of ``(partition_bytes, credit_bytes)`` from measured step times.

    Tries each candidate for ``steps_per_trial`` steps, then gives the ``finalists`` best a
    second trial each, and keeps the finalist with the lowest median over all its measured
    steps. A trial's first step pays for the switch and is not measured. The second trial
    guards against a noisy machine: one slow or lucky trial alone does not decide. ``record``
    returns the knobs to switch to at the step boundary where a switch is due, else ``None``;
    the decision is a pure function of the recorded times, so feeding rank 0's times and
    sharing the result keeps ranks in step.

    Args:
        candidates: ``(partition_bytes, credit_bytes)`` pairs to try, in order.
        steps_per_trial: steps per trial (at least 2: the first is not measured).
        finalists: how many of the best get a second trial.

    Example::

        >>> tuner = AutoTuner([(1 << 20, 4 << 20), (4 << 20, 4 << 20)], steps_per_trial=2)
        >>> tuner.record(0.1), tuner.record(0.1)
        (None, (4194304, 4194304))
    """

    def __init__(
        self, candidates: list[tuple[int, int]], steps_per_trial: int = 4, finalists: int = 2
    ) -> None:
        if not candidates or steps_per_trial < 2 or finalists < 0:
            raise ValueError("need at least one candidate, steps_per_trial >= 2, finalists >= 0")
        self.candidates = [(int(p), int(c)) for p, c in candidates]
        self.steps_per_trial = steps_per_trial
        self.finalists = min(finalists, len(self.candidates)) if len(self.candidates) > 1 else 0
        self.scores: list[float] = []
        self.samples: dict[tuple[int, int], list[float]] = {c: [] for c in self.candidates}
        self._trials = list(self.candidates)
        self._final: list[tuple[int, int]] = []
        self._times: list[float] = []
        self.best: tuple[int, int] | None = None

    @classmethod
    def default_grid(cls, total_bytes: int) -> AutoTuner:
        """Partitions from 1/64 of the gradient bytes up to all of them, credit 1 or 4 of them.

        Args:
            total_bytes: the gradients' bytes.

        Example::

            >>> AutoTuner.default_grid(1 << 24).candidates[0]
            (262144, 262144)
        """
        top = max(1 << 16, int(total_bytes))
        sizes = sorted({max(1 << 16, top >> shift) for shift in (6, 4, 2, 0)})
        return cls([(p, k * p) for p in sizes for k in (1, 4)])

    @property
    def current(self) -> tuple[int, int]:
        return self.best or self._trials[0]

    def record(self, seconds: float) -> tuple[int, int] | None:
        if self.best is not None:
            return None
        self._times.append(float(seconds))
        if len(self._times) < self.steps_per_trial:
            return None
        trial = self._trials.pop(0)
        self.samples[trial].extend(self._times[1:])
        self._times = []
        if len(self.scores) < len(self.candidates):  # the first sweep
            self.scores.append(float(np.median(self.samples[trial])))
            if len(self.scores) == len(self.candidates):
                ranked = np.argsort(self.scores, kind="stable")[: max(1, self.finalists)]
                self._final = [self.candidates[int(i)] for i in ranked]
                self._trials = list(self._final) if self.finalists else []
        if not self._trials:
            self.best = min(
                self._final,
                key=lambda c: (float(np.median(self.samples[c])), self.candidates.index(c)),
            )
            log.info(
                "chronica auto-tune: partition, credit = %s (first-trial scores %s)",
                self.best,
                self.scores,
            )
        return self.current
