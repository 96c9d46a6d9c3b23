"""Gradient-priority communication scheduling (ByteScheduler) for ``torch.distributed``.

``ScheduledOptimizer(model, optimizer)`` wraps a model and any ``torch.optim`` optimizer whose
update of one parameter depends only on that parameter (SGD, Adam, AdamW, RMSprop, Adagrad,
...; not LBFGS). Per-parameter gradient hooks post tasks to a ``chronica.comm.Dispatcher``,
which all-reduces partitions asynchronously in a rank-identical order under credit; once all
partitions of a parameter are averaged, and ``step()`` was called, that parameter alone is
updated by the wrapped optimizer; a forward pre-hook on each module waits for its own
parameters only, so the next forward starts while later layers' gradients still travel.

The first step discovers the priority (order of first use in the forward pass) and reduces
everything before updating; rank 0's priority, measured ready times and bandwidth are
broadcast so every rank builds the same partitions and order.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chronica.core.priority import GradientQueue, build_layout, fifo_order, simulate_order
from chronica.runtime.dispatcher import AutoTuner, Dispatcher, SchedulingOptions
from chronica.runtime.timeline import Timeline, timeline_path

__all__ = ["ScheduledOptimizer"]

log = logging.getLogger("chronica")

_REFRESH_STEPS = (1, 3)  # re-measure ready times and bandwidth once warm


class ScheduledOptimizer:
    """Priority-scheduled gradient averaging plus per-parameter updates for ``optimizer``.

    Use it in place of the optimizer: ``loss.backward(); opt.step()``. ``step()`` returns while
    gradients may still be in flight; the next forward waits, module by module, for exactly
    the parameters it uses. Guarantees: after any number of steps and ``synchronize()``, the
    parameters and optimizer state equal those of ``all_reduce``-average then
    ``optimizer.step()`` (bitwise when the all-reduce sums in the same order); collectives are
    issued in the same order on every rank. Gradients are cleared per parameter once it is
    updated, so ``zero_grad()`` does nothing and gradient accumulation over several backward
    passes is not supported. Call ``synchronize()`` before evaluating, checkpointing or
    reading parameters outside the model's forward. A model wrapped in
    ``DistributedDataParallel`` is refused (``ValueError``): DDP averages the gradients itself.
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
        self.model = model
        self.optimizer = optimizer
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
        self._dispatcher: Dispatcher | None = None
        self._timeline: Timeline | None = None
        if self.world == 1:
            return  # nothing to communicate: step() is the optimizer's own step
        ranks = dist.get_process_group_ranks(self._group)
        self._src = ranks[0]
        self._control = dist.new_group(ranks, backend="gloo")
        self._first_use: dict[int, None] = {}
        self._ready_seen: dict[int, None] = {}
        self._cv = threading.Condition()
        self._update_lock = threading.Lock()
        self._released = False
        self._updated = np.ones(len(self._params), dtype=bool)
        self._left = np.zeros(len(self._params), dtype=np.int64)
        self._pending: list[int] = []
        self._hyper: list[dict[str, Any]] = []
        self._steps = 0
        self._last_step_time: float | None = None
        self._tuner: AutoTuner | None = None
        self._module_params: dict[int, list[int]] = {}
        for module in model.modules():
            own = [
                self._index[id(p)] for p in module.parameters(recurse=False) if id(p) in self._index
            ]
            if own:
                self._module_params[id(module)] = own
                self._handles.append(module.register_forward_pre_hook(self._pre_forward))
        for i, p in enumerate(self._params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._hook(i)))

    # -- public API ---------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing when scheduling (gradients are cleared as parameters are updated)."""
        if self._dispatcher is None and self.world == 1:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Release this step's updates; returns before communication necessarily finished."""
        if self.world == 1:
            self.optimizer.step()
            return
        now = time.perf_counter()
        step_time = None if self._last_step_time is None else now - self._last_step_time
        self._last_step_time = now
        dispatcher = self._setup() if self._dispatcher is None else self._dispatcher
        for t in range(len(self._params)):
            if t not in self._ready_seen:
                p = self._params[t]
                if p.grad is None:  # unused this step: take part with a zero gradient
                    p.grad = torch.zeros_like(p)
                self._post(t)
        with self._update_lock:
            # Updates still in flight must use this step's hyper-parameters, even when an LR
            # scheduler changes the optimizer's groups as soon as step() returns.
            self._hyper = [
                {k: v for k, v in group.items() if k != "params"}
                for group in self.optimizer.param_groups
            ]
            with self._cv:
                self._released = True
                batch, self._pending = self._pending, []
            self._apply(batch)
        self._steps += 1
        knobs = None
        if self._tuner is not None and step_time is not None:
            knobs = self._tuner.record(step_time)
        if knobs is not None or self._steps in _REFRESH_STEPS:
            self._replan(dispatcher, knobs)

    def synchronize(self) -> None:
        """Wait until every released update is applied: parameters are current afterwards."""
        if self._dispatcher is not None and self._released:
            self._dispatcher.wait_all()

    def state_dict(self) -> dict[str, Any]:
        self.synchronize()
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.synchronize()
        self.optimizer.load_state_dict(state_dict)

    def close(self) -> None:
        """Finish in-flight work, remove the hooks and close the timeline."""
        self.synchronize()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._dispatcher is not None:
            self._dispatcher.close()

    @property
    def max_in_flight_bytes(self) -> int:
        """The most gradient bytes this rank ever had in flight."""
        return self._dispatcher.max_in_flight if self._dispatcher is not None else 0

    @property
    def credit_bytes(self) -> int:
        """The credit in force (``options.credit_bytes`` unless auto-tuned)."""
        return self._queue.credit_bytes if self._dispatcher is not None else 0

    @property
    def partition_bytes(self) -> int:
        """The partition size in force (``options.partition_bytes`` unless auto-tuned)."""
        return self._layout.partition_bytes if self._dispatcher is not None else 0

    @property
    def last_dispatch(self) -> list[str]:
        """Partitions of the latest step in the order they were issued (same on every rank)."""
        return [self._part_names[p] for p in self._dispatcher.issued] if self._dispatcher else []

    def partition_shapes(self) -> list[list[tuple[str, int, int]]]:
        """Each partition as ``(parameter name, start, stop)`` element ranges, by priority."""
        return [
            [(self._names[self._priority[t]], a, b) for t, a, b in self._layout.segments(p)]
            for p in range(self._layout.num_partitions)
        ]

    # -- hooks ----------------------------------------------------------------------------

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        own = self._module_params[id(module)]
        dispatcher = self._dispatcher
        if dispatcher is None:
            self._first_use.update(dict.fromkeys(own))
            return
        if self._released and not self._updated[own].all():
            start = time.perf_counter()
            with self._cv:
                self._cv.wait_for(lambda: self._updated[own].all() or dispatcher.failed)
            if dispatcher.failed:
                dispatcher.wait_all()
            if self._timeline is not None:
                name = self._module_names[id(module)]
                self._timeline.span(name, "forward wait", start, time.perf_counter())

    def _hook(self, i: int):
        def hook(p: torch.Tensor) -> None:
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            if self._dispatcher is not None and self._released:
                self._begin_step(self._dispatcher)
            self._post(i)

        return hook

    def _post(self, t: int) -> None:
        self._ready_seen[t] = None
        if self._dispatcher is not None:
            self._dispatcher.ready(self._slot[t])

    # -- step machinery -------------------------------------------------------------------

    def _begin_step(self, dispatcher: Dispatcher) -> None:
        dispatcher.wait_all()
        with self._cv:
            self._released = False
            self._updated[:] = False
            self._left[:] = self._parts_per_param
            self._ready_seen = {}
        dispatcher.begin(self._queue, self._part_names)

    def _setup(self) -> Dispatcher:
        """First step: agree on the priority, reduce everything, update, then plan."""
        rest = [t for t in range(len(self._params)) if t not in self._first_use]
        priority = self._agree(np.asarray([*self._first_use, *rest], dtype=np.int64))
        self._priority = priority.tolist()
        self._slot = np.empty(len(priority), dtype=np.int64)
        self._slot[priority] = np.arange(len(priority))
        self._numel = np.array([self._params[t].numel() for t in self._priority], np.int64)
        self._itemsize = np.array(
            [self._params[t].element_size() for t in self._priority], np.int64
        )
        self._dtype_key = np.array(
            [zlib.crc32(str(self._params[t].dtype).encode()) for t in self._priority], np.int64
        )
        opts = self.options
        if opts.auto_tune:
            self._tuner = AutoTuner.default_grid(int((self._numel * self._itemsize).sum()))
            opts = opts.with_knobs(*self._tuner.current)
        if opts.timeline:
            path = timeline_path(opts.timeline, self.rank, self.world)
            self._timeline = Timeline(path, self.rank)
        dispatcher = Dispatcher(self._start, self._wait, self._on_complete, self._timeline)
        self._dispatcher = dispatcher
        # Until measured, assume gradients arrive in backward order (reverse priority).
        self._build(opts, np.arange(len(priority), 0, -1, dtype=np.float64))
        dispatcher.begin(self._queue, self._part_names)
        self._updated[:] = False
        self._left[:] = self._parts_per_param
        seen, self._ready_seen = self._ready_seen, {}
        for t in seen:
            self._post(t)
        return dispatcher

    def _build(self, opts: SchedulingOptions, tensor_ready: np.ndarray, rate: float = 0.0) -> None:
        layout = build_layout(self._numel, self._itemsize, opts.partition_bytes, self._dtype_key)
        if opts.order == "fifo" or rate <= 0:
            order = fifo_order(layout, tensor_ready)
        else:
            order = simulate_order(layout, tensor_ready, opts.credit_bytes, rate)
        self._queue = GradientQueue(layout, order, opts.credit_bytes)
        self._layout = layout
        self._current = opts
        self._parts_per_param = np.empty(len(self._params), dtype=np.int64)
        self._parts_per_param[self._priority] = layout.parts_per_tensor()
        names = [self._names[i] for i in self._priority]
        self._part_names = [layout.label(p, names) for p in range(layout.num_partitions)]

    def _replan(self, dispatcher: Dispatcher, knobs: tuple[int, int] | None) -> None:
        """At a step boundary: finish, then rebuild from rank 0's measurements and knobs."""
        dispatcher.wait_all()
        stats = dispatcher.stats()
        ready = np.nan_to_num(stats.tensor_ready, nan=0.0)
        rate = stats.bytes_per_second if np.isfinite(stats.bytes_per_second) else 0.0
        part, credit = knobs or (self._current.partition_bytes, self._current.credit_bytes)
        agreed = self._agree(np.concatenate([ready, [rate, part, credit]]).astype(np.float64))
        n = len(self._params)
        opts = self._current.with_knobs(int(agreed[n + 1]), int(agreed[n + 2]))
        self._build(opts, agreed[:n], float(agreed[n]))
        log.debug(
            "chronica replan at step %d: %s, %d partitions",
            self._steps,
            opts,
            self._layout.num_partitions,
        )

    def _agree(self, values: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(np.ascontiguousarray(values))
        dist.broadcast(tensor, src=self._src, group=self._control)
        return tensor.numpy()

    # -- dispatcher callables (run on the dispatcher's threads) ----------------------------

    def _views(self, partition: int) -> list[torch.Tensor]:
        return [
            self._params[self._priority[t]].grad.view(-1)[a:b]
            for t, a, b in self._layout.segments(partition)
        ]

    def _start(self, partition: int) -> tuple[torch.Tensor, list[torch.Tensor], Any]:
        views = self._views(partition)
        buf = views[0] if len(views) == 1 else torch.cat(views)
        work = dist.all_reduce(buf, group=self._group, async_op=True)
        return buf, views, work

    def _wait(self, partition: int, handle: tuple[torch.Tensor, list[torch.Tensor], Any]) -> None:
        buf, views, work = handle
        work.wait()
        buf.div_(self.world)
        if len(views) > 1:
            for view, part in zip(views, buf.split([v.numel() for v in views]), strict=True):
                view.copy_(part)

    def _on_complete(self, partition: int) -> None:
        done = []
        with self._cv:
            for t, _, _ in self._layout.segments(partition):
                i = self._priority[t]
                self._left[i] -= 1
                if self._left[i] == 0:
                    done.append(i)
            if not self._released:
                self._pending.extend(done)
                return
        with self._update_lock:
            self._apply(done)

    def _apply(self, indices: Iterable[int]) -> None:
        """Step the wrapped optimizer on exactly ``indices`` (caller holds the update lock)."""
        indices = list(indices)
        if not indices:
            return
        groups: dict[int, list[torch.Tensor]] = {}
        for i in indices:
            p = self._params[i]
            groups.setdefault(self._group_of[id(p)], []).append(p)
        saved = self.optimizer.param_groups
        self.optimizer.param_groups = [dict(self._hyper[g], params=ps) for g, ps in groups.items()]
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = saved
        for i in indices:
            self._params[i].grad = None
        with self._cv:
            self._updated[indices] = True
            self._cv.notify_all()
