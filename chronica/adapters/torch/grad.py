"""Gradient-priority communication scheduling (ByteScheduler) for ``torch.distributed``.

``ScheduledOptimizer(model, optimizer)`` wraps a model and any ``torch.optim`` optimizer whose
update of one parameter depends only on that parameter (SGD, Adam, AdamW, RMSprop, Adagrad,
...; not LBFGS) and averages gradients over ranks with DDP's semantics (parameters and
buffers broadcast from rank 0 at start, buffers again before every forward that records
gradients, a parameter no rank used left untouched). Two engines:

- **bucketed** (DDP's way): gradients are copied into preallocated buckets in backward order;
  each bucket's asynchronous all-reduce starts from the gradient hook as soon as it is full;
  ``step()`` waits for them and runs the optimizer once.
- **scheduled** (ByteScheduler): per-parameter gradient hooks post tasks to a
  ``chronica.runtime.dispatcher.Dispatcher``, which all-reduces partitions asynchronously in
  a rank-identical priority order under credit; a forward pre-hook on each module waits for
  its own parameters only, so the next forward starts while later layers' gradients still
  travel. The training thread updates parameters once ``step()`` was called and their
  averages arrived: in ``step()`` and in those pre-hooks, every parameter averaged by then in
  one call of the optimizer (so on a fast link, one call per step, as with buckets).

``mode="auto"`` (the default) runs bucketed, measures how much communication the steps
expose and, only where that could save at least ``min_saving`` of the step time, searches
a few partition and credit sizes against bucketed windows (``chronica.runtime.auto``); the
windows are gathered from every rank, so all decide alike. The first step discovers the
priority (order of first use in the forward pass) and reduces everything in one all-reduce
before updating; rank 0's priority, measured ready times and bandwidth are broadcast so every
rank builds the same partitions and order.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chronica.adapters.torch.grad_buffers import Buckets, Packing
from chronica.adapters.torch.grad_scheduled import ScheduledEngine
from chronica.core.checks import check_number
from chronica.core.priority import (
    Layout,
    bucket_layout,
    fifo_order,
)
from chronica.runtime.auto import MODES, AutoTrial, Candidate, Window, candidates, check_mode
from chronica.runtime.dispatcher import AutoTuner, Dispatcher, SchedulingOptions
from chronica.runtime.gradients import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    GradientViews,
    PlanRecord,
    StepHistory,
)
from chronica.runtime.timeline import Exposure, Timeline, timeline_path

__all__ = ["MODES", "ScheduledOptimizer"]

log = logging.getLogger("chronica")

_BROADCAST_BYTES = 250 << 20  # DDP's broadcast_bucket_size
# What the scheduled engine runs on, kept aside while mode="auto" measures bucketed steps
# (see _switch).
_SCHEDULED_STATE: tuple[str, ...] = ("_dispatcher", "_layout", "_packing", "_queue")
_SCHEDULED_STATE += ("_parts_per_param", "_part_params", "_record", "_current")


class ScheduledOptimizer(GradientViews, ScheduledEngine):
    """Gradient averaging over ranks plus updates by ``optimizer``, bucketed or scheduled.

    Use it in place of the optimizer: ``loss.backward(); opt.step()``. Guarantees: after any
    number of steps and ``synchronize()``, the parameters, buffers and optimizer state equal
    those of ``DistributedDataParallel(find_unused_parameters=True, broadcast_buffers=True)``
    with ``optimizer`` (bitwise when the all-reduce sums in the same order, as with two
    ranks): a parameter that no rank used in a step gets no gradient and is not stepped (one
    unused on some ranks only gets the average, their zeros included); parameters and buffers
    start from rank 0's, and buffers (BatchNorm statistics) are broadcast from rank 0 before
    every forward run with gradients enabled (not under ``torch.no_grad()``, so evaluating on
    one rank alone cannot hang). Collectives are issued in the same order on every rank, in
    every mode. ``mode``: ``"bucketed"`` always runs DDP's bucketed all-reduce, ``"scheduled"``
    always priority scheduling, ``"auto"`` starts bucketed and runs the trial of
    ``chronica.runtime.auto.AutoTrial``: where the ranks' measurements say scheduling could
    save at least ``min_saving`` of the step time, a few partition and credit sizes are
    searched against bucketed windows and the cheapest kept only if it beat them by more than
    their noise (on step time when the model is on an accelerator, else with its extra CPU
    counted against it); re-decided if the communication's share of the step drifts.
    ``stats().decision`` says which and why; rank 0 prints it once (WARNING).

    When scheduling, ``step()`` returns while gradients may still be in flight and the next
    forward waits, module by module, for exactly the parameters it uses. Gradients are
    cleared once their parameter is updated, so ``zero_grad()`` does nothing and gradient
    accumulation over several backward passes is not supported. Call ``synchronize()`` before
    evaluating, checkpointing or reading parameters outside the model's forward. A model
    wrapped in ``DistributedDataParallel`` is refused (``ValueError``): DDP averages the
    gradients itself.

    Args:
        model: the bare model (not wrapped in ``DistributedDataParallel``).
        optimizer: a ``torch.optim`` optimizer over the model's parameters whose update of
            one parameter depends only on that parameter (not LBFGS).
        process_group: the ranks to average over (default: the world).
        partition_bytes: partitions' size: bigger tensors are cut, smaller ones fused (bytes,
            ``"1MiB"``; ``CHRONICA_PARTITION_BYTES``).
        credit_bytes: bytes in flight at most, plus one partition (``CHRONICA_CREDIT_BYTES``).
        order: ``"priority"`` (first layers first) or ``"fifo"`` (backward order).
        auto_tune: search partition and credit sizes online (``CHRONICA_AUTOTUNE=1``).
        timeline: Chrome-trace path (``CHRONICA_TIMELINE``; ``{rank}`` is replaced).
        mode: ``"auto"`` (measure, search, decide: ``chronica.runtime.auto.AutoTrial``),
            ``"scheduled"`` (priority scheduling) or ``"bucketed"`` (DDP's buckets).
        min_saving: in ``"auto"``, try scheduling only if it could save this fraction of the
            step time (0 to 1; 1 never tries).

    Example::

        >>> opt = ScheduledOptimizer(model, torch.optim.AdamW(model.parameters()))  # doctest: +SKIP
        >>> loss.backward(); opt.step()                                             # doctest: +SKIP
        >>> opt.stats().decision                                                    # doctest: +SKIP
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        process_group: dist.ProcessGroup | None = None,
        partition_bytes: int | str | None = None,
        credit_bytes: int | str | None = None,
        order: str | None = None,
        auto_tune: bool | None = None,
        timeline: str | None = None,
        mode: str = "auto",
        min_saving: float = 0.05,
    ) -> None:
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("LBFGS couples all parameters; it cannot be stepped per parameter")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(
                "model is wrapped in DistributedDataParallel, which all-reduces every gradient "
                "itself: ScheduledOptimizer would average them a second time and its priority "
                "order would not matter. Pass the bare model (model.module) and let "
                "ScheduledOptimizer do the averaging, or keep DDP and a plain optimizer"
            )
        check_mode(mode)
        self.min_saving = check_number(
            "min_saving", min_saving, 0.0, 1.0, hint=" (a fraction of the step time)"
        )
        self.model = model
        self.optimizer = optimizer
        self.mode = mode
        self.options = SchedulingOptions.resolve(
            partition_bytes, credit_bytes, order, auto_tune, timeline
        )
        self._group = process_group if process_group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self._group)
        self.rank = dist.get_rank(self._group)
        names = {id(p): n for n, p in model.named_parameters()}
        self._module_names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}
        self._params: list[torch.Tensor] = []
        self._group_of: dict[int, int] = {}
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError("every optimizer parameter must belong to the model")
                if p.requires_grad and id(p) not in self._group_of:
                    self._group_of[id(p)] = g
                    self._params.append(p)
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._names = [names[id(p)] for p in self._params]
        self._handles: list[Any] = []
        self._forward_hooks: list[Any] = []
        self._modules: list[torch.nn.Module] = []
        self._engine: str | None = None  # None until the first step() set up an engine
        self._trial: AutoTrial | None = None  # mode="auto": set up after the first step
        self._generation = 0  # the trial's generation the history's window belongs to
        self._history = StepHistory()
        self._dispatcher: Dispatcher | None = None
        self._buckets: Buckets | None = None
        self._timeline: Timeline | None = None
        if self.world == 1:
            return  # nothing to communicate: step() is the optimizer's own step
        ranks = dist.get_process_group_ranks(self._group)
        self._src = ranks[0]
        self._control = dist.new_group(ranks, backend="gloo")
        with torch.no_grad():  # DDP's start: every rank from rank 0's parameters and buffers
            states = [*model.parameters(), *model.buffers()]
            dist._broadcast_coalesced(self._group, states, _BROADCAST_BYTES, 0)
        n = len(self._params)
        self._first_use: dict[int, None] = {}
        self._seen = np.zeros(n, dtype=bool)
        self._ready_at = np.full(n, np.nan)
        self._cv = threading.Condition()
        self._released = False
        self._updated = np.ones(n, dtype=bool)
        self._reduced = np.ones(n, dtype=bool)
        self._left = np.zeros(n, dtype=np.int64)
        self._hyper: list[dict[str, Any]] = []
        self._steps = 0
        self._last_done = self._reduced_at = 0.0
        self._forward_wait = 0.0
        self._link_busy = 0.0  # seconds the link was busy with the last scheduled step
        self._start_plan()  # the order's inputs: medians of the setting's last steps
        # The scheduled engine, parked while bucketed steps are measured again after its trial.
        self._parked: dict[str, Any] | None = None
        self._tuner: AutoTuner | None = None
        self._module_params: dict[int, list[int]] = {}
        # DDP's buffers are those of the model when it is wrapped; none, no hook at all.
        self._buffers = list(model.buffers())
        if self._buffers:
            self._handles.append(model.register_forward_pre_hook(self._sync_buffers, prepend=True))
        for module in model.modules():
            own = [
                self._index[id(p)] for p in module.parameters(recurse=False) if id(p) in self._index
            ]
            if own:
                self._module_params[id(module)] = own
                self._modules.append(module)
        # Only the first forward (to record the priority) and scheduled ones run these: a
        # hook makes every call of its module take torch's slower path.
        self._watch_forward(True)
        for i, p in enumerate(self._params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._hook(i)))

    # -- public API ---------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing with several ranks (gradients are cleared as parameters are updated).

        Args:
            set_to_none: as ``torch.optim.Optimizer.zero_grad`` (one process only).

        Example::

            >>> opt.zero_grad()   # doctest: +SKIP
        """
        if self.world == 1:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Average this step's gradients and update: bucketed, before returning; scheduled,
        released here and applied as partitions arrive (``step()`` may return first)."""
        if self.world == 1:
            self.optimizer.step()
            return
        now = time.perf_counter()
        for t in np.flatnonzero(~self._seen).tolist():  # unused here: zeros, flagged unused
            self._post(t, None)
        if self._engine == "scheduled":
            self._release(now)
        else:
            if self._engine is None:
                self._setup()
            self._finish_buckets(now)
        self._steps += 1
        self._seen[:] = False

    def synchronize(self) -> None:
        """Wait until every released update is applied: parameters are current afterwards."""
        if self._dispatcher is not None and self._released:
            self._dispatcher.wait_all()
            self._apply_reduced()

    def stats(self) -> Exposure:
        """Exposed communication of this rank's recent steps (medians), the mode in force and
        why (``decision``); ``stats().verdict`` is one line saying what priority scheduling
        could save at most. See ``chronica.runtime.timeline.Exposure``."""
        if self.world == 1:
            return Exposure(0, 0.0, 0.0, 0.0, "bucketed", "one process: nothing to communicate")
        decision = self._trial.decision if self._trial is not None else ""
        return self._history.exposure(self._engine or "bucketed", decision)

    @property
    def trial(self) -> AutoTrial | None:
        """``mode="auto"``'s trial (``None`` in other modes and before the first step);
        ``trial.reopen(why)`` on every rank at the same step decides again."""
        return self._trial

    @property
    def setting(self) -> Candidate | None:
        """The setting in force (engine, partition and credit); ``None`` before the first step."""
        if self._engine is None or self.world == 1:
            return None
        if self._engine == "bucketed":
            return Candidate("bucketed")
        return Candidate("scheduled", self._current.partition_bytes, self._current.credit_bytes)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state, after ``synchronize()``.

        Example::

            >>> torch.save(opt.state_dict(), "opt.pt")   # doctest: +SKIP
        """
        self.synchronize()
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state, after ``synchronize()``.

        Args:
            state_dict: what ``state_dict()`` returned.

        Example::

            >>> opt.load_state_dict(torch.load("opt.pt"))   # doctest: +SKIP
        """
        self.synchronize()
        self.optimizer.load_state_dict(state_dict)

    def close(self) -> None:
        """Finish in-flight work, remove the hooks and close the timeline.

        Example::

            >>> opt.close()   # doctest: +SKIP
        """
        self.synchronize()
        self._watch_forward(False)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._timeline is not None:
            self._timeline.close()

    @property
    def max_in_flight_bytes(self) -> int:
        """The most gradient bytes this rank ever had in flight while scheduling."""
        return self._dispatcher.max_in_flight if self._dispatcher is not None else 0

    def _dispatched(self) -> list[int]:
        if self._dispatcher is not None:
            return self._dispatcher.issued
        return self._buckets.last_issued if self._buckets is not None else []

    def _config(self) -> dict[str, object]:
        return {
            **self._shared_config(self.mode, self._engine, self.min_saving, self.options),
            "auto_tune": self.options.auto_tune,
            "timeline": self.options.timeline,
            "world": self.world,
            "parameters": len(self._params),
        }

    # -- hooks ----------------------------------------------------------------------------

    def _sync_buffers(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            with torch.no_grad():  # the control group: dispatcher threads use the other one
                dist._broadcast_coalesced(self._control, self._buffers, _BROADCAST_BYTES, 0)

    def _watch_forward(self, on: bool) -> None:
        """Add (``on``) or remove the forward pre-hooks of the modules holding parameters."""
        if on and not self._forward_hooks:
            self._forward_hooks = [
                m.register_forward_pre_hook(self._pre_forward) for m in self._modules
            ]
        elif not on:
            for handle in self._forward_hooks:
                handle.remove()
            self._forward_hooks = []

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        own = self._module_params[id(module)]
        if self._engine is None:
            self._first_use.update(dict.fromkeys(own))
            return
        dispatcher = self._dispatcher
        if dispatcher is None or not self._released or self._updated[own].all():
            return
        if not self._reduced[own].all():
            start = time.perf_counter()
            with self._cv:
                self._cv.wait_for(lambda: self._reduced[own].all() or dispatcher.failed)
            if dispatcher.failed:
                dispatcher.wait_all()
            end = time.perf_counter()
            self._forward_wait += end - start
            if self._timeline is not None:
                name = self._module_names[id(module)]
                self._timeline.span(name, "forward wait", start, end)
        self._apply_reduced()

    def _hook(self, i: int):
        def hook(p: torch.Tensor) -> None:
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            if self._dispatcher is not None and self._released:
                self._begin_step(self._dispatcher)
            self._post(i, p.grad)

        return hook

    def _post(self, i: int, grad: torch.Tensor | None) -> None:
        self._seen[i] = True
        self._ready_at[i] = time.perf_counter()
        if self._engine is None:
            return
        t = int(self._slot[i])
        if self._buckets is not None:
            self._buckets.post(t, grad)
            return
        self._packing.fill(t, grad)
        assert self._dispatcher is not None  # the scheduled engine
        self._dispatcher.ready(t)

    # -- engines ----------------------------------------------------------------------------

    def _setup(self) -> None:
        """First step: agree on the priority, then reduce everything in one bucket."""
        n = len(self._params)
        rest = [t for t in range(n) if t not in self._first_use]
        ready = np.nan_to_num(self._ready_at - np.nanmin(self._ready_at), nan=0.0)
        agreed = self._agree(np.concatenate([[*self._first_use, *rest], ready]))
        self._priority = agreed[:n].astype(np.int64).tolist()
        self._slot = np.empty(n, dtype=np.int64)
        self._slot[self._priority] = np.arange(n)
        self._ordered = [self._params[t] for t in self._priority]
        self._numel = np.array([p.numel() for p in self._ordered], np.int64)
        self._itemsize = np.array([p.element_size() for p in self._ordered], np.int64)
        self._dtype_key = np.array(
            [zlib.crc32(str(p.dtype).encode()) for p in self._ordered], np.int64
        )
        if self.options.timeline:
            path = timeline_path(self.options.timeline, self.rank, self.world)
            self._timeline = Timeline(path, self.rank)
        everything = bucket_layout(self._numel, self._itemsize, 1 << 62, 1 << 62, self._dtype_key)
        self._use_buckets(everything, np.arange(everything.num_partitions))
        for t in range(n):
            i = self._priority[t]
            assert self._buckets is not None
            self._buckets.post(t, self._params[i].grad if self._seen[i] else None)
        self._first_ready = agreed[n:][self._priority]

    def _use_buckets(self, layout: Layout, order: np.ndarray) -> None:
        self._engine = "bucketed"
        self._watch_forward(False)
        self._layout = layout
        packing = Packing(layout, self._ordered, self.world)
        self._buckets = Buckets(packing, order, self._group)
        self._label(layout, 0)

    def _label(self, layout: Layout, credit_bytes: int) -> None:
        names = [self._names[i] for i in self._priority]
        self._record = PlanRecord(layout, names, layout.partition_bytes, credit_bytes)

    def _finish_buckets(self, now: float) -> None:
        """Bucketed step: wait for every bucket, update once, measure, maybe switch engine."""
        buckets = self._buckets
        assert buckets is not None
        first = self._steps == 0
        buckets.finish()
        # Exposed communication ends here: the update below costs the same with scheduling.
        reduced = time.perf_counter()
        for t, param in enumerate(self._ordered):
            if not buckets.packing.used[t]:
                param.grad = None  # no rank used it: DDP leaves it without a gradient
        self.optimizer.step()
        for param in self._ordered:
            param.grad = None
        if self._timeline is not None:
            self._timeline.span("gradients reduced", "gradient wait", now, reduced)
        self._record_step(now, reduced - now, 0.0, buckets.link_busy(reduced))
        if first:
            self._after_first_step()
        else:
            self._maybe_observe()

    def _after_first_step(self) -> None:
        ready = np.asarray(self._first_ready, dtype=np.float64)
        layout = bucket_layout(
            self._numel, self._itemsize, BUCKET_BYTES, FIRST_BUCKET_BYTES, self._dtype_key
        )
        self._bucket_plan = (layout, fifo_order(layout, ready))
        if self.mode == "scheduled":
            self._start_scheduling(ready)
            return
        if self.mode == "auto":
            total = int((self._numel * self._itemsize).sum())
            settings = candidates(total, self.options.partition_bytes, self.options.credit_bytes)
            accelerator = any(p.device.type != "cpu" for p in self._params)
            self._trial = AutoTrial(
                settings, self.min_saving, accelerator=accelerator, announce=self.rank == 0
            )
        self._use_buckets(*self._bucket_plan)
        self._history.restart()

    def _maybe_observe(self) -> None:
        """mode="auto": once the trial's window is measured, gather every rank's medians,
        feed their mean to the trial and switch to the setting it names."""
        trial = self._trial
        if trial is None:
            return
        if trial.generation != self._generation:  # reopened: a fresh bucketed window
            self._generation = trial.generation
            self._switch(trial.current)
            self._history.restart()
            return
        if not trial.window_steps or self._history.fresh < trial.window_steps:
            return
        mine = self._history.window().values()
        window = Window.agreed(self._gather(mine))
        self._switch(trial.observe(window))

    def _switch(self, target: Candidate) -> None:
        """At a step boundary, run ``target`` from the next step on (every rank alike)."""
        if target == self.setting:
            return
        knobs = (target.partition_bytes, target.credit_bytes)
        if target.engine == "bucketed":  # park the scheduled engine, measure bucketed steps
            assert self._dispatcher is not None
            self._dispatcher.wait_all()
            self._apply_reduced()
            self._released = False
            self._parked = {name: getattr(self, name) for name in _SCHEDULED_STATE}
            self._use_buckets(*self._bucket_plan)
        elif self._engine == "scheduled":
            assert self._dispatcher is not None
            self._replan(self._dispatcher, knobs)
        elif self._parked is not None:  # back to the parked engine, with target's knobs
            for name, value in self._parked.items():
                setattr(self, name, value)
            self._parked = self._buckets = None
            self._engine = "scheduled"
            self._watch_forward(True)
            assert self._dispatcher is not None
            self._replan(self._dispatcher, knobs)
            self._begin_step(self._dispatcher)
        else:
            ready = np.nan_to_num(self._ready_at[self._priority] - np.nanmin(self._ready_at))
            self._start_scheduling(self._agree(ready), knobs)
        self._history.restart()

    def _start_scheduling(self, ready: np.ndarray, knobs: tuple[int, int] | None = None) -> None:
        self._buckets = None
        self._engine = "scheduled"
        self._watch_forward(True)
        opts = self.options if knobs is None else self.options.with_knobs(*knobs)
        if opts.auto_tune and knobs is None:
            self._tuner = AutoTuner.default_grid(int((self._numel * self._itemsize).sum()))
            opts = opts.with_knobs(*self._tuner.current)
        self._dispatcher = Dispatcher(
            self._start, self._wait, self._on_complete, self._timeline, on_failure=self._wake
        )
        self._build(opts, ready)
        self._begin_step(self._dispatcher)
        self._released = False
        self._history.restart()

    def _record_step(
        self, now: float, after_backward: float, forward_wait: float, busy: float
    ) -> None:
        # CPU time only while mode="auto" decides on CPU-only training: with many threads
        # busy on a loaded machine, reading it took milliseconds (profiled), a step's cost.
        measuring = self._trial is not None and self._trial.measuring_cpu
        start = self._history.record(now, after_backward, forward_wait, measuring, busy)
        if start is not None and self._timeline is not None:
            mode = self._engine or "bucketed"
            self._timeline.step(start, now, after_backward, forward_wait, mode)

    # -- the scheduled engine ---------------------------------------------------------------

    def _release(self, now: float) -> None:
        """Scheduled step: release the updates, measure, maybe re-plan."""
        dispatcher = self._dispatcher
        assert dispatcher is not None
        previous = self._history.last_call
        # Updates still in flight must use this step's hyper-parameters, even when an LR
        # scheduler changes the optimizer's groups as soon as step() returns.
        self._hyper = [
            {k: v for k, v in group.items() if k != "params"}
            for group in self.optimizer.param_groups
        ]
        self._released = True
        self._apply_reduced()
        # This forward waited for the previous step's gradients, all reduced at _reduced_at.
        after = max(0.0, self._reduced_at - previous) if previous is not None else 0.0
        self._record_step(now, after, self._forward_wait, self._link_busy)
        self._forward_wait = 0.0
        knobs = None
        if self._tuner is not None and previous is not None:
            knobs = self._tuner.record(now - previous)
        settled = (self._trial is None or self._trial.settled) and (
            self._tuner is None or self._tuner.best is not None
        )
        refresh = knobs is None and self._plan_due(settled)
        if knobs is not None or refresh:
            self._replan(dispatcher, knobs)
        if refresh:  # the re-plan's wait is no step's
            self._history.restart()
        else:
            self._maybe_observe()
