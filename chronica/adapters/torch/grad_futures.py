"""Partitions issued under credit and completed through torch's asynchronous work futures.

``FutureDispatcher`` replaces ``chronica.runtime.dispatcher.Dispatcher`` for
``ScheduledOptimizer``'s scheduled engine. The framework-neutral dispatcher runs two threads
of its own, so each partition costs a wake-up of the issuing thread and one of the waiting
thread, each taking the interpreter lock in turn with the training thread. Here a partition
is started by whoever makes it startable (the gradient hook that made it ready, or the
completion that returned the credit it waited for) and completed by a callback chained to its
collective's future, which torch runs on the process group's own thread as the collective
ends: one Python call per partition, no thread of chronica's.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from chronica.core.priority import GradientQueue
from chronica.runtime.dispatcher import StepStats
from chronica.runtime.timeline import Timeline

__all__ = ["FutureDispatcher"]


class FutureDispatcher:
    """Issues one ``GradientQueue`` per step as asynchronous collectives, completing each from
    its work's future.

    ``start(partition)`` begins a collective and returns its ``torch.distributed`` work;
    ``complete(partition)`` hands its result back and ``on_complete(partition)`` is told it
    is done. Guarantees: partitions are started in the queue's order, one at a time under a
    lock, from whichever thread gets there (so the sequence is the same on every rank);
    ``complete`` runs once per partition, never two at once; ``on_complete`` runs once per
    partition after its ``complete``, on the thread that completed the collective, in any
    order; ``wait_all`` returns after every partition of the step completed and re-raises the
    first error; on an error ``wake()`` is called, so that a caller waiting on its own
    condition can look at ``failed``. ``ready`` may be called from any thread.
    """

    def __init__(
        self,
        start: Callable[[int], Any],
        complete: Callable[[int], None],
        on_complete: Callable[[int], None],
        timeline: Timeline | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self._start, self._complete, self._on_complete = start, complete, on_complete
        self._timeline = timeline
        self._wake = wake
        self._names: list[str] | None = None
        self.issued: list[int] = []
        self.max_in_flight = 0
        self._cond = threading.Condition()
        self._deliver = threading.Lock()  # completions write into shared gradients
        self._queue: GradientQueue | None = None
        self._remaining = 0
        self._error: BaseException | None = None
        self._ready_at: np.ndarray = np.zeros(0)
        self._part_ready: dict[int, float] = {}
        self._busy: list[tuple[float, float, int]] = []

    def begin(self, queue: GradientQueue, names: list[str] | None = None) -> None:
        """Start a step with ``queue`` (reset); the previous step must have completed.

        ``names`` label the partitions on the timeline."""
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
        """``tensor``'s gradient is final for this step: start what that allows."""
        now = time.perf_counter()
        with self._cond:
            self._raise_if_failed()
            self._ready_at[tensor] = now
            assert self._queue is not None  # begin() set it: before, _ready_at is empty
            for p in self._queue.mark_ready(tensor):
                self._part_ready[p] = now
            started = self._issue()
        self._watch(started)

    def wait_all(self) -> None:
        """Block until every partition of the current step has completed."""
        with self._cond:
            self._cond.wait_for(lambda: self._remaining == 0 or self._error is not None)
            self._raise_if_failed()

    @property
    def failed(self) -> bool:
        """True once a collective or a completion failed (``wait_all`` re-raises its error)."""
        return self._error is not None

    def stats(self) -> StepStats:
        """Statistics of the current (or last completed) step."""
        with self._cond:
            return StepStats.measure(self._ready_at, self._busy)

    def close(self, timeline: bool = True) -> None:
        """Close the timeline (unless ``timeline=False``: its owner goes on writing to it).
        Nothing else to stop: the callbacks run on the process group's threads."""
        if timeline and self._timeline is not None:
            self._timeline.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("gradient dispatcher failed") from self._error

    def _issue(self) -> list[tuple[int, Any, float]]:
        """Start every partition the order, readiness and credit allow (holding the lock)."""
        queue, started = self._queue, []
        assert queue is not None
        while (p := queue.next_dispatch()) is not None:
            self.issued.append(p)
            self.max_in_flight = max(self.max_in_flight, queue.in_flight)
            issued = time.perf_counter()
            started.append((p, self._start(p), issued))
        return started

    def _watch(self, started: list[tuple[int, Any, float]]) -> None:
        # Outside the lock: a future already done runs its callback here and now.
        for p, work, issued in started:
            work.get_future().then(functools.partial(self._done, p, issued))

    def _done(self, p: int, issued: float, future: torch.futures.Future) -> None:
        try:
            future.wait()  # raises the collective's error
            with self._deliver:
                self._complete(p)
            done = time.perf_counter()
            queue = self._queue
            assert queue is not None  # p was issued from it; begin() waits for the step
            nbytes = int(queue.layout.part_bytes[p])
            with self._cond:
                queue.complete(p)
                self._busy.append((issued, done, nbytes))
                ready = self._part_ready.get(p, issued)
                started = self._issue()
            self._watch(started)
            if self._timeline is not None:
                name = self._names[p] if self._names else f"partition {p}"
                self._timeline.span(name, "queue", ready, issued, partition=p, bytes=nbytes)
                self._timeline.span(name, "communication", issued, done, partition=p, bytes=nbytes)
            self._on_complete(p)
        except BaseException as exc:  # torch would keep it in a future nobody reads
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()
            if self._wake is not None:
                self._wake()
            return
        with self._cond:
            self._remaining -= 1
            if not self._remaining:  # what wait_all waits for
                self._cond.notify_all()
