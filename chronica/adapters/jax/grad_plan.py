"""The plan of the JAX gradient shim: a gradient tree's structure and knobs (``Plan``), its
partitions with one compiled cross-process reduction each (``Partitions``, ``lay_out``), and
the knobs as 32-bit words for agreeing on them (JAX without x64 has no int64 arrays).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from chronica.core.priority import (
    GradientQueue,
    Layout,
    bucket_layout,
    build_layout,
    fifo_order,
    simulate_order,
)
from chronica.runtime.dispatcher import SchedulingOptions
from chronica.runtime.gradients import BUCKET_BYTES, FIRST_BUCKET_BYTES, PlanRecord

__all__ = ["AXIS", "Partitions", "Plan", "knob_words", "knobs_from_words", "lay_out", "program"]

AXIS = "processes"
ORDER_CODES = {"priority": 0, "fifo": 1}


@functools.lru_cache(maxsize=256)
def program(
    mesh: Mesh, spec: tuple[tuple[int, int, int, tuple[int, ...]], ...], world: int
) -> Callable[..., tuple[jax.Array, ...]]:
    """The compiled reduction of one partition: ``spec`` holds, per segment, the input it
    comes from, its element range and the shape it is handed back in."""

    def reduce(*shards: jax.Array) -> tuple[jax.Array, ...]:
        flat = [shards[i].reshape(-1)[a:b] for i, a, b, _ in spec]
        buf = flat[0] if len(flat) == 1 else jnp.concatenate(flat)
        # psum then divide, as jax.lax.pmean does: the same arithmetic as the plain mean.
        mean = jax.lax.psum(buf, AXIS) / world
        outs, offset = [], 0
        for _, a, b, shape in spec:
            outs.append(mean[offset : offset + b - a].reshape(shape))
            offset += b - a
        return tuple(outs)

    return jax.jit(
        jax.shard_map(reduce, mesh=mesh, in_specs=PartitionSpec(AXIS), out_specs=PartitionSpec())
    )


@dataclass
class Partitions:
    """A plan's partitions and their programs (laid out only with more than one process)."""

    layout: Layout
    queue: GradientQueue
    inputs: list[tuple[int, ...]]  # per partition: leaf indices fed in
    outputs: list[list[tuple[int, int, bool]]]  # (leaf, start, whole leaf?)
    programs: list[Any]
    record: PlanRecord
    parts_per_leaf: np.ndarray


@dataclass
class Plan:
    """Everything fixed for one gradient tree structure and one set of knobs."""

    paths: list[str]
    shapes: list[tuple[int, ...]]
    priority: list[int]  # priority position -> leaf index (tree order)
    dtypes: list[Any]  # by priority position
    options: SchedulingOptions
    parts: Partitions | None = None


def lay_out(plan: Plan, engine: str, mesh: Mesh, world: int) -> Partitions:
    """The partitions of ``plan`` for ``engine`` and their compiled reductions.

    ``"bucketed"``: DDP's buckets in backward order, nothing bounding the bytes in flight;
    ``"scheduled"``: ``plan.options``' partitions, in priority (or ``fifo``) order under
    credit. A pure function of the plan, the engine and the world: the same on every process.

    Args:
        plan: the gradient tree's structure, priority and knobs (``Plan``).
        engine: ``"bucketed"`` or ``"scheduled"``.
        mesh: one device per process, the reduction's mesh.
        world: number of processes.

    Example::

        >>> parts = lay_out(plan, "scheduled", mesh, 2)   # doctest: +SKIP
        >>> parts.record.labels[0]                         # doctest: +SKIP
        "['stem']['w']"
    """
    opts, dtypes = plan.options, plan.dtypes
    numel = np.array([int(np.prod(plan.shapes[i])) for i in plan.priority], np.int64)
    itemsize = np.array([np.dtype(d).itemsize for d in dtypes], np.int64)
    keys = np.array([zlib.crc32(str(d).encode()) for d in dtypes], np.int64)
    if engine == "bucketed":
        # DDP's buckets in backward order (the last layer's gradient would be ready first).
        layout = bucket_layout(numel, itemsize, BUCKET_BYTES, FIRST_BUCKET_BYTES, keys)
        order = fifo_order(layout, np.arange(len(numel), 0, -1, dtype=np.float64))
        credit = 0  # nothing bounds the bytes in flight
    else:
        layout = build_layout(numel, itemsize, opts.partition_bytes, keys)
        credit = opts.credit_bytes
        if opts.order == "fifo":
            # Backward order: the last layer's gradient would be ready first.
            order = fifo_order(layout, np.arange(len(numel), 0, -1, dtype=np.float64))
        else:
            # One jax.grad program yields every leaf at once: all are ready together, so
            # the simulated preemptive scheduler dispatches in pure priority order.
            order = simulate_order(layout, np.zeros(len(numel)), credit, 1.0)
    queue = GradientQueue(layout, order, credit or int(layout.part_bytes.sum()) + 1)
    inputs: list[tuple[int, ...]] = []
    outputs: list[list[tuple[int, int, bool]]] = []
    programs: list[Any] = []
    for p in range(layout.num_partitions):
        segs = layout.segments(p)
        leaf_ids = list(dict.fromkeys(plan.priority[t] for t, _, _ in segs))
        spec, outs = [], []
        for t, a, b in segs:
            leaf = plan.priority[t]
            whole = b - a == numel[t]
            spec.append((leaf_ids.index(leaf), a, b, plan.shapes[leaf] if whole else (b - a,)))
            outs.append((leaf, a, whole))
        inputs.append(tuple(leaf_ids))
        outputs.append(outs)
        programs.append(program(mesh, tuple(spec), world))
    names = [plan.paths[i] for i in plan.priority]
    parts_per_leaf = np.empty(len(numel), np.int64)
    parts_per_leaf[plan.priority] = layout.parts_per_tensor()
    return Partitions(
        layout=layout,
        queue=queue,
        inputs=inputs,
        outputs=outputs,
        programs=programs,
        record=PlanRecord(layout, names, layout.partition_bytes, credit),
        parts_per_leaf=parts_per_leaf,
    )


def knob_words(opts: SchedulingOptions) -> np.ndarray:
    """The knobs that must agree, as 32-bit words (JAX without x64 has no int64 arrays)."""
    p, c = opts.partition_bytes, opts.credit_bytes
    return np.array(
        [p >> 32, p & 0xFFFFFFFF, c >> 32, c & 0xFFFFFFFF]
        + [ORDER_CODES[opts.order], int(opts.auto_tune)],
        np.uint32,
    )


def knobs_from_words(base: SchedulingOptions, words: np.ndarray) -> SchedulingOptions:
    w = [int(x) for x in words[:6]]
    return replace(
        base,
        partition_bytes=(w[0] << 32) | w[1],
        credit_bytes=(w[2] << 32) | w[3],
        order={v: k for k, v in ORDER_CODES.items()}[w[4]],
        auto_tune=bool(w[5]),
    )
