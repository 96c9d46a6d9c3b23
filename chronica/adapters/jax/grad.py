"""Gradient-priority communication scheduling (ByteScheduler) for multi-process JAX.

In a ``jax.distributed`` job where every process computes the gradients of its own batch
(``jax.grad`` of its local loss), ``ScheduledReducer`` replaces the cross-process mean of
the gradient pytree (``jax.lax.pmean`` over processes)::

    reducer = chronica.jax.ScheduledReducer(priority=chronica.jax.forward_order(loss, params, x))
    grads = grad_fn(params, x)                             # this process's gradients
    params = reducer.apply(grads, params, sgd)             # sgd(grads, params) -> params
    # or: for paths, mean_grads in reducer.iterate(grads): ...; or reducer.reduce(grads)

How the schedule is enforced. Leaves are laid out in *priority* order (order of first use in
the forward pass: ``priority=`` paths, e.g. from ``forward_order``; unlisted leaves follow in
tree order), cut and fused into partitions by ``chronica.core.priority.build_layout``. One
XLA program per partition performs exactly one cross-process all-reduce of that partition's
bytes (``psum`` under ``shard_map`` over a mesh of one device per process; gloo on CPU,
the default CPU collectives of jax 0.10). Programs are issued from the caller's thread in
the rank-identical order of ``simulate_order`` (``order="priority"``) or ``fifo_order``
(``order="fifo"``: backward order, last layer first), through a ``GradientQueue``: JAX
dispatch is asynchronous, so a partition is *in flight* from its issue until this process
has seen it finish with ``block_until_ready``; a partition is issued only while bytes in
flight are below ``credit_bytes``, otherwise the caller blocks on the oldest partition in
flight, returns its credit and hands out the leaves it completed. So at most
``credit_bytes`` plus one partition are in flight, and the caller's per-partition updates
(``iterate``/``apply``) run while later partitions are still being reduced.

Why not the ``chronica.comm.Dispatcher`` threads. They exist to issue collectives from one
thread as per-tensor gradient hooks fire during a backward pass and to run the update on
completion. In JAX (1) all leaves of one ``jax.grad`` come out of one program together: there
are no per-tensor ready events, the whole step is ready when ``reduce`` is called, so every
tensor is marked ready at once and the pure priority order is the right one; (2) issuing is
already asynchronous (a few microseconds, XLA runs the collective), so an issuing thread
would only add a hand-off and a lock; (3) the updates are user JAX code that belongs on the
caller's thread (tracing caches, exceptions), and an abandoned step must finish its
collectives deterministically before control returns. The queue's ordering and credit
contract is the one the Dispatcher enforces; the timeline is the same ``Timeline``.

What JAX does not allow. A jitted train step takes every parameter as an input and XLA
starts a program only once all its inputs exist, so the next step's forward cannot start
layer by layer while later layers' gradients still travel (the iteration barrier is not
crossed; the torch shim crosses it with module pre-hooks). Likewise communication cannot
overlap the backward pass from outside it, because the backward is one program. What is
overlapped here is each partition's reduction with the updates of earlier partitions and
with the issuing of later ones; early layers' parameters are final first, which lets a
forward pass split into per-layer jitted programs start early by dataflow alone.

Guarantees: the mean equals ``pmean`` of the whole pytree elementwise (bitwise for two
processes, where every element is ``(a + b) / 2`` either way; for more processes the
all-reduce may sum in another order); collectives are issued in the same sequence on every
process (tree structure, shapes, dtypes, priority and rank 0's knobs are checked or agreed
with one small collective whenever a new structure is seen); with one process nothing is
communicated and ``reduce`` returns its argument. Not thread-safe: one step at a time.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from chronica.adapters.jax.grad_plan import (
    AXIS,
    Partitions,
    Plan,
    knob_words,
    knobs_from_words,
    lay_out,
)
from chronica.adapters.jax.grad_tree import PerLeaf, forward_order, path_name, per_leaf
from chronica.core.checks import check_number
from chronica.runtime.auto import BUCKETED, AutoTrial, Candidate, Window, candidates, check_mode
from chronica.runtime.dispatcher import AutoTuner, SchedulingOptions
from chronica.runtime.gradients import GradientViews, StepHistory, link_busy
from chronica.runtime.timeline import Exposure, Timeline, timeline_path

__all__ = ["PerLeaf", "ReducedLeaves", "ScheduledReducer", "forward_order", "per_leaf"]


Update = Callable[..., Any]


class ReducedLeaves(NamedTuple):
    """Leaves whose cross-process mean is complete, with their paths, in priority order."""

    paths: tuple[str, ...]
    leaves: tuple[jax.Array, ...]


class ScheduledReducer(GradientViews):
    """Cross-process mean of gradient pytrees, reduced partition by partition by priority.

    ``priority``: leaf paths in order of first use in the forward pass (``forward_order``
    derives it from the loss function); unlisted leaves follow in tree order; ``None`` is
    tree order. ``partition_bytes``, ``credit_bytes``, ``order`` (``"priority"`` or
    ``"fifo"``), ``auto_tune`` and ``timeline`` are ``SchedulingOptions`` knobs (arguments win
    over ``CHRONICA_*`` variables; rank 0's values are used on every process). With one
    process every method costs a tree flatten at most and communicates nothing.

    Args:
        priority: leaf paths, first used first (``forward_order``); ``None``: tree order.
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

        >>> reducer = ScheduledReducer(priority=forward_order(loss, params, x), mode="auto")
        ... # doctest: +SKIP
        >>> params = reducer.apply(grad_fn(params, x), params, sgd)   # doctest: +SKIP
    """

    def __init__(
        self,
        priority: Sequence[Any] | None = None,
        *,
        partition_bytes: int | str | None = None,
        credit_bytes: int | str | None = None,
        order: str | None = None,
        auto_tune: bool | None = None,
        timeline: str | None = None,
        mode: str = "scheduled",
        min_saving: float = 0.05,
    ) -> None:
        self.mode = check_mode(mode)
        self.min_saving = check_number(
            "min_saving", min_saving, 0.0, 1.0, hint=" (a fraction of the step time)"
        )
        for name, value in (("partition_bytes", partition_bytes), ("credit_bytes", credit_bytes)):
            if value is not None and not value:  # resolve() would silently use the default
                raise ValueError(f"{name}={value!r} must be a positive number of bytes or None")
        self.options = SchedulingOptions.resolve(
            partition_bytes, credit_bytes, order, auto_tune, timeline
        )
        if priority is not None and (
            isinstance(priority, (str, bytes)) or not isinstance(priority, Sequence)
        ):
            raise TypeError(
                f"priority={priority!r} must be a list of leaf paths (see forward_order) or None"
            )
        self._priority_names = None if priority is None else [path_name(p) for p in priority]
        if self._priority_names is not None:
            dup = {p for p in self._priority_names if self._priority_names.count(p) > 1}
            if dup:
                raise ValueError(f"priority= lists {sorted(dup)} more than once; list each once")
        self.world = jax.process_count()
        self.rank = jax.process_index()
        self._plans: dict[Any, Plan] = {}
        self._plan: Plan | None = None
        self._busy = False
        self._issued: list[int] = []
        self._max_in_flight = 0
        self._tuner: AutoTuner | None = None
        self._timeline: Timeline | None = None
        # mode="auto": bucketed (DDP's buckets, backward order) until the trial decides.
        self._engine = "scheduled" if mode == "scheduled" else "bucketed"
        self._trial: AutoTrial | None = None  # mode="auto": set up with the first plan
        self._setting: Candidate = BUCKETED  # mode="auto": the setting in force
        self._generation = 0  # the trial's generation the history's window belongs to
        self._history = StepHistory()
        self._reduced_in = 0.0  # seconds from the latest step's call to its last partition
        self._link_busy = 0.0  # seconds the link needed for the latest step's partitions
        if self.world > 1:
            # One device per process is the reduction's mesh; gradients are moved to it.
            by_process: dict[int, jax.Device] = {}
            for d in sorted(jax.devices(), key=lambda d: d.id):
                by_process.setdefault(d.process_index, d)
            devices = [by_process[i] for i in range(self.world)]
            self._device = devices[self.rank]
            self._mesh = Mesh(np.array(devices), (AXIS,))
            self._sharding = NamedSharding(self._mesh, PartitionSpec(AXIS))
            if self.options.timeline:
                path = timeline_path(self.options.timeline, self.rank, self.world)
                self._timeline = Timeline(path, self.rank)

    # -- public API -----------------------------------------------------------------------

    def reduce(self, grads: Any) -> Any:
        """The mean over processes of ``grads`` (this process's gradient pytree).

        Args:
            grads: this process's gradient pytree (floating-point leaves).

        Example::

            >>> mean = reducer.reduce(grads)   # doctest: +SKIP
        """
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        if self.world == 1:
            self._plan_for(leaves, treedef)  # validates once per structure, then a dict lookup
            return grads
        out: list[Any] = list(leaves)
        for indices, reduced in self._chunks(leaves, treedef):
            for i, leaf in zip(indices, reduced, strict=True):
                out[i] = leaf
        return treedef.unflatten(out)

    def iterate(self, grads: Any) -> Iterator[ReducedLeaves]:
        """Mean gradients in chunks, each as soon as its partition is reduced.

        Chunks come in dispatch order and hold every leaf exactly once (one chunk with all
        leaves when there is one process). Collectives are issued as the iterator is consumed,
        so every process must consume it; leaving the loop early (or an exception in its
        body) still finishes this step's collectives, so processes stay in step. A new step
        starts only after this one.

        Args:
            grads: this process's gradient pytree.

        Example::

            >>> for paths, leaves in reducer.iterate(grads): ...   # doctest: +SKIP
        """
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        chunks = self._indexed(leaves, treedef)
        assert self._plan is not None  # _indexed planned this structure
        paths = self._plan.paths
        return (
            ReducedLeaves(tuple(paths[i] for i in idx), tuple(arrays)) for idx, arrays in chunks
        )

    def apply(self, grads: Any, params: Any, update: Update, state: Any = None) -> Any:
        """Update ``params`` chunk by chunk as mean gradients arrive; returns the new params.

        ``update(grads, params) -> params`` (or, with ``state``, ``update(grads, params,
        states) -> (params, states)``, returning ``(params, state)``) receives lists of leaves
        in priority order and must treat each leaf independently (SGD, momentum, Adam, ...;
        see ``per_leaf`` for optax); ``state`` is per leaf: its tree has ``params``' tree as
        a prefix. The result equals ``update`` applied once to the whole mean gradient.

        Args:
            grads: this process's gradient pytree.
            params: the parameters the gradients were taken of (same tree).
            update: ``update(grads, params[, states])`` on lists of leaves.
            state: per-leaf optimizer state (``per_leaf(tx).init(params)``), or ``None``.

        Example::

            >>> params = reducer.apply(grads, params, sgd)   # doctest: +SKIP
        """
        if not callable(update):
            raise TypeError(f"update={update!r} must be a function of (grads, params[, state])")
        g_leaves, treedef = jax.tree_util.tree_flatten(grads)
        p_leaves, p_treedef = jax.tree_util.tree_flatten(params)
        if p_treedef != treedef:
            raise ValueError(
                f"params has tree structure {p_treedef}, grads has {treedef}; pass the "
                "parameters the gradients were taken of"
            )
        if state is not None:
            try:
                s_leaves = treedef.flatten_up_to(state)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    "state must hold one optimizer state per parameter leaf (its tree has "
                    "params' tree as a prefix), e.g. per_leaf(tx).init(params)"
                ) from exc
        new_p = list(p_leaves)
        new_s = list(s_leaves) if state is not None else []
        for idx, reduced in self._indexed(g_leaves, treedef):
            ps = [new_p[i] for i in idx]
            if state is None:
                outs, states = update(list(reduced), ps), None
            else:
                outs, states = update(list(reduced), ps, [new_s[i] for i in idx])
            if len(outs) != len(idx) or (states is not None and len(states) != len(idx)):
                raise ValueError(
                    f"update returned {len(outs)} leaves for {len(idx)}; it must return one "
                    "new value per leaf it was given"
                )
            for k, i in enumerate(idx):
                new_p[i] = outs[k]
                if states is not None:
                    new_s[i] = states[k]
        if state is None:
            return treedef.unflatten(new_p)
        return treedef.unflatten(new_p), treedef.unflatten(new_s)

    def close(self) -> None:
        """Close the timeline (complete JSON afterwards)."""
        if self._timeline is not None:
            self._timeline.close()

    def __enter__(self) -> ScheduledReducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def priority(self) -> list[str]:
        """Leaf paths of the latest structure, in priority order."""
        return [self._plan.paths[i] for i in self._plan.priority] if self._plan else []

    @property
    def max_in_flight_bytes(self) -> int:
        """The most gradient bytes this process ever had in flight."""
        return self._max_in_flight

    def stats(self) -> Exposure:
        """This process's recent steps (medians), the engine in force and why (``decision``).

        A step runs from one ``reduce``/``iterate``/``apply`` call to the next; all of its
        reduction is exposed (JAX cannot start the next forward early), so ``after_backward``
        is the time from the call to its last partition. See ``chronica.runtime.timeline``.

        Example::

            >>> reducer.stats().decision   # doctest: +SKIP
            'bucketed: rank 0 measured that priority scheduling would save at most 1.2% ...'
        """
        if self.world == 1:
            return Exposure(0, 0.0, 0.0, 0.0, "bucketed", "one process: nothing to communicate")
        decision = self._trial.decision if self._trial is not None else ""
        return self._history.exposure(self._engine, decision)

    @property
    def trial(self) -> AutoTrial | None:
        """``mode="auto"``'s trial (``None`` in other modes and before the first plan);
        ``trial.reopen(why)`` in every process at the same step decides again."""
        return self._trial

    def _dispatched(self) -> list[int]:
        return self._issued

    def _unplanned(self) -> tuple[int, int]:
        return self.options.partition_bytes, self.options.credit_bytes

    def _config(self) -> dict[str, object]:
        return {
            **self._shared_config(self.mode, self._engine, self.min_saving, self.options),
            "auto_tune": self.options.auto_tune,
            "timeline": self.options.timeline,
            "priority": self._priority_names,
            "world": self.world,
        }

    # -- planning -------------------------------------------------------------------------

    def _plan_for(self, leaves: list[Any], treedef: Any) -> Plan:
        try:
            key = (treedef, tuple((leaf.shape, leaf.dtype) for leaf in leaves))
        except AttributeError:
            key = None
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = self._new_plan(leaves, treedef)
            self._plans[key] = plan
        self._plan = plan
        self._record = plan.parts.record if plan.parts is not None else None
        return plan

    def _new_plan(self, leaves: list[Any], treedef: Any) -> Plan:
        flat, _ = jax.tree_util.tree_flatten_with_path(treedef.unflatten(leaves))
        paths = [jax.tree_util.keystr(p) for p, _ in flat]
        for path, leaf in zip(paths, leaves, strict=True):
            dtype = getattr(leaf, "dtype", None)
            if dtype is None or not hasattr(leaf, "shape"):
                raise TypeError(f"grads leaf {path} is a {type(leaf).__name__}; pass arrays")
            if not jnp.issubdtype(dtype, jnp.inexact):
                raise ValueError(
                    f"grads leaf {path} has dtype {dtype}; gradients must be floating point "
                    "(drop integer leaves from the tree before reducing)"
                )
        index = {p: i for i, p in enumerate(paths)}
        named = self._priority_names or []
        unknown = [p for p in named if p not in index]
        if unknown:
            raise ValueError(
                f"priority= names {unknown[:3]} which are not leaves of grads (leaves are "
                f"{paths[:4]}...); pass paths from forward_order or jax.tree_util.keystr"
            )
        listed = [index[p] for p in named]
        seen = set(listed)
        priority = listed + [i for i in range(len(paths)) if i not in seen]
        plan = Plan(
            paths=paths,
            shapes=[tuple(leaf.shape) for leaf in leaves],
            priority=priority,
            dtypes=[leaves[i].dtype for i in priority],
            options=self.options,
        )
        if self.world == 1:
            return plan
        dtypes = [str(d) for d in plan.dtypes]
        digest = hashlib.blake2b(
            repr((str(treedef), plan.shapes, dtypes, priority)).encode(), digest_size=16
        ).digest()
        words = np.frombuffer(digest, dtype=np.uint32)
        agreed = self._agree(np.concatenate([words, knob_words(self._knobs())]))
        if not (agreed[:, :4] == words).all():
            raise ValueError(
                "grads differ across processes (tree structure, shapes, dtypes or priority=); "
                "every process must reduce the same structure with the same priority"
            )
        plan.options = knobs_from_words(self.options, agreed[0, 4:])
        numel = [int(np.prod(s)) for s in plan.shapes]
        total = sum(n * leaves[i].dtype.itemsize for i, n in enumerate(numel))
        if self.mode == "auto" and self._trial is None:
            opts = plan.options  # process 0's knobs: every process searches the same settings
            self._trial = AutoTrial(
                candidates(max(1, total), opts.partition_bytes, opts.credit_bytes),
                self.min_saving,
                accelerator=jax.default_backend() != "cpu",
                announce=self.rank == 0,
            )
        if self._tuner is None and plan.options.auto_tune and self.mode != "auto":
            self._tuner = AutoTuner.default_grid(total)
            plan.options = plan.options.with_knobs(*self._tuner.current)
        self._layout(plan)
        return plan

    def _knobs(self) -> SchedulingOptions:
        if self._setting.engine == "scheduled":  # mode="auto"'s setting in force
            return self.options.with_knobs(
                self._setting.partition_bytes, self._setting.credit_bytes
            )
        if self._tuner is not None:
            return self.options.with_knobs(*self._tuner.current)
        return self.options

    def _agree(self, words: np.ndarray) -> np.ndarray:
        """Every process's ``words``, one row per process (one small collective)."""
        gathered = multihost_utils.process_allgather(words.view(np.int32))
        return np.asarray(gathered).view(np.uint32).reshape(self.world, -1)

    def _layout(self, plan: Plan) -> None:
        plan.parts = lay_out(plan, self._engine, self._mesh, self.world)

    def _step_boundary(self) -> None:
        """At a step boundary: measure the step that ended, feed the tuner (scheduled engine)
        and the ``mode="auto"`` trial (every process's window gathered, their mean fed alike);
        on a switch, take the tuner's (process 0's) knobs or the trial's setting and replan."""
        now = time.perf_counter()
        trial = self._trial
        measuring = trial is not None and trial.measuring_cpu
        start = self._history.record(
            now, self._reduced_in, 0.0, cpu=measuring, busy=self._link_busy
        )
        if start is None:
            return
        knobs = None
        if self._tuner is not None and self._engine == "scheduled":
            knobs = self._tuner.record(now - start)
        if knobs is not None:
            opts = self.options.with_knobs(*knobs)
            opts = knobs_from_words(self.options, self._agree(knob_words(opts))[0])
            for plan in self._plans.values():
                plan.options = opts
            self._relayout()
        if trial is None:
            return
        if trial.generation != self._generation:  # reopened: a fresh window
            self._generation = trial.generation
            self._history.restart()
        elif trial.current == self._setting and 0 < trial.window_steps <= self._history.fresh:
            # Every process's window, gathered: every process feeds the same mean.
            words = np.ascontiguousarray(self._history.window().values(), dtype=np.float64)
            rows = self._agree(words.view(np.uint32)).copy().view(np.float64)
            trial.observe(Window.agreed(rows))
        if trial.current != self._setting:  # every process switches at this step
            self._setting = trial.current
            self._engine = trial.current.engine
            opts = self._knobs()
            for plan in self._plans.values():
                plan.options = opts
            self._relayout()
            self._history.restart()

    def _relayout(self) -> None:
        for known in self._plans.values():
            self._layout(known)
        latest = self._plan
        self._record = latest.parts.record if latest is not None and latest.parts else None

    # -- one step ------------------------------------------------------------------------

    def _indexed(self, leaves: list[Any], treedef: Any) -> Iterator[tuple[list[int], Sequence]]:
        if self.world == 1:
            plan = self._plan_for(leaves, treedef)
            return iter([(plan.priority, [leaves[i] for i in plan.priority])])
        return self._chunks(leaves, treedef)

    def _chunks(self, leaves: list[Any], treedef: Any) -> Iterator[tuple[list[int], list]]:
        if self._busy:
            raise RuntimeError(
                "a previous iterate() of this reducer is unfinished; exhaust or close it first"
            )
        self._step_boundary()
        return self._run(self._plan_for(leaves, treedef), leaves)

    def _run(self, plan: Plan, leaves: list[Any]) -> Iterator[tuple[list[int], list]]:
        self._busy = True
        partitions = plan.parts
        assert partitions is not None  # every plan of more than one process is laid out
        completions = self._completions(plan, partitions, leaves)
        left = partitions.parts_per_leaf.copy()
        pieces: dict[int, list[tuple[int, jax.Array]]] = {}
        try:
            for p, outs in completions:
                idx, arrays = [], []
                for (leaf, start, whole), out in zip(partitions.outputs[p], outs, strict=True):
                    piece = out.addressable_data(0)
                    if not whole:
                        pieces.setdefault(leaf, []).append((start, piece))
                    left[leaf] -= 1
                    if left[leaf]:
                        continue
                    if not whole:
                        parts = [a for _, a in sorted(pieces.pop(leaf), key=lambda s: s[0])]
                        piece = jnp.concatenate(parts).reshape(plan.shapes[leaf])
                    idx.append(leaf)
                    arrays.append(piece)
                if not idx:
                    continue
                try:
                    yield idx, arrays
                except BaseException:
                    # Abandoned or failed mid-step: the other processes issue the rest of
                    # this step's collectives, so this one must too.
                    for _ in completions:
                        pass
                    raise
        finally:
            self._busy = False

    def _completions(
        self, plan: Plan, parts: Partitions, leaves: list[Any]
    ) -> Iterator[tuple[int, tuple]]:
        """Issue partitions in order under credit; yield each once seen complete."""
        queue = parts.queue
        queue.reset()
        for t in range(parts.layout.num_tensors):
            queue.mark_ready(t)
        self._issued = []
        ready = time.perf_counter()
        # Placed before the first collective, so a bad leaf fails before any is issued.
        placed = [
            self._to_global(leaf, path) for leaf, path in zip(leaves, plan.paths, strict=True)
        ]
        flight: deque[tuple[int, tuple, float]] = deque()
        total = int(parts.layout.part_bytes.sum())
        first = last = ready  # when the first and the latest partition were issued
        last_bytes = 0
        while not queue.done_dispatching or flight:
            p = queue.next_dispatch()
            if p is not None:
                self._max_in_flight = max(self._max_in_flight, queue.in_flight)
                issued = time.perf_counter()
                first = issued if not self._issued else first
                last, last_bytes = issued, int(parts.layout.part_bytes[p])
                args = [placed[i] for i in parts.inputs[p]]
                flight.append((p, parts.programs[p](*args), issued))
                self._issued.append(p)
                continue
            p, outs, issued = flight.popleft()
            jax.block_until_ready(outs)
            done = time.perf_counter()
            queue.complete(p)
            self._reduced_in = done - ready  # the step's exposed reduction, so far
            self._link_busy = link_busy(first, last, done, last_bytes, total)  # so far
            if self._timeline is not None:
                nbytes = int(parts.layout.part_bytes[p])
                name = parts.record.labels[p]
                self._timeline.span(name, "queue", ready, issued, partition=p, bytes=nbytes)
                self._timeline.span(name, "communication", issued, done, partition=p, bytes=nbytes)
            yield p, outs

    def _to_global(self, leaf: Any, path: str) -> jax.Array:
        """This process's ``leaf`` as its shard of a (processes x leaf) global array."""
        if isinstance(leaf, jax.Array):
            if not leaf.is_fully_addressable:
                raise ValueError(
                    f"grads leaf {path} is a global array spanning processes; pass each "
                    "process's local gradients (a jitted step over global arrays already "
                    "reduces them)"
                )
            if leaf.sharding.device_set != {self._device}:
                leaf = jax.device_put(leaf, self._device)
        else:
            leaf = jax.device_put(leaf, self._device)
        if leaf.ndim == 0:
            leaf = leaf.reshape(1)
        shape = (self.world * leaf.shape[0], *leaf.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self._sharding, [leaf])
