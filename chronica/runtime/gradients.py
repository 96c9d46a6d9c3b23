"""What the three gradient shims (torch, TF, JAX) share: the plan record and its views, and
the measured steps behind ``stats()`` (``Exposure``: saving bound and diagnostic line).

Framework-free (numpy and the standard library). A shim keeps its framework's buffers and
collectives; it describes its plan in force with one ``PlanRecord`` and its measured steps
with one ``StepHistory``, and inherits the views of ``GradientViews``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chronica.core.priority import Layout
from chronica.runtime.auto import Window
from chronica.runtime.timeline import Exposure

__all__ = [
    "BUCKET_BYTES",
    "FIRST_BUCKET_BYTES",
    "GradientViews",
    "PlanInputs",
    "PlanRecord",
    "StepHistory",
    "link_busy",
]

HISTORY = 256  # steps kept for stats()
PLAN_STEPS = 8  # steps whose medians the priority order is planned from
FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb: the bucketed engine of every shim


def link_busy(
    first_issued: float, last_issued: float, reduced: float, last_bytes: int, total_bytes: int
) -> float:
    """Seconds the link needed for one step's gradients, from when their collectives were
    issued and when the last one was reduced (``time.perf_counter()`` readings): the last
    collective's bytes went from its issue to ``reduced``, so all the bytes at that rate, but
    no longer than the time since the first was issued (0 where nothing was sent). What every
    shim feeds ``StepHistory.record(busy=...)`` for the ``Exposure`` bound.

    Args:
        first_issued: when the step's first collective was issued.
        last_issued: when its last one was issued.
        reduced: when the last one was seen reduced.
        last_bytes: the last collective's bytes.
        total_bytes: all the step's gradient bytes.

    Example::

        >>> link_busy(0.0, 0.030, 0.040, last_bytes=1 << 20, total_bytes=4 << 20)
        0.04
    """
    if last_bytes <= 0 or total_bytes <= 0:
        return 0.0
    at_rate = (reduced - last_issued) * total_bytes / last_bytes
    return max(0.0, min(reduced - first_issued, at_rate))


@dataclass(frozen=True)
class PlanRecord:
    """The partitions in force on a rank: the same on every rank of the job.

    Args:
        layout: the partitions (``chronica.core.priority.Layout``), tensors in priority order.
        names: one name per tensor of ``layout`` (priority order): parameter names, variable
            names or leaf paths.
        partition_bytes: the partition (or bucket) size the layout was cut with.
        credit_bytes: the bound on bytes in flight (0 where nothing bounds them).

    Example::

        >>> from chronica.core.priority import build_layout
        >>> layout = build_layout(np.array([4, 2]), np.array([4, 4]), 8, np.zeros(2, np.int64))
        >>> record = PlanRecord(layout, ["w", "b"], partition_bytes=8, credit_bytes=16)
        >>> record.shapes()
        [[('w', 0, 2)], [('w', 2, 4)], [('b', 0, 2)]]
    """

    layout: Layout
    names: Sequence[str]
    partition_bytes: int
    credit_bytes: int
    labels: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.layout, Layout):
            raise TypeError(f"layout={self.layout!r} must be a chronica.core.priority.Layout")
        if len(self.names) != self.layout.num_tensors:
            raise ValueError(
                f"names has {len(self.names)} entries for {self.layout.num_tensors} tensors: "
                "pass one name per tensor of the layout, in priority order"
            )
        names = list(self.names)
        labels = tuple(self.layout.label(p, names) for p in range(self.layout.num_partitions))
        object.__setattr__(self, "labels", labels)

    def dispatch(self, issued: Sequence[int]) -> list[str]:
        """The labels of partitions ``issued`` (partition indices), in that order.

        Args:
            issued: partition indices in the order they were issued.

        Example::

            >>> record.dispatch([1, 0])   # doctest: +SKIP
            ['w[2:4]', 'w[0:2]']
        """
        return [self.labels[p] for p in issued]

    def shapes(self) -> list[list[tuple[str, int, int]]]:
        """Each partition as ``(tensor name, start, stop)`` flat element ranges.

        Example::

            >>> record.shapes()[0]   # doctest: +SKIP
            [('w', 0, 2)]
        """
        names = self.names
        return [
            [(names[t], a, b) for t, a, b in self.layout.segments(p)]
            for p in range(self.layout.num_partitions)
        ]


class PlanInputs:
    """What a priority order is planned from, robust to one noisy step: the per-tensor median
    of the last ``steps`` steps' gradient ready times and the median of their link rates.

    One step's ready times and rate are noisy (a loaded core delays one layer's backward, the
    link's rate varies), and ``chronica.core.priority.simulate_order`` turns small
    differences into different orders: planned from one step, two optimizers with the same
    setting ran different orders. Medians over ``steps`` steps make the order a property of
    the setting and the machine, not of one step.

    Args:
        steps: how many of the latest steps the medians are taken over (older ones drop).

    Example::

        >>> inputs = PlanInputs(steps=3)
        >>> for ready, rate in (([0.0, 2.0], 10.0), ([0.0, 9.0], 11.0), ([0.0, 3.0], 50.0)):
        ...     inputs.record(np.array(ready), rate)
        >>> ready, rate = inputs.estimate()
        >>> ready.tolist(), rate
        ([0.0, 3.0], 11.0)
    """

    def __init__(self, steps: int = PLAN_STEPS) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise TypeError(f"steps={steps!r} must be an int (steps the medians are over)")
        if steps < 1:
            raise ValueError(f"steps={steps!r} must be at least 1")
        self._ready: deque[np.ndarray] = deque(maxlen=steps)
        self._rate: deque[float] = deque(maxlen=steps)

    def __len__(self) -> int:
        return len(self._ready)

    def __repr__(self) -> str:
        return f"PlanInputs(recorded={len(self)}, steps={self._ready.maxlen})"

    @property
    def full(self) -> bool:
        """True once ``steps`` steps were recorded since the last ``clear``."""
        return len(self._ready) == self._ready.maxlen

    def record(self, tensor_ready: np.ndarray, bytes_per_second: float) -> None:
        """One step's measurement: when each tensor's gradient was ready (seconds after the
        first, NaN where never) and the link's rate (``inf`` or NaN where unmeasured).

        Args:
            tensor_ready: per tensor, seconds after the step's first gradient was ready.
            bytes_per_second: the rate the step's partitions were reduced at.

        Example::

            >>> inputs = PlanInputs(); inputs.record(np.zeros(2), 1e6); len(inputs)
            1
        """
        ready = np.asarray(tensor_ready, dtype=np.float64)
        if self._ready and ready.shape != self._ready[0].shape:
            raise ValueError(
                f"tensor_ready has {ready.shape} entries where earlier steps had "
                f"{self._ready[0].shape}: clear() between layouts of other tensors"
            )
        self._ready.append(ready.copy())
        rate = float(bytes_per_second)
        self._rate.append(rate if np.isfinite(rate) and rate > 0 else np.nan)

    def clear(self) -> None:
        """Forget every step (the setting changed: its steps plan the next order).

        Example::

            >>> inputs = PlanInputs(); inputs.record(np.zeros(1), 1.0); inputs.clear(); len(inputs)
            0
        """
        self._ready.clear()
        self._rate.clear()

    def estimate(self) -> tuple[np.ndarray, float]:
        """Per-tensor median ready times (0 where no step saw the tensor) and the median
        rate (0 where none was measured: plan without the link), over the recorded steps.

        Example::

            >>> PlanInputs().estimate()
            (array([], dtype=float64), 0.0)
        """
        if not self._ready:
            return np.zeros(0), 0.0
        rows = np.vstack(self._ready)
        seen = ~np.isnan(rows).all(axis=0)
        ready = np.zeros(rows.shape[1])
        ready[seen] = np.nanmedian(rows[:, seen], axis=0)
        rates = np.asarray(self._rate)
        rates = rates[~np.isnan(rates)]
        return ready, float(np.median(rates)) if len(rates) else 0.0


class StepHistory:
    """The last ``maxlen`` steps a shim measured, and the process CPU time while asked.

    A step is the time from one call (``record``) to the next; the first call after
    ``restart`` only sets the reference point. Each step keeps ``(step_time, after_backward,
    forward_wait)`` (seconds, see ``Exposure``).

    Args:
        maxlen: how many steps are kept (older ones are dropped).

    Example::

        >>> history = StepHistory()
        >>> history.record(10.0, 0.0, 0.0)         # reference point only
        >>> history.record(10.1, 0.03, 0.0)        # one step: 0.1 s
        10.0
        >>> round(history.exposure("bucketed").saving_bound, 2)
        0.3
    """

    def __init__(self, maxlen: int = HISTORY) -> None:
        if isinstance(maxlen, bool) or not isinstance(maxlen, int):
            raise TypeError(f"maxlen={maxlen!r} must be an int (steps kept)")
        if maxlen < 1:
            raise ValueError(f"maxlen={maxlen!r} must be at least 1")
        self.steps: deque[tuple[float, float, float]] = deque(maxlen=maxlen)
        self.cpu: deque[float] = deque(maxlen=maxlen)  # process CPU seconds per step
        self.busy: deque[float] = deque(maxlen=maxlen)  # seconds the link was busy per step
        self.fresh = 0  # steps recorded since the last restart or window()
        self._last_call: float | None = None
        self._last_cpu = 0.0

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_call(self) -> float | None:
        """The time of the latest ``record`` (``None`` after ``restart``)."""
        return self._last_call

    def __repr__(self) -> str:
        return f"StepHistory(steps={len(self.steps)}, maxlen={self.steps.maxlen})"

    def record(
        self,
        now: float,
        after_backward: float,
        forward_wait: float,
        cpu: bool = False,
        busy: float = 0.0,
    ) -> float | None:
        """A call at ``now``: closes the step begun at the previous call, if any.

        Args:
            now: ``time.perf_counter()`` at this call.
            after_backward: seconds from the end of backward until every gradient was reduced.
            forward_wait: seconds the forward pass waited for parameters.
            cpu: also measure the process CPU time per step (reading it costs: only while a
                decision needs it).
            busy: seconds the link was busy with this step's gradients (0 where unknown).

        Returns the start of the step it closed (``None`` after ``restart``).

        Example::

            >>> StepHistory().record(1.0, 0.0, 0.0) is None
            True
        """
        spent = time.process_time() if cpu else 0.0
        start = self._last_call
        if start is not None:
            self.steps.append((now - start, after_backward, forward_wait))
            self.busy.append(float(busy))
            self.fresh += 1
            if cpu:
                self.cpu.append(spent - self._last_cpu)
        self._last_call, self._last_cpu = now, spent
        return start

    def restart(self) -> None:
        """Forget the steps; the next ``record`` only sets the reference point.

        Example::

            >>> history = StepHistory(); history.restart(); len(history)
            0
        """
        self.steps.clear()
        self.cpu.clear()
        self.busy.clear()
        self.fresh = 0
        self._last_call = None

    def window(self) -> Window:
        """Medians of the steps recorded since the last ``restart`` or ``window`` (this rank's
        part of an ``AutoTrial`` window), and start the next window.

        Example::

            >>> history = StepHistory()
            >>> for now in (0.0, 0.1, 0.2):
            ...     _ = history.record(now, 0.02, 0.0, busy=0.05)
            >>> history.window()
            Window(step_time=0.1, cpu_time=0.0, after_backward=0.02, link_busy=0.05)
        """
        n = min(self.fresh, len(self.steps))
        self.fresh = 0
        if not n:
            return Window(0.0)
        rows = np.asarray(list(self.steps)[-n:], dtype=np.float64)
        cpu = list(self.cpu)[-n:]
        busy = list(self.busy)[-n:]
        return Window(
            float(np.median(rows[:, 0])),
            float(np.median(cpu)) if cpu else 0.0,
            float(np.median(rows[:, 1])),
            float(np.median(busy)),
        )

    def exposure(self, mode: str, decision: str = "") -> Exposure:
        """Medians of the kept steps as an ``Exposure`` (what ``stats()`` returns), with the
        link's median busy time per step where it was measured.

        Args:
            mode: the engine the steps ran (``"bucketed"`` or ``"scheduled"``).
            decision: why the shim runs in ``mode`` (empty if it was told to).

        Example::

            >>> StepHistory().exposure("bucketed").steps
            0
        """
        busy = float(np.median(self.busy)) if self.busy else 0.0
        return Exposure.from_steps(self.steps, mode, decision, link_busy=busy)

    def median_cpu(self) -> float:
        """Median CPU seconds per measured step (0 if none was measured).

        Example::

            >>> StepHistory().median_cpu()
            0.0
        """
        return float(np.median(self.cpu)) if self.cpu else 0.0


class GradientViews:
    """The read-only views every gradient shim offers, from its ``PlanRecord`` in force.

    A shim sets ``self._record`` (``None`` until it planned), answers ``_dispatched()``
    (partition indices of the latest step in issue order), lists its configuration in
    ``_config()`` for ``__repr__`` and may name the knobs it shows before its first plan
    (``_unplanned()``: partition and credit bytes, 0 and 0 unless overridden).

    Example::

        >>> class Shim(GradientViews):
        ...     def _config(self):
        ...         return {"mode": "scheduled"}
        >>> Shim()
        Shim(mode='scheduled')
    """

    _record: PlanRecord | None = None

    def _config(self) -> dict[str, object]:
        raise NotImplementedError

    def _dispatched(self) -> Sequence[int]:
        return ()

    def _unplanned(self) -> tuple[int, int]:
        return 0, 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._config().items())
        return f"{type(self).__name__}({fields})"

    def _shared_config(
        self, mode: str, engine: str | None, min_saving: float, options: Any
    ) -> dict[str, object]:
        """The part of ``_config()`` every shim shares: its mode, the engine in use, the
        ``auto`` threshold and the partition, credit and order it was given."""
        return {
            "mode": mode,
            "engine": engine,
            "min_saving": min_saving,
            "partition_bytes": options.partition_bytes,
            "credit_bytes": options.credit_bytes,
            "order": options.order,
        }

    @property
    def partition_bytes(self) -> int:
        """The partition (or bucket) size in force (0 before the first plan)."""
        return self._record.partition_bytes if self._record is not None else self._unplanned()[0]

    @property
    def credit_bytes(self) -> int:
        """The bound on bytes in flight in force (0 where none applies yet)."""
        return self._record.credit_bytes if self._record is not None else self._unplanned()[1]

    @property
    def last_dispatch(self) -> list[str]:
        """Partitions (or buckets) of the latest step in issue order (the same on every rank)."""
        return self._record.dispatch(self._dispatched()) if self._record is not None else []

    def partition_shapes(self) -> list[list[tuple[str, int, int]]]:
        """Each partition (or bucket) as ``(name, start, stop)`` flat element ranges, by priority.

        Example::

            >>> shim.partition_shapes()[0]   # doctest: +SKIP
            [('stem.weight', 0, 262144)]
        """
        return self._record.shapes() if self._record is not None else []
