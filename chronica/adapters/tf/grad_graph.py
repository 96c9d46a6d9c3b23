"""Graph helpers of the TensorFlow gradient shim: partitions packed into and unpacked from
1-D buffers, the first-use order of variables in a traced graph (``forward_order``), and
``multi_step``, the unrolled ``tf.function`` in which the next step's forward overlaps the
previous reduction (and in which ``mode="auto"`` switches engines by retracing), the credit
chain of a graph's collectives (``CollectiveChain``) and the timeline's markers.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.core.checks import check_int
from chronica.core.priority import Layout
from chronica.runtime.timeline import Timeline

__all__ = [
    "CollectiveChain",
    "MultiStep",
    "first_use",
    "forward_order",
    "issue_marker",
    "mark_end",
    "mark_issue",
    "multi_step",
    "pack_one",
    "pack_partitions",
    "tracing_for",
    "unpack_partitions",
    "variable_name",
]

# -- partitions -----------------------------------------------------------------------------


def pack_one(flat: Sequence[tf.Tensor], layout: Layout, partition: int) -> tf.Tensor:
    pieces = []
    for t, a, b in layout.segments(partition):
        whole = a == 0 and b == int(layout.numel[t])
        pieces.append(flat[t] if whole else flat[t][a:b])
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)


def pack_partitions(tensors: Sequence[tf.Tensor], layout: Layout) -> list[tf.Tensor]:
    """The 1-D buffer of every partition of ``layout``; ``tensors`` are in priority order."""
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return [pack_one(flat, layout, p) for p in range(layout.num_partitions)]


def unpack_partitions(
    buffers: Sequence[tf.Tensor], layout: Layout, shapes: Sequence[Sequence[int]]
) -> list[tf.Tensor]:
    """Inverse of ``pack_partitions``: the tensors (priority order) reshaped to ``shapes``.

    Guarantee: ``unpack_partitions(pack_partitions(ts, layout), layout, shapes)`` returns
    tensors bitwise equal to ``ts`` (only slicing, concatenation and reshapes are involved).
    """
    pieces: list[list[tf.Tensor]] = [[] for _ in range(layout.num_tensors)]
    for p, buf in enumerate(buffers):
        segs = layout.segments(p)
        parts = [buf] if len(segs) == 1 else tf.split(buf, [b - a for _, a, b in segs])
        for (t, _, _), part in zip(segs, parts, strict=True):
            pieces[t].append(part)
    return [
        tf.reshape(ps[0] if len(ps) == 1 else tf.concat(ps, axis=0), shape)
        for ps, shape in zip(pieces, shapes, strict=True)
    ]


# -- priority from a traced graph -------------------------------------------------------------


def variable_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def _resource_handles(variable: Any) -> list[Any]:
    """Resource handles of ``variable`` on this worker (every local component if mirrored)."""
    # Keras 3 variables wrap a tf.Variable in ``.value``; a tf.Variable's ``value`` is a method.
    inner = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
    if not isinstance(inner, tf.Variable):
        raise ValueError(
            f"variables must be tf.Variable or Keras variables, got {type(variable).__name__}"
        )
    local = tf.distribute.get_strategy().experimental_local_results(inner)
    return [component.handle for component in local]


def first_use(graph: Any, variables: Sequence[Any]) -> list[int]:
    """Indices of ``variables`` in the order ops of ``graph`` first touch them (then the rest)."""
    owner: dict[int, int] = {}
    for i, v in enumerate(variables):
        for handle in _resource_handles(v):
            owner[id(handle)] = i
    captures: dict[int, dict[int, Any]] = {}

    def source(tensor: Any) -> Any:
        while tf.is_symbolic_tensor(tensor):
            if tensor.op.type == "Identity":
                tensor = tensor.op.inputs[0]
                continue
            g = tensor.graph
            if id(g) not in captures:
                captures[id(g)] = {id(inner): outer for outer, inner in getattr(g, "captures", ())}
            outer = captures[id(g)].get(id(tensor))
            if outer is None:
                return tensor
            tensor = outer
        return tensor

    seen: dict[int, None] = {}
    for op in graph.get_operations():
        for inp in op.inputs:
            if inp.dtype == tf.resource:
                found = owner.get(id(source(inp)))
                if found is not None:
                    seen.setdefault(found)
    return [*seen, *(i for i in range(len(variables)) if i not in seen)]


def forward_order(fn: Callable[..., Any], *args: Any, variables: Sequence[Any]) -> list[Any]:
    """``variables`` in the order ``fn(*args)`` first uses them; unused ones last, as given.

    ``fn`` is traced (not run) with ``tf.function``; build Keras models before, so that the
    trace creates no variables. Pass the result as ``ScheduledAllReduce(priority=...)``.

    Args:
        fn: the forward (or loss) function.
        *args: its arguments (a batch), for tracing.
        variables: the variables to order (e.g. ``model.trainable_variables``).

    Example::

        >>> order = forward_order(model, x, variables=model.trainable_variables)  # doctest: +SKIP
    """
    graph = tf.function(fn).get_concrete_function(*args).graph
    return [variables[i] for i in first_use(graph, list(variables))]


# The reducer lists of the MultiStep calls in progress, innermost last. A module-level stack,
# not a context variable: strategy.run calls the replica function on threads of its own.
_TRACING: list[list[Any]] = []


def tracing_for() -> list[Any] | None:
    """The reducers list of the ``MultiStep`` being traced now (``None`` outside one): a
    ``ScheduledAllReduce`` traced inside registers itself there, so that ``mode="auto"`` can
    decide between executions and have the function retraced with the engine it chose.

    Example::

        >>> tracing_for() is None
        True
    """
    return _TRACING[-1] if _TRACING else None


class MultiStep:
    """A ``tf.function`` running ``step_fn`` ``steps_per_execution`` times, unrolled, that is
    traced again when a ``ScheduledAllReduce(mode="auto")`` inside it switched engines.

    Between executions it lets each such reducer take its ``mode="auto"`` decision (one small
    all-reduce of rank 0's measurements, at the same execution on every worker); a switch
    makes the next call trace a fresh function with the engine chosen. Attributes of the
    current ``tf.function`` (``get_concrete_function``, ...) are forwarded to it.

    Args:
        step_fn: one training step (call ``next`` on an iterator inside).
        steps_per_execution: steps per call, unrolled in Python.
        function_kwargs: keyword arguments of ``tf.function``.

    Example::

        >>> fn = MultiStep(step, 2, {})   # doctest: +SKIP
        >>> fn(iterator)                  # doctest: +SKIP
    """

    def __init__(
        self, step_fn: Callable[..., Any], steps_per_execution: int, function_kwargs: dict
    ) -> None:
        if not callable(step_fn):
            raise TypeError(f"step_fn={step_fn!r} must be a function running one step")
        self.steps_per_execution = check_int("steps_per_execution", steps_per_execution, 1)
        self.step_fn = step_fn
        self._kwargs = dict(function_kwargs)
        self._reducers: list[Any] = []
        self._function = self._trace()

    def __repr__(self) -> str:
        name = getattr(self.step_fn, "__name__", repr(self.step_fn))
        return f"MultiStep(step_fn={name}, steps_per_execution={self.steps_per_execution})"

    def _trace(self) -> Any:
        step_fn, steps = self.step_fn, self.steps_per_execution

        def run(*args: Any, **kwargs: Any) -> list[Any]:
            return [step_fn(*args, **kwargs) for _ in range(steps)]

        return tf.function(run, **self._kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        _TRACING.append(self._reducers)
        try:
            out = self._function(*args, **kwargs)
        finally:
            _TRACING.pop()
        switched = [reducer.decide() for reducer in self._reducers]
        if any(switched):
            self._reducers = []  # the next trace registers them again
            self._function = self._trace()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)


def multi_step(
    step_fn: Callable[..., Any], steps_per_execution: int, **function_kwargs: Any
) -> MultiStep:
    """A ``tf.function`` that runs ``step_fn(*args)`` ``steps_per_execution`` times, unrolled.

    Unrolled (a Python loop, not ``tf.range``) so that step ``k + 1`` reads each variable right
    after step ``k`` wrote it rather than after all of step ``k``: with ``ScheduledAllReduce``
    the next forward overlaps the previous reduction. Pass an iterator and call ``next`` in
    ``step_fn``; the result is the list of the steps' outputs. Tracing time grows with
    ``steps_per_execution``. A ``ScheduledAllReduce(mode="auto")`` used inside decides between
    calls and the function is traced again when it switches engines (see ``MultiStep``).

    Args:
        step_fn: one training step.
        steps_per_execution: steps per call (at least 1).
        **function_kwargs: keyword arguments of ``tf.function``.

    Example::

        >>> fn = multi_step(step, 2)   # doctest: +SKIP
        >>> losses = fn(iterator)      # doctest: +SKIP
    """
    return MultiStep(step_fn, steps_per_execution, function_kwargs)


# -- credit: what each collective waits for -----------------------------------------------


class CollectiveChain:
    """Collectives issued so far in one graph: their bytes and a chain of completions.

    ``done[j]`` is an op that runs once collectives ``0..j`` all completed, so waiting on it
    bounds what is in flight regardless of the order in which collectives complete.

    Example::

        >>> chain = CollectiveChain(); chain.gate(credit=1 << 20, nbytes=4096) is None
        True
    """

    def __init__(self) -> None:
        self.cum = [0]
        self.done: list[Any] = []
        self.max_in_flight = 0

    def gate(self, credit: int, nbytes: int) -> Any | None:
        """What the next collective (``nbytes``) waits for to keep in-flight bytes < credit."""
        j = len(self.done)
        i = bisect.bisect_right(self.cum, self.cum[j] - credit, 0, j) - 1
        self.max_in_flight = max(self.max_in_flight, self.cum[j] - self.cum[i + 1] + nbytes)
        return self.done[i] if i >= 0 else None

    def gate_all(self) -> Any | None:
        """What a collective of unknown size waits for: everything before it."""
        return self.done[-1] if self.done else None

    def push(self, nbytes: int, outputs: Sequence[tf.Tensor]) -> None:
        """Append a collective of ``nbytes`` whose results are ``outputs``."""
        self.cum.append(self.cum[-1] + nbytes)
        self.done.append(tf.group(*outputs, *self.done[-1:]))


# -- timeline markers (built only when a timeline is set) ---------------------------------


def _now(*_: Any) -> np.float64:
    return np.float64(time.perf_counter())


def issue_marker(buf: tf.Tensor, gate: Any | None) -> tf.Tensor:
    """When a partition may start (its gradients exist and ``gate`` ran), for the link's busy
    time while ``mode="auto"`` measures: stateless, so automatic control dependencies leave
    it unordered; the collective made to wait on it keeps it in the graph.

    Args:
        buf: the partition's 1-D buffer.
        gate: what the partition's collective waits for (``None``: nothing).

    Example::

        >>> issued = issue_marker(buf, None)   # doctest: +SKIP
    """
    with tf.control_dependencies([] if gate is None else [gate]):
        return tf.numpy_function(_now, [buf[:1]], tf.float64, stateful=False)


def mark_issue(buf: tf.Tensor, gate: Any | None) -> tuple[tf.Tensor, tf.Tensor]:
    """Timeline markers of one partition: (ready, issue) times, when its gradients exist
    and when it may start (built only when a timeline is set).

    Args:
        buf: the partition's 1-D buffer.
        gate: what the partition's collective waits for (``None``: nothing).

    Example::

        >>> ready, issue = mark_issue(buf, None)   # doctest: +SKIP
    """
    # The ready marker is stateless so that automatic control dependencies leave it
    # unordered (it fires when the gradients exist); the stateful issue marker consumes
    # it, so it is neither pruned nor folded, and is chained after the previous
    # partition's end marker in program order, as the collectives are by their token.
    ready = tf.numpy_function(_now, [buf[:1]], tf.float64, stateful=False)
    with tf.control_dependencies([] if gate is None else [gate]):
        issue = tf.numpy_function(_now, [ready, buf[:1]], tf.float64)
    return ready, issue


def mark_end(
    timeline: Timeline,
    label: str,
    partition: int,
    nbytes: int,
    marks: tuple[tf.Tensor, tf.Tensor],
    out: tf.Tensor,
) -> None:
    """The end marker of one partition: writes its queue and communication spans once its
    collective's output ``out`` exists.

    Args:
        timeline: the timeline written to.
        label: the partition's label.
        partition: its index.
        nbytes: its size in bytes.
        marks: its ``(ready, issue)`` markers from ``mark_issue``.
        out: the collective's output.

    Example::

        >>> mark_end(timeline, "w[0:4]", 0, 16, mark_issue(buf, None), out)   # doctest: +SKIP
    """

    def end(t_ready: np.ndarray, t_issue: np.ndarray, _: np.ndarray) -> np.float64:
        now = time.perf_counter()
        args = {"partition": partition, "bytes": nbytes}
        timeline.span(label, "queue", float(t_ready), float(t_issue), **args)
        timeline.span(label, "communication", float(t_issue), now, **args)
        return np.float64(now)

    tf.numpy_function(end, [marks[0], marks[1], out[:1]], tf.float64)
