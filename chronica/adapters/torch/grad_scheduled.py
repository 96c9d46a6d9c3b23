"""The scheduled engine of ``ScheduledOptimizer`` (``chronica.adapters.torch.grad``): its
partitions and order (built, re-planned from rank 0's measurements), the callables the
``Dispatcher`` threads run, and the per-parameter updates on the training thread.

``ScheduledEngine`` is a base class of ``ScheduledOptimizer`` only: it holds no state of
its own and works on the optimizer's (declared below for the type checker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chronica.adapters.torch.grad_buffers import Packing
from chronica.core.priority import GradientQueue, Layout, build_layout, fifo_order, simulate_order
from chronica.runtime.dispatcher import Dispatcher, SchedulingOptions
from chronica.runtime.gradients import PLAN_STEPS, PlanInputs, PlanRecord

__all__ = ["ScheduledEngine"]

log = logging.getLogger("chronica")


class ScheduledEngine:
    """Priority scheduling's half of ``ScheduledOptimizer``: plan, dispatch callbacks, updates.

    Guarantees: partitions and order are a pure function of rank 0's broadcast
    measurements and knobs (once the setting in force ran ``PLAN_STEPS`` steps, the
    per-tensor medians of those steps, ``PlanInputs``: the same in every mode); each
    parameter is updated once per step, after all of its partitions arrived, with the
    hyper-parameters of the step that released it; a parameter no rank used loses its
    gradient untouched, as under DDP.

    Example::

        >>> class ScheduledOptimizer(GradientViews, ScheduledEngine): ...   # doctest: +SKIP
    """

    optimizer: torch.optim.Optimizer
    world: int
    _group: Any
    _control: Any
    _src: int
    _steps: int
    _params: list[torch.Tensor]
    _names: list[str]
    _group_of: dict[int, int]
    _priority: list[int]
    _slot: np.ndarray
    _ordered: list[torch.Tensor]
    _numel: np.ndarray
    _itemsize: np.ndarray
    _dtype_key: np.ndarray
    _cv: threading.Condition
    _released: bool
    _updated: np.ndarray
    _reduced: np.ndarray
    _left: np.ndarray
    _hyper: list[dict[str, Any]]
    _last_done: float
    _reduced_at: float
    _record: PlanRecord | None
    _layout: Layout
    _packing: Packing
    _queue: GradientQueue
    _current: SchedulingOptions
    _parts_per_param: np.ndarray
    _part_params: list[list[int]]
    _link_busy: float
    _plan_inputs: PlanInputs
    _plan_knobs: tuple[int, int] | None
    _planned_from: int
    _measured: bool

    def _label(self, layout: Layout, credit_bytes: int) -> None:
        raise NotImplementedError

    def _start_plan(self) -> None:
        """No order planned yet, no step measured (``_build`` plans, ``_measure`` measures)."""
        self._plan_inputs = PlanInputs()
        self._plan_knobs = None
        self._planned_from = 0
        self._measured = True  # nothing to measure before the first scheduled step

    def _begin_step(self, dispatcher: Dispatcher) -> None:
        dispatcher.wait_all()
        # The link's busy time with the step just finished: its bytes over the measured rate.
        rate = self._measure(dispatcher)
        nbytes = float(self._layout.part_bytes.sum())
        self._link_busy = nbytes / rate if 0 < rate < float("inf") else 0.0
        if self._released:  # parameters the forward did not use are still to update
            self._apply_reduced()
        self._reduced_at = self._last_done  # when the previous step's last partition arrived
        with self._cv:
            self._released = False
            self._updated[:] = False
            self._reduced[:] = False
            self._left[:] = self._parts_per_param
        assert self._record is not None  # _build labelled the partitions
        dispatcher.begin(self._queue, self._record.labels)
        self._measured = False

    def _measure(self, dispatcher: Dispatcher) -> float:
        """Keep the finished step's ready times and rate for the plan (once per step); its
        rate."""
        stats = dispatcher.stats()
        if not self._measured and stats.tensor_ready.size == self._layout.num_tensors:
            self._plan_inputs.record(stats.tensor_ready, stats.bytes_per_second)
        self._measured = True
        return stats.bytes_per_second

    def _plan_due(self, settled: bool) -> bool:
        """Whether this step's measurements should re-plan the order (the same on every
        rank): the first plan was made without a measured link, or the setting is settled
        and ``PLAN_STEPS`` steps of it can now replace a plan made from fewer."""
        if self._planned_from == 0:
            return True
        steps = len(self._plan_inputs) + (0 if self._measured else 1)
        return settled and self._planned_from < PLAN_STEPS <= steps

    def _build(
        self, opts: SchedulingOptions, tensor_ready: np.ndarray, rate: float = 0.0, steps: int = 0
    ) -> None:
        """Partitions and order for ``opts`` from ready times and rate measured over ``steps``
        steps (a rate of 0: none measured, backward order); another setting's steps no longer
        count towards its plan."""
        knobs = (opts.partition_bytes, opts.credit_bytes)
        if knobs != self._plan_knobs:
            self._plan_inputs.clear()
            self._plan_knobs = knobs
            steps = min(steps, 1)  # measured with another setting: good for a first plan
        self._planned_from = steps if rate > 0 else 0
        layout = build_layout(self._numel, self._itemsize, opts.partition_bytes, self._dtype_key)
        if opts.order == "fifo" or rate <= 0:
            order = fifo_order(layout, tensor_ready)
        else:
            order = simulate_order(layout, tensor_ready, opts.credit_bytes, rate)
        self._queue = GradientQueue(layout, order, opts.credit_bytes)
        self._layout = layout
        self._packing = Packing(layout, self._ordered, self.world)
        self._current = opts
        self._parts_per_param = np.empty(len(self._params), dtype=np.int64)
        self._parts_per_param[self._priority] = layout.parts_per_tensor()
        priority = self._priority
        self._part_params = [
            [priority[t] for t in layout.seg_tensor[a:b].tolist()]
            for a, b in zip(
                layout.part_ptr[:-1].tolist(), layout.part_ptr[1:].tolist(), strict=True
            )
        ]
        self._label(layout, opts.credit_bytes)

    def _replan(self, dispatcher: Dispatcher, knobs: tuple[int, int] | None) -> None:
        """At a step boundary: finish, then rebuild from rank 0's measurements and knobs."""
        dispatcher.wait_all()
        self._apply_reduced()
        self._measure(dispatcher)
        n = len(self._params)
        ready, rate = self._plan_inputs.estimate()
        if ready.size != n:  # no step of the scheduled engine measured yet
            ready = np.zeros(n)
        steps = len(self._plan_inputs)
        part, credit = knobs or (self._current.partition_bytes, self._current.credit_bytes)
        values = np.concatenate([ready, [rate, part, credit, steps]])
        agreed = self._agree(values.astype(np.float64))
        opts = self._current.with_knobs(int(agreed[n + 1]), int(agreed[n + 2]))
        self._build(opts, agreed[:n], float(agreed[n]), int(agreed[n + 3]))
        log.debug(
            "chronica replan at step %d: %s, %d partitions, from %d steps",
            self._steps,
            opts,
            self._layout.num_partitions,
            self._planned_from,
        )

    def _agree(self, values: Iterable[float] | np.ndarray) -> np.ndarray:
        array = np.ascontiguousarray(np.asarray(values, dtype=np.float64))
        tensor = torch.from_numpy(array)
        dist.broadcast(tensor, src=self._src, group=self._control)
        return tensor.numpy()

    def _gather(self, values: list[float]) -> np.ndarray:
        """Every rank's ``values`` (one row per rank, rank order), the same on every rank."""
        mine = torch.tensor(values, dtype=torch.float64)
        rows = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine, group=self._control)
        return torch.stack(rows).numpy()

    # -- dispatcher callables (run on the dispatcher's threads) ----------------------------

    def _start(self, partition: int) -> Any:
        buf = self._packing.buffers[partition]
        return dist.all_reduce(buf, group=self._group, async_op=True)

    def _wait(self, partition: int, work: Any) -> None:
        work.wait()
        self._packing.complete(partition)

    def _wake(self) -> None:
        """Wake a forward waiting for its parameters: the dispatcher failed, and the forward
        re-raises its error instead of waiting for reductions that will never come."""
        with self._cv:
            self._cv.notify_all()

    def _on_complete(self, partition: int) -> None:
        with self._cv:
            for i in self._part_params[partition]:
                self._left[i] -= 1
                if self._left[i] == 0:
                    self._reduced[i] = True
            self._last_done = time.perf_counter()
            self._cv.notify_all()

    # -- updates (on the training thread) ----------------------------------------------------

    def _apply_reduced(self) -> None:
        """Update every parameter whose average arrived and that is not updated yet, with one
        call of the wrapped optimizer (after ``step()`` released this step's updates)."""
        with self._cv:
            ready = np.flatnonzero(self._reduced & ~self._updated)
            self._updated[ready] = True
        if len(ready):
            self._apply(ready.tolist())

    def _apply(self, indices: list[int]) -> None:
        """Step the wrapped optimizer on exactly ``indices`` that some rank used; the others
        lose their gradient, untouched, as under DDP."""
        groups: dict[int, list[torch.Tensor]] = {}
        for i in indices:
            p = self._params[i]
            if self._packing.used[self._slot[i]]:
                groups.setdefault(self._group_of[id(p)], []).append(p)
            else:
                p.grad = None
        if groups:
            saved = self.optimizer.param_groups
            self.optimizer.param_groups = [
                dict(self._hyper[g], params=ps) for g, ps in groups.items()
            ]
            try:
                self.optimizer.step()
            finally:
                self.optimizer.param_groups = saved
        for i in indices:
            self._params[i].grad = None
