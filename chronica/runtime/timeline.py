"""A Chrome-trace timeline of one rank's gradient communication (``CHRONICA_TIMELINE``), and
the exposed-communication diagnostic read from it or from a shim's own measurements.

Framework-free; written by ``chronica.runtime.dispatcher`` and the adapters' gradient shims.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["Exposure", "Timeline", "read_exposure", "timeline_path"]

STEP_ROW = "step"  # the timeline row of one span per training step, carrying its exposure


def timeline_path(path: str, rank: int, world: int) -> str:
    """The per-rank file name for a timeline ``path`` (see ``SchedulingOptions``).

    Args:
        path: the configured path (``{rank}`` is replaced).
        rank: this rank.
        world: number of ranks.

    Example::

        >>> timeline_path("/tmp/t.json", 1, 2)
        '/tmp/t.rank1.json'
    """
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world <= 1:
        return path
    root, dot, ext = path.rpartition(".")
    return f"{root}.rank{rank}.{ext}" if dot and "/" not in ext else f"{path}.rank{rank}"


def _finish(file: IO[str], lock: threading.Lock) -> None:
    with lock:
        if not file.closed:
            file.write("\n]\n")
            file.close()


class Timeline:
    """A Chrome-trace (JSON array format) file of complete ("X") events, loadable by
    chrome://tracing and Perfetto. Complete JSON once ``close`` ran, or once the timeline was
    garbage-collected or the interpreter exited normally (a finalizer closes it), so a
    training loop that never calls ``close`` still leaves a loadable file; while open it is
    the array format's accepted unterminated form. Thread-safe.

    Args:
        path: the file written.
        pid: the process row (the rank).

    Example::

        >>> timeline = Timeline("trace.json", pid=0)   # doctest: +SKIP
        >>> timeline.span("w", "communication", t0, t1); timeline.close()   # doctest: +SKIP
    """

    def __init__(self, path: str, pid: int = 0) -> None:
        self._file = open(path, "w")
        self._pid = pid
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _finish, self._file, self._lock)
        self._first = True
        self._t0 = time.perf_counter()
        self._wall0_us = time.time() * 1e6
        self._file.write("[\n")
        meta = {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid}"}}
        self._write(meta)

    def _write(self, event: dict) -> None:
        text = json.dumps(event, separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return
            self._file.write(text if self._first else ",\n" + text)
            self._first = False

    def span(self, name: str, tid: str, start: float, end: float, **args: Any) -> None:
        """One span from ``start`` to ``end`` (``time.perf_counter`` seconds) on row ``tid``.

        Args:
            name: the span's label.
            tid: the row.
            start: start time.
            end: end time.
            **args: arguments shown with the span.

        Example::

            >>> timeline.span("w[0:4]", "queue", 1.0, 1.2, partition=0)   # doctest: +SKIP
        """
        ts = self._wall0_us + (start - self._t0) * 1e6
        self._write(
            {
                "name": name,
                "ph": "X",
                "pid": self._pid,
                "tid": tid,
                "ts": round(ts, 3),
                "dur": round(max(0.0, end - start) * 1e6, 3),
                "args": args,
            }
        )

    def step(
        self, start: float, end: float, after_backward: float, forward_wait: float, mode: str
    ) -> None:
        """One training step's span on the ``step`` row, with its exposed communication
        (seconds; see ``Exposure``) and mode as arguments, which ``read_exposure`` reads."""
        self.span(
            "step",
            STEP_ROW,
            start,
            end,
            after_backward=after_backward,
            forward_wait=forward_wait,
            mode=mode,
        )

    def close(self) -> None:
        """Terminate the JSON array and close the file (idempotent)."""
        self._finalizer()


@dataclass(frozen=True)
class Exposure:
    """How much gradient communication one rank's steps exposed: medians over ``steps``.

    ``step_time``: seconds from one ``step()`` to the next; ``after_backward``: from the end
    of the backward pass (the ``step()`` call) until every gradient was reduced;
    ``forward_wait``: how long the next forward pass waited for parameters still being
    reduced; ``decision``: why the shim runs in ``mode`` (empty if it was told to);
    ``link_busy``: seconds per step the link was busy with the gradients (0 where not
    measured). With bucketed all-reduce (``mode="bucketed"``) the step waits for the
    reduction, so all of ``after_backward`` is exposed; with priority scheduling
    (``"scheduled"``) the reduction overlaps the next forward and only ``forward_wait`` is
    exposed. Scheduling can hide no more than what is exposed, and no schedule makes a step
    shorter than the time the link needs for it: ``saving_bound`` is the smaller of the two,
    over the step time (what more scheduling could save, in either mode).

    Args:
        steps: steps measured.
        step_time: median seconds per step.
        after_backward: median seconds from the end of backward to the last reduction.
        forward_wait: median seconds the next forward waited.
        mode: ``"bucketed"`` or ``"scheduled"``.
        decision: why the shim runs in ``mode``.
        link_busy: median seconds per step the link was busy (0 where unknown).

    Example::

        >>> round(Exposure.from_steps([(0.1, 0.02, 0.0)], "bucketed").saving_bound, 3)
        0.2
        >>> busy = Exposure.from_steps([(0.1, 0.05, 0.0)], "bucketed", link_busy=0.08)
        >>> round(busy.saving_bound, 3)
        0.2
    """

    steps: int
    step_time: float
    after_backward: float
    forward_wait: float
    mode: str
    decision: str = ""
    link_busy: float = 0.0

    @classmethod
    def from_steps(
        cls,
        records: Iterable[tuple[float, float, float]],
        mode: str,
        decision: str = "",
        link_busy: float = 0.0,
    ) -> Exposure:
        """From ``(step_time, after_backward, forward_wait)`` per step (seconds);
        ``decision`` says why the shim runs in ``mode``, ``link_busy`` is the link's busy
        seconds per step (0 where unknown)."""
        rows = np.asarray(list(records), dtype=np.float64).reshape(-1, 3)
        med = np.median(rows, axis=0) if len(rows) else np.zeros(3)
        return cls(
            len(rows), float(med[0]), float(med[1]), float(med[2]), mode, decision, link_busy
        )

    @property
    def exposed(self) -> float:
        """Seconds per step the training thread waited for communication."""
        return self.forward_wait if self.mode == "scheduled" else self.after_backward

    @property
    def saving_bound(self) -> float:
        """The largest fraction of step time (0 to 1) a schedule could still save: what is
        exposed, but no more than the step time the link leaves free (``link_busy``)."""
        if self.step_time <= 0:
            return 0.0
        room = self.step_time - self.link_busy if self.link_busy > 0 else self.step_time
        return max(0.0, min(self.exposed, room)) / self.step_time

    @property
    def verdict(self) -> str:
        """One line: what was exposed, and what priority scheduling could save at most."""
        if not self.steps:
            return "no step measured yet: nothing to say about exposed communication"
        ms, share = 1e3 * self.step_time, self.saving_bound
        link = (
            f" (the link is busy {1e3 * self.link_busy:.1f} ms per step)" if self.link_busy else ""
        )
        if self.mode == "scheduled":
            hidden = max(0.0, self.after_backward - self.forward_wait) / self.step_time
            return (
                f"gradients reduced {1e3 * self.after_backward:.1f} ms after backward, the next "
                f"forward waited {1e3 * self.forward_wait:.1f} ms per {ms:.1f} ms step: "
                f"priority scheduling hides about {hidden:.1%} of step time here and would "
                f"save at most {share:.1%} more{link}"
            )
        return (
            f"communication exposed after backward: {1e3 * self.after_backward:.1f} ms per "
            f"{ms:.1f} ms step: priority scheduling would save at most {share:.1%} of step "
            f"time{link}"
        )


def read_exposure(path: str | Path) -> Exposure:
    """The ``Exposure`` of the steps a timeline file recorded (closed or still open).

    Args:
        path: a timeline file.

    Example::

        >>> read_exposure("trace.rank0.json").verdict   # doctest: +SKIP
    """
    text = Path(path).read_text().rstrip()
    events = json.loads(text if text.endswith("]") else text + "]")
    steps = [e for e in events if e.get("tid") == STEP_ROW and e.get("ph") == "X"]
    # A run can switch from bucketed all-reduce to scheduling: describe the mode it ended in.
    mode = steps[-1]["args"]["mode"] if steps else "bucketed"
    return Exposure.from_steps(
        (
            (e["dur"] / 1e6, e["args"]["after_backward"], e["args"]["forward_wait"])
            for e in steps
            if e["args"]["mode"] == mode
        ),
        mode,
    )
