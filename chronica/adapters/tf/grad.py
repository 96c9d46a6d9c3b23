"""Gradient-priority communication scheduling (ByteScheduler) for ``tf.distribute`` custom loops.

``ScheduledAllReduce`` replaces the single all-reduce of a gradient list in a replica context
(``strategy.run`` under ``MultiWorkerMirroredStrategy``) by one collective per partition:
gradients are laid out in priority order (first use in the forward pass), big ones sliced and
small adjacent ones fused (``chronica.core.priority.build_layout``), and the partitions are
issued in a rank-identical sequence (``fifo_order`` or ``simulate_order``), each gated on the
completion of earlier ones so that at most ``credit_bytes`` plus one partition are in flight.
``apply_gradients`` then hands the reduced gradients to a Keras optimizer, whose per-variable
updates depend only on their own variable's partitions.

What TensorFlow (2.21, ``tf.function``) does and allows, which shapes this adapter:

- **Order is the program order.** TF builds one graph per trace; a collective's instance key
  is a call-time capture assigned in creation order, so every worker that traces the same step
  issues the same collectives in the same order. The sequence here is a pure function of the
  variables' shapes, dtypes, first-use order and the knobs; it is planned at trace time from a
  static model of backward (gradients appear in reverse priority order, at a rate of one byte
  per byte of parameters; the link is ``comm_ratio`` times slower), not measured, because the
  graph cannot change between steps without retracing on every worker.
- **TF serialises collectives itself.** Each launcher threads an *ordering token* resource
  through its ``CollectiveReduceV2`` ops and automatic control dependencies chain ops on one
  resource, so a collective starts only after the previous one *finished*: one partition in
  flight, which is within the credit bound. The credit gates (partition ``j`` waits for every
  partition up to the last one that would leave less than ``credit_bytes`` in flight) still
  carry the bound where collectives are not token-ordered. Auto-tuning is not offered: new
  knobs mean a new graph.
- **Crossing the iteration barrier.** Inside one ``tf.function`` the executor runs an op as
  soon as its inputs are ready, so a variable's update starts when its own partitions are
  reduced, while later partitions are still travelling. The ``tf.function`` return is a
  barrier (it waits for every stateful op), and so is each iteration of a ``tf.while_loop``
  (``for _ in tf.range(n)``). Only steps unrolled in Python inside one function cross it:
  automatic control dependencies then order a read of a variable only after that variable's
  last write, so step ``k + 1``'s first layers run while step ``k``'s last partitions are
  reduced. ``multi_step`` builds such a function.
- **Priority** is recorded from the graph being traced: the order in which ops first touch
  each variable's resource handle (``GradientTape.watched_variables()`` is sorted by variable
  id, i.e. creation order, so it cannot be used). ``forward_order`` does the same for any
  function; ``priority=`` takes an explicit order; in eager mode the given order is used.
- **Timeline.** Per-partition times inside a graph come from ``tf.numpy_function`` markers,
  built only when a timeline path is set: a stateless one when the partition's gradients are
  ready, stateful ones before and after its collective (automatic control dependencies chain
  stateful markers in program order, which matches the token order of the collectives).

- **``mode="auto"``** (as torch's and JAX's shims: ``chronica.runtime.auto.AutoTrial``)
  starts with DDP's buckets in backward order, measures steps with ``tf.numpy_function``
  markers (built only while the trial runs) and switches engines by tracing again: between
  the calls of a ``multi_step`` function, or at each call when steps run eagerly. In a
  ``tf.function`` of your own the engine is the one in force when it was traced.

Sparse gradients (``tf.IndexedSlices``) go through the strategy's own sparse all-reduce,
after the dense partitions. With one replica nothing is built: gradients pass through.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf.grad_agree import agreed_window, worker_rank
from chronica.adapters.tf.grad_graph import (
    CollectiveChain,
    first_use,
    forward_order,
    issue_marker,
    mark_end,
    mark_issue,
    multi_step,
    pack_one,
    pack_partitions,
    tracing_for,
    unpack_partitions,
    variable_name,
)
from chronica.core.checks import check_number
from chronica.core.priority import Layout, bucket_layout, build_layout, fifo_order, simulate_order
from chronica.runtime.auto import BUCKETED, AutoTrial, Candidate, candidates, check_mode
from chronica.runtime.dispatcher import SchedulingOptions
from chronica.runtime.gradients import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    GradientViews,
    PlanRecord,
    StepHistory,
    link_busy,
)
from chronica.runtime.timeline import Exposure, Timeline, timeline_path

__all__ = [
    "ScheduledAllReduce",
    "forward_order",
    "multi_step",
    "pack_partitions",
    "unpack_partitions",
]

log = logging.getLogger("chronica")

# -- the reducer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """One gradient pattern's partitions and issue order (identical on every worker)."""

    slots: tuple[int, ...]  # variable index of each layout tensor, in priority order
    sparse: tuple[int, ...]  # variables reduced by the strategy's sparse path, afterwards
    layout: Layout
    order: tuple[int, ...]  # partition indices in issue order
    record: PlanRecord


def _already_reduced(grads_and_vars: Iterable[Any]) -> list[Any]:
    return list(grads_and_vars)


class ScheduledAllReduce(GradientViews):
    """Priority-ordered, partitioned, credit-limited all-reduce of gradients in a replica context.

    Call ``all_reduce(grads, variables)`` or ``apply_gradients(optimizer, grads_and_vars)``
    inside ``strategy.run`` (in a ``tf.function`` for any overlap). Guarantees:

    - the reduced gradients equal ``ReplicaContext.all_reduce(reduce_op, grads)`` elementwise
      (bitwise when the collective sums in the same order, e.g. two workers: ``a + b``);
      ``apply_gradients`` equals ``optimizer.apply_gradients`` after that all-reduce;
    - every worker that traces the same step issues the same collectives in the same order
      (``dispatch_order``), a pure function of shapes, dtypes, first-use order and knobs;
    - in a graph, partition ``j`` starts only after every partition but the last ones holding
      less than ``credit_bytes`` completed: at most ``credit_bytes`` plus one partition are in
      flight, across calls in one graph too (``max_in_flight_bytes``); a sparse gradient,
      whose size is known only at run time, is reduced alone, after the partitions;
    - with one replica nothing is built: ``all_reduce`` returns its input and
      ``apply_gradients`` is the optimizer's own.

    The priority (first-use order) and the partitions are fixed at the first call; later
    calls must pass the same variables. Knobs come from the arguments or ``CHRONICA_*``
    variables (see ``SchedulingOptions``); ``comm_ratio`` is how many times longer reducing a
    gradient byte takes than backward takes to produce it, for the static plan of
    ``order="priority"`` (about 1 or less gives the backward order; larger values move early
    layers ahead of queued later ones, which pays off with ``multi_step``).

    Args:
        partition_bytes: partitions' size: bigger tensors are cut, smaller ones fused (bytes,
            ``"1MiB"``; ``CHRONICA_PARTITION_BYTES``).
        credit_bytes: bytes in flight at most, plus one partition (``CHRONICA_CREDIT_BYTES``).
        order: ``"priority"`` (first layers first) or ``"fifo"`` (backward order).
        timeline: Chrome-trace path (``CHRONICA_TIMELINE``; ``{rank}`` is replaced).
        priority: variables, first used first (``forward_order``); ``None``: read from the
            graph being traced.
        comm_ratio: seconds to reduce a gradient byte over seconds of backward per byte.
        reduce_op: ``ReduceOp.SUM`` (as Keras) or ``ReduceOp.MEAN`` (or their names).
        communication_options: passed to the strategy's all-reduce.
        mode: ``"auto"`` (measure, search, decide: ``chronica.runtime.auto.AutoTrial``),
            ``"scheduled"`` (priority scheduling) or ``"bucketed"`` (DDP's buckets).
        min_saving: in ``"auto"``, try scheduling only if it could save this fraction of the
            step time (0 to 1; 1 never tries).

    Example::

        >>> reducer = ScheduledAllReduce(partition_bytes="1MiB", mode="auto")  # doctest: +SKIP
        >>> reducer.apply_gradients(optimizer, zip(grads, variables))         # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        partition_bytes: int | str | None = None,
        credit_bytes: int | str | None = None,
        order: str | None = None,
        timeline: str | None = None,
        priority: Sequence[Any] | None = None,
        comm_ratio: float = 1.0,
        reduce_op: tf.distribute.ReduceOp | str = tf.distribute.ReduceOp.SUM,
        communication_options: tf.distribute.experimental.CommunicationOptions | None = None,
        mode: str = "scheduled",
        min_saving: float = 0.05,
    ) -> None:
        self.mode = check_mode(mode)
        self.min_saving = check_number(
            "min_saving", min_saving, 0.0, 1.0, hint=" (a fraction of the step time)"
        )
        self.options = SchedulingOptions.resolve(
            partition_bytes, credit_bytes, order, auto_tune=False, timeline=timeline
        )
        if os.environ.get("CHRONICA_AUTOTUNE", "0").lower() in ("1", "true", "yes"):
            log.warning(
                "CHRONICA_AUTOTUNE is ignored by the TensorFlow adapter: the partitions are "
                "fixed when the step is traced; set CHRONICA_PARTITION_BYTES/CREDIT_BYTES"
            )
        if isinstance(comm_ratio, bool) or not isinstance(comm_ratio, (int, float)):
            raise TypeError(f"comm_ratio={comm_ratio!r} must be a number (1.0 when unsure)")
        if not math.isfinite(comm_ratio) or comm_ratio <= 0:
            raise ValueError(
                f"comm_ratio={comm_ratio!r} must be a positive number (seconds to reduce a "
                "gradient byte over seconds of backward per byte; 1.0 when unsure)"
            )
        if isinstance(reduce_op, str) and reduce_op.upper() in ("SUM", "MEAN"):
            reduce_op = tf.distribute.ReduceOp(reduce_op.upper())
        if reduce_op not in (tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN):
            raise ValueError(f"reduce_op={reduce_op!r} must be ReduceOp.SUM or ReduceOp.MEAN")
        if communication_options is not None and not isinstance(
            communication_options, tf.distribute.experimental.CommunicationOptions
        ):
            raise TypeError(
                "communication_options must be a "
                "tf.distribute.experimental.CommunicationOptions or None"
            )
        if priority is not None and isinstance(priority, (str, bytes)):
            raise TypeError("priority must be a sequence of variables, first used first")
        self.comm_ratio = float(comm_ratio)
        self.reduce_op = reduce_op
        self.communication_options = communication_options
        self._priority_arg = None if priority is None else list(priority)
        self._variables: list[Any] | None = None
        self._priority: list[int] | None = None
        self._plans: dict[tuple[str, tuple[int, int], tuple[str, ...]], _Plan] = {}
        self._plan: _Plan | None = None
        self._sequences: weakref.WeakKeyDictionary[Any, CollectiveChain]
        self._sequences = weakref.WeakKeyDictionary()
        self._last_sequence: CollectiveChain | None = None
        self._timeline: Timeline | None = None
        self._timeline_opened = False
        # mode="auto": bucketed (DDP's buckets, backward order) until the trial decides.
        self._engine = "scheduled" if mode == "scheduled" else "bucketed"
        self._trial: AutoTrial | None = None  # mode="auto": set up at the first call
        self._setting: Candidate = BUCKETED  # mode="auto": the setting in force
        self._generation = 0  # the trial's generation the history's window belongs to
        self._history = StepHistory()
        self._reduced_in = 0.0  # seconds from a step's gradients to its last partition
        self._link_busy = 0.0  # seconds the link needed for a step's partitions
        self._strategy: Any = None
        self._replicas = 1

    # -- public API -----------------------------------------------------------------------

    # Planning is Python over static shapes: AutoGraph converting it would only cost seconds.
    @tf.autograph.experimental.do_not_convert
    def all_reduce(
        self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None], variables: Sequence[Any]
    ) -> list[tf.Tensor | tf.IndexedSlices | None]:
        """Reduce ``grads`` (aligned with ``variables``) across replicas; ``None`` stays.

        Args:
            grads: one gradient (or ``None``) per variable.
            variables: the variables, the same list at every call.

        Example::

            >>> reduced = reducer.all_reduce(grads, model.trainable_variables)   # doctest: +SKIP
        """
        grads, variables = list(grads), list(variables)
        if len(grads) != len(variables):
            raise ValueError(
                f"got {len(grads)} gradients for {len(variables)} variables: pass one "
                "gradient (or None) per variable"
            )
        ctx = self._replica_context()
        if ctx is None:
            return grads
        self._strategy = tf.distribute.get_strategy()
        self._replicas = ctx.num_replicas_in_sync
        eager = tf.executing_eagerly()
        if eager:
            self.decide(ctx)  # steps run eagerly: each call is a step boundary
        else:
            reducers = tracing_for()
            if reducers is not None and self not in reducers:
                reducers.append(self)
        self._bind(variables)
        kinds = tuple(
            "n" if g is None else "s" if isinstance(g, tf.IndexedSlices) else "d" for g in grads
        )
        key = (self._engine, self._knob_pair(), kinds)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._build(kinds, variables)
        self._plan = plan
        self._record = plan.record
        timeline = self._open_timeline(ctx)
        if tf.executing_eagerly():
            seq = CollectiveChain()
        else:
            graph = tf.compat.v1.get_default_graph()
            known = self._sequences.get(graph)
            if known is None:
                known = self._sequences[graph] = CollectiveChain()
            seq = known
        self._last_sequence = seq
        credit = plan.record.credit_bytes or 1 << 62  # bucketed: nothing bounds them
        layout = plan.layout
        flat = [tf.reshape(grads[i], [-1]) for i in plan.slots]
        measuring = self._trial is not None and self._trial.window_steps > 0 and bool(flat)
        if measuring:  # when every dense gradient exists: the step's boundary
            started = tf.numpy_function(
                self._mark_step, [f[:1] for f in flat], tf.float64, stateful=False
            )
        reduced: list[Any] = [None] * layout.num_partitions
        edges = (plan.order[0], plan.order[-1]) if measuring else ()
        issued: list[tf.Tensor] = []  # the first and the last partition's issue markers
        for p in plan.order:
            nbytes = int(layout.part_bytes[p])
            buf = pack_one(flat, layout, p)
            gate = seq.gate(credit, nbytes)
            marks = mark_issue(buf, gate) if timeline is not None else None
            deps = [] if gate is None else [gate]
            if marks is not None or p in edges:  # when the collective may start
                deps.append(marks[1] if marks is not None else issue_marker(buf, gate))
                issued += deps[-1:] if p in edges else []
            if deps:
                with tf.control_dependencies(deps):
                    buf = tf.identity(buf)
            out = ctx.all_reduce(self.reduce_op, buf, options=self.communication_options)
            if timeline is not None and marks is not None:
                mark_end(timeline, plan.record.labels[p], p, nbytes, marks, out)
            seq.push(nbytes, [out])
            reduced[p] = out
        result: list[Any] = list(grads)
        shapes = [tuple(variables[i].shape) for i in plan.slots]
        for i, tensor in zip(plan.slots, unpack_partitions(reduced, layout, shapes), strict=True):
            result[i] = tensor
        for i in plan.sparse:
            g = grads[i]
            assert g is not None  # plan.sparse lists the IndexedSlices
            gate = seq.gate_all()  # its size is known only at run time: it travels alone
            if gate is not None:
                with tf.control_dependencies([gate]):
                    g = tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
            out = ctx.all_reduce(self.reduce_op, g, options=self.communication_options)
            seq.push(credit, [out.values, out.indices])  # what follows waits for it
            result[i] = out
        if measuring:
            ends = [started, issued[0], issued[-1], *(r[:1] for r in reduced if r is not None)]
            sizes = int(layout.part_bytes[plan.order[-1]]), int(layout.part_bytes.sum())
            tf.numpy_function(functools.partial(self._mark_reduced, *sizes), ends, tf.float64)
        return result

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, optimizer: Any, grads_and_vars: Iterable[tuple[Any, Any]]) -> Any:
        """Reduce the gradients as ``all_reduce`` does, then apply them with ``optimizer``.

        ``optimizer`` is a Keras 3 optimizer (TensorFlow backend), built beforehand under the
        strategy's scope. Its own all-reduce is skipped for this call only; everything else
        (weight decay, clipping, loss scaling, the iteration count) is its unchanged code, so
        each variable's update waits only for that variable's reduced gradient.

        Args:
            optimizer: a built Keras 3 optimizer.
            grads_and_vars: ``(gradient, variable)`` pairs.

        Example::

            >>> reducer.apply_gradients(optimizer, zip(grads, variables))   # doctest: +SKIP
        """
        pairs = list(grads_and_vars)
        if self._replica_context() is None:
            return optimizer.apply_gradients(pairs)
        if not callable(getattr(optimizer, "_all_reduce_sum_gradients", None)):
            raise ValueError(
                f"optimizer={type(optimizer).__name__} is not a Keras 3 TensorFlow optimizer; "
                "call all_reduce() and apply the reduced gradients without re-reducing them"
            )
        grads = self.all_reduce([g for g, _ in pairs], [v for _, v in pairs])
        optimizer._all_reduce_sum_gradients = _already_reduced
        try:
            return optimizer.apply_gradients(zip(grads, (v for _, v in pairs), strict=True))
        finally:
            del optimizer._all_reduce_sum_gradients

    def stats(self) -> Exposure:
        """This worker's recent steps (medians), the engine in force and why (``decision``).

        Steps are measured only while ``mode="auto"`` decides or watches (markers in the
        graph); a step runs from one step's gradients to the next's, its reduction is all
        counted as exposed, and the link's busy time is all the bytes at the last partition's
        rate (``chronica.runtime.gradients.link_busy``). See ``chronica.runtime.timeline.Exposure``.

        Example::

            >>> reducer.stats().mode   # doctest: +SKIP
            'bucketed'
        """
        decision = self._trial.decision if self._trial is not None else ""
        return self._history.exposure(self._engine, decision)

    def decide(self, ctx: tf.distribute.ReplicaContext | None = None) -> bool:
        """``mode="auto"``: once a window of steps is measured, feed rank 0's medians (one
        small all-reduce) to the trial; True when the engine changed (trace again).

        ``MultiStep`` calls it between executions, ``all_reduce`` at each eager call.

        Args:
            ctx: the replica context when called inside ``strategy.run`` (eager steps).

        Example::

            >>> reducer.decide()   # doctest: +SKIP
            False
        """
        trial = self._trial
        if trial is None:
            return False
        if trial.generation != self._generation:  # reopened: a fresh window
            self._generation = trial.generation
            self._history.restart()
        elif trial.current == self._setting and 0 < trial.window_steps <= self._history.fresh:
            mine = self._history.window()
            trial.observe(agreed_window(mine, self._replicas, ctx, self._strategy))
        if trial.current == self._setting:
            return False
        self._setting = trial.current  # every worker switches here, to the same setting
        self._engine = trial.current.engine
        self._history.restart()
        return True

    @property
    def trial(self) -> AutoTrial | None:
        """``mode="auto"``'s trial (``None`` in other modes and before the first call);
        ``trial.reopen(why)`` on every worker at the same step decides again."""
        return self._trial

    @property
    def priority(self) -> list[str]:
        """Variable names, first used first (empty before the first multi-replica call)."""
        if self._priority is None or self._variables is None:
            return []
        return [variable_name(self._variables[i]) for i in self._priority]

    @property
    def dispatch_order(self) -> list[int]:
        """Partitions of the latest plan in issue order (the same on every worker)."""
        return list(self._plan.order) if self._plan is not None else []

    @property
    def layout(self) -> Layout | None:
        """The latest plan's ``Layout`` (tensors in priority order), or ``None``."""
        return self._plan.layout if self._plan is not None else None

    @property
    def max_in_flight_bytes(self) -> int:
        """The most bytes the latest traced graph's gates allow in flight (0 if none)."""
        return self._last_sequence.max_in_flight if self._last_sequence is not None else 0

    def _dispatched(self) -> list[int]:
        return self.dispatch_order

    def _unplanned(self) -> tuple[int, int]:
        return self.options.partition_bytes, self.options.credit_bytes

    def _config(self) -> dict[str, object]:
        return {
            **self._shared_config(self.mode, self._engine, self.min_saving, self.options),
            "timeline": self.options.timeline,
            "comm_ratio": self.comm_ratio,
            "reduce_op": getattr(self.reduce_op, "name", self.reduce_op),
            "priority": None if self._priority_arg is None else len(self._priority_arg),
        }

    def close(self) -> None:
        """Close the timeline file (complete JSON afterwards)."""
        if self._timeline is not None:
            self._timeline.close()

    # -- planning --------------------------------------------------------------------------

    def _knob_pair(self) -> tuple[int, int]:
        """The partition and credit bytes in force: ``mode="auto"``'s setting, else the
        options'."""
        if self._setting.engine == "scheduled":
            return self._setting.partition_bytes, self._setting.credit_bytes
        return self.options.partition_bytes, self.options.credit_bytes

    def _replica_context(self) -> tf.distribute.ReplicaContext | None:
        """The replica context, or ``None`` when there is nothing to communicate."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None:
            if tf.distribute.get_strategy().num_replicas_in_sync == 1:
                return None
            raise ValueError(
                "ScheduledAllReduce must be called in a replica context: inside the function "
                "passed to strategy.run(...)"
            )
        return None if ctx.num_replicas_in_sync == 1 else ctx

    def _bind(self, variables: list[Any]) -> None:
        if self._variables is None:
            self._variables = variables
            self._priority = self._discover_priority(variables)
            log.debug("chronica tf priority: %s", self.priority)
            if self.mode == "auto":
                total = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)
                opts = self.options
                self._trial = AutoTrial(
                    candidates(max(1, total), opts.partition_bytes, opts.credit_bytes),
                    self.min_saving,
                    accelerator=bool(tf.config.list_logical_devices("GPU")),
                    announce=worker_rank() == 0,
                )
        elif [id(v) for v in variables] != [id(v) for v in self._variables]:
            raise ValueError(
                "variables differ from those of the first call; use one ScheduledAllReduce "
                "per list of variables"
            )

    def _discover_priority(self, variables: list[Any]) -> list[int]:
        if self._priority_arg is not None:
            index = {id(v): i for i, v in enumerate(variables)}
            chosen = [index[id(v)] for v in self._priority_arg if id(v) in index]
            if len(chosen) != len(self._priority_arg) or len(set(chosen)) != len(chosen):
                raise ValueError(
                    "priority must list distinct variables among those being reduced, "
                    "first used first (e.g. forward_order(...))"
                )
            return [*chosen, *(i for i in range(len(variables)) if i not in set(chosen))]
        if tf.executing_eagerly():
            return list(range(len(variables)))
        return first_use(tf.compat.v1.get_default_graph(), variables)

    def _build(self, kinds: tuple[str, ...], variables: list[Any]) -> _Plan:
        assert self._priority is not None
        slots = tuple(i for i in self._priority if kinds[i] == "d")
        sparse = tuple(i for i in self._priority if kinds[i] == "s")
        numel = np.array([int(np.prod(variables[i].shape)) for i in slots], dtype=np.int64)
        dtypes = [tf.as_dtype(variables[i].dtype) for i in slots]
        itemsize = np.array([d.size for d in dtypes], dtype=np.int64)
        keys = np.array([d.as_datatype_enum for d in dtypes], dtype=np.int64)
        # Backward produces gradients in reverse priority order, one byte per unit of time.
        nbytes = (numel * itemsize).astype(np.float64)
        ready = np.cumsum(nbytes[::-1])[::-1]
        partition_bytes, credit = self._knob_pair()
        if self._engine == "bucketed":  # DDP's buckets, backward order, no credit gates
            layout = bucket_layout(numel, itemsize, BUCKET_BYTES, FIRST_BUCKET_BYTES, keys)
            credit = 0
        else:
            layout = build_layout(numel, itemsize, partition_bytes, keys)
        if self._engine == "bucketed" or self.options.order == "fifo" or not layout.num_partitions:
            order = fifo_order(layout, ready)
        else:
            order = simulate_order(layout, ready, credit, 1 / self.comm_ratio)
        names = [variable_name(variables[i]) for i in slots]
        record = PlanRecord(layout, names, layout.partition_bytes, credit)
        return _Plan(slots, sparse, layout, tuple(int(p) for p in order), record)

    # -- mode="auto": measured steps and rank 0's decision ------------------------------------

    def _mark_step(self, *_: Any) -> np.float64:
        now = time.perf_counter()
        trial = self._trial
        cpu = trial is not None and trial.measuring_cpu
        self._history.record(now, self._reduced_in, 0.0, cpu=cpu, busy=self._link_busy)
        return np.float64(now)

    def _mark_reduced(self, last_bytes: int, total: int, *marks: np.ndarray) -> np.float64:
        """Once every partition is reduced: ``marks`` are the step's start, the first and
        the last partition's issue times, then the partitions themselves."""
        now = time.perf_counter()
        self._reduced_in = now - float(marks[0])
        self._link_busy = link_busy(float(marks[1]), float(marks[2]), now, last_bytes, total)
        return np.float64(0.0)

    def _open_timeline(self, ctx: tf.distribute.ReplicaContext) -> Timeline | None:
        if not self._timeline_opened:
            self._timeline_opened = True
            if self.options.timeline:
                rank = worker_rank()
                world = ctx.num_replicas_in_sync
                path = timeline_path(self.options.timeline, rank, world)
                self._timeline = Timeline(path, rank)
                atexit.register(self._timeline.close)
        return self._timeline
