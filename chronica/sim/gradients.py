"""Gradient communication of data-parallel training: how long a step lasts, and how much of
its communication is exposed, under FIFO, priority (ByteScheduler) and DDP-bucket policies.

A discrete-event simulation of one rank (all ranks alike) over several steps; the last
steps give the steady-state step time. Two resources, each doing one thing at a time:

- **compute** (the training thread): forward of layers ``0 .. L-1``, then backward of
  ``L-1 .. 0`` (layer ``i``'s gradients are final when its backward ends), then the
  optimizer's updates (see below);
- **link**: collectives one after the other, each a ring all-reduce over W ranks
  (``chronica.sim.timing.AllReduceModel``: ``2(W-1)/W · bytes / B + 2(W-1) · α``); a
  collective issued while another is still on the link pays ``Link.queued_latency_s``
  per hop instead of ``α`` (gloo runs queued collectives on two worker threads, so one
  starts while the previous one transfers; one issued on an idle link, e.g. after a
  credit stall, pays the full round trip).

Which collectives and when is decided by ``chronica.core.priority`` itself: every policy
becomes a ``Layout`` of partitions, a dispatch order and a credit, and a ``GradientQueue``
issues the partitions as the torch shim's dispatcher does (strictly in order, each once its
tensors are ready and bytes in flight are below the credit):

- ``none``: one all-reduce of every gradient after backward, then the optimizer, then the
  next forward;
- ``ddp``: DistributedDataParallel's buckets, rebuilt (as torch does after its first
  iteration) in gradient-ready order: the first closes at ``first_bucket_bytes``, the others
  at ``bucket_bytes`` (a bucket closes once it reaches its cap); bucket ``j`` is all-reduced
  once full and after bucket ``j-1``; the optimizer runs after the last one, then forward;
- ``fifo``: one all-reduce per tensor in backward order, unlimited credit;
- ``priority``: partitions of ``partition_bytes`` in the order of
  ``chronica.core.priority.simulate_order`` (credit ``credit_bytes``, driven by the step's
  gradient-ready times and the link's rate, as the shim plans it).

Under ``fifo`` and ``priority`` the step crosses the iteration barrier as the torch shim
does, its updates on the training thread: ``step()`` updates every layer reduced by then,
and the next forward of layer ``i``, if ``i`` is not updated yet, waits until it is
reduced, then updates every layer reduced by then (one optimizer call each time), then
computes. ``slowdown`` (default 0) makes
compute advance at ``1 / (1 + slowdown)`` while a collective is in flight: the processor
time a CPU transport takes from a host with no spare core (0 on accelerators);
``link_slowdown`` (default 0) makes a collective advance at ``1 / (1 + link_slowdown)``
while the training thread computes (a forward, backward or update runs): the transport's
own processor time, delayed by compute holding the cores.
Deterministic: no randomness, equal inputs give equal results.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int, check_number
from chronica.core.priority import (
    GradientQueue,
    Layout,
    bucket_layout,
    build_layout,
    fifo_order,
    simulate_order,
)
from chronica.sim.timing import AllReduceModel

__all__ = [
    "POLICIES",
    "Layer",
    "Link",
    "Policy",
    "StepResult",
    "parse_bytes",
    "plan",
    "simulate_gradients",
    "simulate_step",
]

MIB = 1 << 20
# The torch shim's defaults (chronica.runtime.dispatcher.SchedulingOptions) and DDP's.
DEFAULT_PARTITION_BYTES = 1 * MIB
DEFAULT_CREDIT_BYTES = 4 * MIB
DEFAULT_BUCKET_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Layer:
    """One layer of a model, in forward order: the bytes of each of its gradient tensors (in
    the order the forward first uses them; empty for a layer without parameters), and the
    seconds of its forward, its backward and its optimizer update."""

    name: str
    tensor_bytes: tuple[int, ...]
    forward_s: float
    backward_s: float
    update_s: float = 0.0

    def __post_init__(self) -> None:
        for nbytes in self.tensor_bytes:
            check_int(f"layer {self.name!r} tensor_bytes", nbytes, 0)
        for name in ("forward_s", "backward_s", "update_s"):
            check_number(f"layer {self.name!r} {name}", getattr(self, name), 0.0)


@dataclass(frozen=True)
class Link:
    """W ranks joined by links of ``bandwidth`` bytes per second with ``latency_s`` per hop;
    ``seconds(n)`` is one ring all-reduce of ``n`` bytes. ``queued_latency_s`` is the
    per-hop latency of a collective issued while another is on the link (``None``: the
    same ``latency_s``)."""

    bandwidth: float
    latency_s: float = 5e-6
    world: int = 2
    queued_latency_s: float | None = None

    def __post_init__(self) -> None:
        check_number("bandwidth", self.bandwidth, 0.0, hint=" (bytes per second)")
        if self.bandwidth <= 0:
            raise ValueError(f"bandwidth={self.bandwidth!r} must be > 0 bytes per second")
        check_number("latency", self.latency_s, 0.0, hint=" (seconds per hop)")
        if self.queued_latency_s is not None:
            check_number("queued_latency", self.queued_latency_s, 0.0, hint=" (seconds per hop)")
        check_int("ranks", self.world, 2, hint=" (one rank has nothing to all-reduce)")

    def seconds(self, nbytes: float, queued: bool = False) -> float:
        """Seconds of one ring all-reduce of ``nbytes`` over ``world`` ranks; ``queued``:
        issued while another collective was on the link."""
        latency = self.latency_s
        if queued and self.queued_latency_s is not None:
            latency = self.queued_latency_s
        return AllReduceModel(latency, self.bandwidth, nbytes).seconds(self.world)


@dataclass(frozen=True)
class Policy:
    """A communication policy (one of ``POLICIES``) and its knobs; ``None`` is the policy's
    default: ``fifo`` sends each tensor alone with unlimited credit, ``priority`` the torch
    shim's 1 MiB partitions and 4 MiB credit, ``ddp`` DDP's 25 MiB buckets after a 1 MiB
    first one. ``partition_bytes=0``: one partition per tensor (no cut, no fusion);
    ``credit_bytes=0``: unlimited. Any other ``partition_bytes`` cuts larger tensors and
    fuses adjacent smaller ones as the shim does. ``label`` names it in tables.

    Args:
        name: one of ``POLICIES``.
        partition_bytes: bytes per partition (``fifo``/``priority``), ``None`` the default.
        credit_bytes: bytes in flight at most (``fifo``/``priority``), ``None`` the default.
        bucket_bytes: DDP's bucket cap (``ddp``).
        first_bucket_bytes: DDP's first bucket cap (``ddp``).
        label: the name in tables (default: ``name``).

    Example::

        >>> Policy.parse("priority,partition=256KiB").partition_bytes
        262144
    """

    name: str
    partition_bytes: int | None = None
    credit_bytes: int | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES
    label: str = ""

    def __post_init__(self) -> None:
        if self.name not in _MODES:
            raise ValueError(f"policy={self.name!r} must be one of {POLICIES}")
        for name in ("partition_bytes", "credit_bytes"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, 0, hint=" (0: one partition per tensor / unlimited credit)")
        check_int("bucket_bytes", self.bucket_bytes, 1)
        check_int("first_bucket_bytes", self.first_bucket_bytes, 1)
        if not self.label:
            object.__setattr__(self, "label", self.name)

    @classmethod
    def parse(cls, spec: str) -> Policy:
        """``NAME[,key=value...]`` with keys ``partition``, ``credit``, ``bucket``,
        ``first_bucket`` (bytes, with an optional KiB/MiB/GiB suffix), e.g.
        ``priority,partition=256KiB,credit=1MiB`` or ``ddp,bucket=100MiB``."""
        name, *pairs = spec.split(",")
        keys = {
            "partition": "partition_bytes",
            "credit": "credit_bytes",
            "bucket": "bucket_bytes",
            "first_bucket": "first_bucket_bytes",
        }
        knobs: dict[str, int] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key not in keys or not value:
                raise ValueError(
                    f"--policy {spec!r}: {pair!r} is not key=value with a key in {sorted(keys)}"
                )
            knobs[keys[key]] = parse_bytes(f"--policy {spec!r} {key}", value)
        return cls(name.strip(), label=spec, **knobs)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(name: str, text: str) -> int:
    """``text`` (e.g. ``1048576``, ``256KiB``, ``1MiB``, ``1.5m``) as a byte count >= 0;
    ``ValueError`` naming ``name`` otherwise."""
    core = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = core[-1:] if core[-1:] in _UNITS else ""
    try:
        value = float(core[: len(core) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a byte count (e.g. 1048576 or 1MiB)") from None
    if not value >= 0 or value != value:
        raise ValueError(f"{name}={text!r} must be >= 0 bytes")
    return int(value)


@dataclass(frozen=True)
class StepResult:
    """Steady-state ``step_s`` (step to step) of one policy, beside ``compute_s`` (forward,
    backward and update with no communication); ``exposed_s`` is what communication adds.
    ``collectives``: all-reduces per step."""

    policy: str
    step_s: float
    compute_s: float
    collectives: int

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.compute_s

    def to_dict(self) -> dict[str, float | int | str]:
        """JSON-ready fields, ``exposed_s`` included."""
        return {
            "policy": self.policy,
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "exposed_s": self.exposed_s,
            "collectives": self.collectives,
        }


def plan(layers: list[Layer], link: Link, policy: Policy) -> tuple[Layout, np.ndarray, int]:
    """The partitions, dispatch order and credit ``policy`` gives ``layers`` on ``link``
    (tensors as bytes of itemsize 1; layer ``i``'s gradients ready when its backward ends)."""
    numel = np.asarray([b for layer in layers for b in layer.tensor_bytes], dtype=np.int64)
    ends = np.cumsum([layer.backward_s for layer in layers][::-1])[::-1]
    ready = np.repeat(ends, [len(layer.tensor_bytes) for layer in layers])
    return _MODES[policy.name].plan(policy, numel, ready, link)


Plan = tuple[Layout, np.ndarray, int]  # partitions, dispatch order, credit


def _plan_one_collective(policy: Policy, numel: np.ndarray, ready: np.ndarray, link: Link) -> Plan:
    layout = build_layout(numel, np.ones_like(numel), max(int(numel.sum()), 1))
    return layout, np.arange(layout.num_partitions), UNLIMITED


def _plan_ddp_buckets(policy: Policy, numel: np.ndarray, ready: np.ndarray, link: Link) -> Plan:
    layout = bucket_layout(
        numel, np.ones_like(numel), policy.bucket_bytes, policy.first_bucket_bytes
    )
    return layout, np.arange(layout.num_partitions)[::-1].copy(), UNLIMITED


def _partitions(
    policy: Policy, numel: np.ndarray, default_part: int, default_credit: int
) -> tuple[Layout, int]:
    """The shim's partitions of ``policy`` (its knobs, else the defaults) and its credit."""
    part = policy.partition_bytes if policy.partition_bytes is not None else default_part
    credit = policy.credit_bytes if policy.credit_bytes is not None else default_credit
    # partition_bytes=0: one collective per tensor (distinct keys keep tensors unfused)
    keys = None if part else np.arange(len(numel))
    whole = max(int(numel.max(initial=0)), 1)
    layout = build_layout(numel, np.ones_like(numel), part or whole, dtype_keys=keys)
    return layout, credit or UNLIMITED


def _plan_fifo(policy: Policy, numel: np.ndarray, ready: np.ndarray, link: Link) -> Plan:
    layout, credit = _partitions(policy, numel, 0, 0)
    return layout, fifo_order(layout, ready), credit


def _plan_priority(policy: Policy, numel: np.ndarray, ready: np.ndarray, link: Link) -> Plan:
    layout, credit = _partitions(policy, numel, DEFAULT_PARTITION_BYTES, DEFAULT_CREDIT_BYTES)
    total = int(numel.sum())
    if total == 0:
        return layout, fifo_order(layout, ready), credit
    busy = sum(link.seconds(b) for b in layout.part_bytes.tolist())
    return layout, simulate_order(layout, ready, credit, total / busy), credit


@dataclass(frozen=True)
class _Mode:
    """What a policy's name means: how it plans the collectives, and whether its updates run
    at the iteration barrier as the torch shim's do (``overlapped``: each layer's next
    forward waits for that layer alone) or after every collective (``none``, ``ddp``)."""

    plan: Callable[[Policy, np.ndarray, np.ndarray, Link], Plan]
    overlapped: bool


_MODES = {
    "none": _Mode(_plan_one_collective, overlapped=False),
    "ddp": _Mode(_plan_ddp_buckets, overlapped=False),
    "fifo": _Mode(_plan_fifo, overlapped=True),
    "priority": _Mode(_plan_priority, overlapped=True),
}
POLICIES = tuple(_MODES)  # ("none", "ddp", "fifo", "priority")


class _Run:
    """The event loop of ``simulate_step``: one instance per simulation."""

    def __init__(
        self,
        layers: list[Layer],
        link: Link,
        policy: Policy,
        slowdown: float,
        steps: int,
        link_slowdown: float = 0.0,
    ) -> None:
        layout, order, credit = plan(layers, link, policy)
        self.layers = layers
        self.queue = GradientQueue(layout, order, credit)
        self.part_s = [link.seconds(b) for b in layout.part_bytes.tolist()]
        self.queued_s = [link.seconds(b, queued=True) for b in layout.part_bytes.tolist()]
        self.overlapped = _MODES[policy.name].overlapped
        self.rate_while_busy = 1.0 / (1.0 + slowdown)
        self.link_rate_while_computing = 1.0 / (1.0 + link_slowdown)
        first = np.cumsum([0] + [len(layer.tensor_bytes) for layer in layers])
        self.tensors = [range(int(a), int(b)) for a, b in itertools.pairwise(first)]
        tensor_layer = np.repeat(np.arange(len(layers)), np.diff(first))
        self.part_layers = [
            sorted({int(tensor_layer[t]) for t, _, _ in layout.segments(p)})
            for p in range(layout.num_partitions)
        ]
        self.parts_per_layer = np.zeros(len(layers), dtype=np.int64)
        for touched in self.part_layers:
            self.parts_per_layer[touched] += 1
        n = len(layers)
        # The compute thread's program, (action, step, layer): forward, backward, step()
        # called, update of every layer (none and ddp only).
        self.ops: list[tuple[_Action, int, int]] = []
        for step in range(steps):
            self.ops += [(_FORWARD, step, i) for i in range(n)]
            self.ops += [(_BACKWARD, step, i) for i in range(n - 1, -1, -1)]
            self.ops += [(_STEP, step, -1)] + ([] if self.overlapped else [(_UPDATE, step, -1)])
        self.stamps: list[float] = []  # when each step() returned
        self.now = 0.0
        self.cursor = 0  # next op of the compute thread
        self.updated = np.zeros(n, dtype=np.int64)  # updates applied to each layer
        self.missing = self.parts_per_layer.copy()  # this step's partitions not yet reduced
        self.reduced = 0  # this step's partitions reduced
        self.applying = np.zeros(0, dtype=np.int64)  # layers the running op updates
        self.on_link: deque[tuple[int, bool]] = deque()  # issued (partition, queued)

    def _updates(self, target: int) -> float:
        """Start one optimizer call over every layer reduced and not updated to ``target``
        yet; its seconds."""
        self.applying = np.flatnonzero((self.missing == 0) & (self.updated < target))
        return sum(self.layers[j].update_s for j in self.applying.tolist())

    def _applied(self, target: int) -> None:
        """The running optimizer call ended: its layers are updated to ``target``."""
        self.updated[self.applying] = target
        self.applying = self.applying[:0]

    # What each action of the program does: when it must wait, its seconds, its effect.

    def _forward_blocked(self, step: int, layer: int) -> bool:
        if self.updated[layer] >= step:
            return False
        return not self.overlapped or bool(self.missing[layer])

    def _forward_work(self, step: int, layer: int) -> float:
        late = self.overlapped and self.updated[layer] < step
        return self.layers[layer].forward_s + (self._updates(step) if late else 0.0)

    def _forward_done(self, step: int, layer: int) -> None:
        if self.overlapped:
            self._applied(step)

    def _backward_work(self, step: int, layer: int) -> float:
        if layer == len(self.layers) - 1:  # a new step's backward: a new queue round
            self.queue.reset()
            self.missing = self.parts_per_layer.copy()
            self.reduced = 0
        return self.layers[layer].backward_s

    def _backward_done(self, step: int, layer: int) -> None:
        for t in self.tensors[layer]:
            self.queue.mark_ready(t)

    def _step_blocked(self, step: int, layer: int) -> bool:
        return not self.overlapped and self.reduced < len(self.part_s)

    def _step_work(self, step: int, layer: int) -> float:
        return self._updates(step + 1) if self.overlapped else 0.0

    def _step_done(self, step: int, layer: int) -> None:
        if self.overlapped:
            self._applied(step + 1)
            self.stamps.append(self.now)

    def _update_work(self, step: int, layer: int) -> float:
        return sum(layer.update_s for layer in self.layers)

    def _update_done(self, step: int, layer: int) -> None:
        self.updated[:] = step + 1
        self.stamps.append(self.now)

    def _never_blocked(self, step: int, layer: int) -> bool:
        return False

    def _op_done(self) -> None:
        action, step, layer = self.ops[self.cursor]
        self.cursor += 1
        action.done(self, step, layer)

    def _reduced(self, partition: int) -> None:
        self.queue.complete(partition)
        self.reduced += 1
        for j in self.part_layers[partition]:
            self.missing[j] -= 1

    def run(self) -> list[float]:
        """Simulate every step; the times at which each ``step()`` returned."""
        compute: float | None = None  # seconds of work left on each resource (None: idle)
        comm: float | None = None
        while self.cursor < len(self.ops) or self.on_link:
            while compute is None and self.cursor < len(self.ops):
                action, step, layer = self.ops[self.cursor]
                if action.blocked(self, step, layer):
                    break
                compute = action.work(self, step, layer)
                if compute == 0:
                    compute = None
                    self._op_done()
            while (p := self.queue.next_dispatch()) is not None:
                self.on_link.append((p, comm is not None or bool(self.on_link)))
            if comm is None and self.on_link:
                p, queued = self.on_link[0]
                comm = self.queued_s[p] if queued else self.part_s[p]
            rate = self.rate_while_busy if comm is not None else 1.0
            link_rate = self.link_rate_while_computing if compute is not None else 1.0
            ends = []
            if comm is not None:
                ends.append(comm / link_rate)
            if compute is not None:
                ends.append(compute / rate)
            if not ends and self.cursor == len(self.ops):
                break  # the last ops took no time
            if not ends:
                raise RuntimeError("gradient simulation stalled: nothing can progress (a bug)")
            dt = min(ends)
            self.now += dt
            # Whatever ends within this step ends (ties included); the rest advances.
            if comm is not None:
                comm = None if comm <= dt * link_rate else comm - dt * link_rate
                if comm is None:
                    self._reduced(self.on_link.popleft()[0])
            if compute is not None:
                compute = None if compute <= dt * rate else compute - dt * rate
                if compute is None:
                    self._op_done()
        return self.stamps


@dataclass(frozen=True)
class _Action:
    """One action of the training thread's program: whether it must wait now, the seconds
    it works once started, and what it leaves done (each ``(run, step, layer)``)."""

    name: str
    blocked: Callable[[_Run, int, int], bool]
    work: Callable[[_Run, int, int], float]
    done: Callable[[_Run, int, int], None]


_FORWARD = _Action("forward", _Run._forward_blocked, _Run._forward_work, _Run._forward_done)
_BACKWARD = _Action("backward", _Run._never_blocked, _Run._backward_work, _Run._backward_done)
_STEP = _Action("step", _Run._step_blocked, _Run._step_work, _Run._step_done)
_UPDATE = _Action("update", _Run._never_blocked, _Run._update_work, _Run._update_done)


def simulate_step(
    layers: list[Layer],
    link: Link,
    policy: Policy | str,
    slowdown: float = 0.0,
    steps: int = 6,
    link_slowdown: float = 0.0,
) -> StepResult:
    """Steady-state step time of ``layers`` training on ``link`` under ``policy``: the mean
    of the last ``steps // 2`` step-to-step intervals of ``steps`` simulated steps.
    ``slowdown`` and ``link_slowdown``: see the module docstring. Deterministic."""
    if isinstance(policy, str):
        policy = Policy.parse(policy)
    if not layers:
        raise ValueError("layers=[] must hold at least one layer")
    check_number("slowdown", slowdown, 0.0, hint=" (0: communication takes no compute)")
    check_number(
        "link_slowdown", link_slowdown, 0.0, hint=" (0: compute does not delay communication)"
    )
    check_int("steps", steps, 2)
    run = _Run(list(layers), link, policy, float(slowdown), steps, float(link_slowdown))
    stamps = run.run()
    tail = steps // 2
    compute = sum(layer.forward_s + layer.backward_s + layer.update_s for layer in layers)
    return StepResult(
        policy=policy.label,
        step_s=(stamps[-1] - stamps[-1 - tail]) / tail,
        compute_s=compute,
        collectives=len(run.part_s),
    )


def simulate_gradients(
    layers: list[Layer],
    link: Link,
    policies: tuple[Policy | str, ...] = POLICIES,
    slowdown: float = 0.0,
    link_slowdown: float = 0.0,
) -> list[StepResult]:
    """``simulate_step`` for each of ``policies`` (default: every policy, default knobs)."""
    return [
        simulate_step(layers, link, policy, slowdown, link_slowdown=link_slowdown)
        for policy in policies
    ]
