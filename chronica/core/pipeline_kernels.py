"""The pipeline schedules as programs, and the numba kernels that run and reorder them.

A *program* is one replica's step under a schedule family for a micro-batch count: every
device's operations in execution order (``kind``: F, B or W; ``chunk``: the device's model
chunk; ``slot``: the micro-batch's position in the order), flattened into one topological
order of all operations with, for each, the previous operation of its device and the
operation whose output it needs. A makespan is then one pass over the operations
(``simulate``), and ``search`` orders micro-batches with it.

The zero-bubble order is derived once per program: each device, when free, runs its next
forward or input-gradient backward if its input is there, else its oldest pending
weight-gradient operation, else waits; run with F = B = W = 1 (ZB-H1's setting), that
gives ZB-H1's schedule, which the program then fixes, as a zero-bubble runtime runs a
precomputed schedule.

Pure-Python references live in ``tests/helpers/pipeline_reference.py``.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = ["B", "F", "Program", "W", "makespan", "program", "search", "simulate"]

# Operation kinds.
F, B, W = 0, 1, 2


class Program(NamedTuple):
    """One schedule's operations for one micro-batch count (read-only int64 arrays).

    ``kind``, ``chunk``, ``slot``: ``(stages, n)``, every device's operations in order.
    ``flat_kind``, ``flat_slot``, ``prev``, ``dep``: every operation in a topological
    order, with the position (in that order) of its device's previous operation and of
    the operation it needs (``-1``: none).
    """

    kind: np.ndarray
    chunk: np.ndarray
    slot: np.ndarray
    flat_kind: np.ndarray
    flat_slot: np.ndarray
    prev: np.ndarray
    dep: np.ndarray


@lru_cache(maxsize=256)
def program(stages: int, virtual: int, schedule: str, micro: int) -> Program:
    """The program of ``schedule`` (``"1f1b"``, ``"interleaved"`` or ``"zero_bubble"``) for
    ``micro`` micro-batches on ``stages`` devices of ``virtual`` chunks each (arguments as
    ``chronica.core.pipeline.Pipeline`` validates them; interleaved needs ``micro`` a
    multiple of ``stages``). Cached.

    Args:
        stages: devices, ``>= 1``.
        virtual: chunks per device, ``>= 1`` (``>= 2`` for interleaved).
        schedule: the schedule family.
        micro: micro-batches, ``>= 1``.

    Example::

        >>> program(2, 1, "1f1b", 2).kind.tolist()  # device 0: F F B B; device 1: F B F B
        [[0, 0, 1, 1], [0, 1, 0, 1]]
    """
    rows = [_device(stages, virtual, schedule, micro, d) for d in range(stages)]
    if schedule == "zero_bubble":
        rows = _with_weight_gradients(rows)
    ops = np.array(rows, dtype=np.int64)  # (stages, n, 3)
    kind, chunk, slot = (np.ascontiguousarray(ops[:, :, j]) for j in range(3))
    arrays = [kind, chunk, slot, *_flatten(kind, chunk, slot, stages * virtual)]
    for a in arrays:
        a.setflags(write=False)
    return Program(*arrays)


def _device(
    stages: int, virtual: int, schedule: str, micro: int, d: int
) -> list[tuple[int, int, int]]:
    """Device ``d``'s forwards and backwards in order (1F1B's for zero-bubble too)."""
    if schedule == "interleaved":
        return _interleaved(stages, virtual, micro, d)
    warm = min(stages - d - 1, micro)
    ops = [(F, 0, k) for k in range(warm)]
    for i in range(micro - warm):
        ops += [(F, 0, warm + i), (B, 0, i)]
    return ops + [(B, 0, k) for k in range(micro - warm, micro)]


def _interleaved(stages: int, virtual: int, micro: int, d: int) -> list[tuple[int, int, int]]:
    """Megatron's interleaved 1F1B on device ``d``: forward ``i`` is chunk ``(i // S) % V``
    of micro-batch ``(i // (S·V))·S + i % S``; backwards take the chunks in reverse."""
    total = micro * virtual

    def which(i: int, backward: bool) -> tuple[int, int]:
        group = (i // stages) % virtual
        return (
            virtual - 1 - group if backward else group,
            (i // (stages * virtual)) * stages + i % stages,
        )

    warm = total if micro == stages else min((stages - d - 1) * 2 + (virtual - 1) * stages, total)
    ops = [(F, *which(i, False)) for i in range(warm)]
    for i in range(total - warm):
        ops += [(F, *which(warm + i, False)), (B, *which(i, True))]
    return ops + [(B, *which(i, True)) for i in range(total - warm, total)]


def _with_weight_gradients(rows: list[list[tuple[int, int, int]]]) -> list:
    """ZB-H1's order (one chunk per device): the devices' forward/backward orders with
    every backward's weight-gradient operation W placed where a device, when free at
    F = B = W = 1, runs its oldest pending W because its next operation's input is not
    there yet, or at the end. Integer times: no tie is a rounding accident."""
    stages = len(rows)
    done: dict[tuple[int, int, int], int] = {}  # (kind, device, slot) -> end time
    free, at = [0] * stages, [0] * stages
    pending: list[deque[int]] = [deque() for _ in range(stages)]
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(stages)]
    blocked = [False] * stages
    while True:
        live = [d for d in range(stages) if not blocked[d] and (at[d] < len(rows[d]) or pending[d])]
        if not live:
            break
        d = min(live, key=lambda e: (free[e], e))
        if at[d] < len(rows[d]):
            kind, _, k = rows[d][at[d]]
            source = (F, d - 1, k) if kind == F else (B, d + 1, k)
            first = (kind == F and d == 0) or (kind == B and d == stages - 1)
            ready = 0 if first else done.get(source)
            if ready is not None and (ready <= free[d] or not pending[d]):
                free[d] = max(free[d], ready) + 1
                done[(kind, d, k)] = free[d]
                out[d].append(rows[d][at[d]])
                at[d] += 1
                if kind == B:
                    pending[d].append(k)
                blocked = [False] * stages
                continue
            if not pending[d]:
                blocked[d] = True
                continue
        out[d].append((W, 0, pending[d].popleft()))
        free[d] += 1
    assert all(at[d] == len(rows[d]) for d in range(stages)), "the schedule deadlocks"
    return out


def _flatten(kind: np.ndarray, chunk: np.ndarray, slot: np.ndarray, chunks: int) -> list:
    """A topological order of the program: ``[kind, slot, prev, dep]`` (see ``Program``)."""
    stages, n = kind.shape
    where: dict[tuple[int, int, int], int] = {}  # (kind, global chunk, slot) -> position
    order: list[tuple[int, int, int, int]] = []  # (kind, slot, device, dep)
    at = [0] * stages
    while len(order) < stages * n:
        moved = False
        for d in range(stages):
            while at[d] < n:
                op, k = int(kind[d, at[d]]), int(slot[d, at[d]])
                g = int(chunk[d, at[d]]) * stages + d
                need = None
                if op == F and g > 0:
                    need = (F, g - 1, k)
                elif op == B and g < chunks - 1:
                    need = (B, g + 1, k)
                if need is not None and need not in where:
                    break
                where[(op, g, k)] = len(order)
                order.append((op, k, d, -1 if need is None else where[need]))
                at[d] += 1
                moved = True
        assert moved, "the schedule deadlocks"
    last_of = [-1] * stages
    prev = []
    for position, (_, _, d, _) in enumerate(order):
        prev.append(last_of[d])
        last_of[d] = position
    ops, slots, _, deps = zip(*order, strict=True)
    return [np.array(c, np.int64) for c in (ops, slots, prev, deps)]


@njit(cache=True)
def simulate(
    kind: np.ndarray,
    slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
    durations: np.ndarray,
    finish: np.ndarray,
) -> float:
    """The makespan of a program (``Program``'s ``flat_kind``, ``flat_slot``, ``prev``,
    ``dep``): every operation starts once its device's previous operation and the
    operation it needs are done.

    Args:
        kind: ``int64`` kind (F, B, W) of every operation, in topological order.
        slot: ``int64`` slot of every operation.
        prev: ``int64`` position of the device's previous operation (``-1``: none).
        dep: ``int64`` position of the operation it needs (``-1``: none).
        durations: ``float64`` ``(3, M)``: time of one operation of each kind and slot.
        finish: a ``float64`` buffer as long as ``kind``; overwritten.

    Example::

        >>> p = program(2, 1, "1f1b", 1)
        >>> simulate(p.flat_kind, p.flat_slot, p.prev, p.dep, np.array([[1.0], [2.0], [0.0]]),
        ...          np.empty(4))
        6.0
    """
    end = 0.0
    for i in range(kind.shape[0]):
        start = 0.0
        if prev[i] >= 0:
            start = finish[prev[i]]
        if dep[i] >= 0 and finish[dep[i]] > start:
            start = finish[dep[i]]
        finish[i] = start + durations[kind[i], slot[i]]
        if finish[i] > end:
            end = finish[i]
    return end


@njit(cache=True)
def _evaluate(
    order: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    kind: np.ndarray,
    slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
    durations: np.ndarray,
    finish: np.ndarray,
) -> float:
    """The makespan with micro-batch ``order[k]`` in slot ``k`` (``units``: time per unit
    of cost of F, B and W on one chunk)."""
    for k in range(order.shape[0]):
        for op in range(3):
            durations[op, k] = units[op] * costs[order[k]]
    return simulate(kind, slot, prev, dep, durations, finish)


@njit(cache=True)
def _factorial_at_most(m: int, limit: int) -> bool:
    product = 1
    for i in range(2, m + 1):
        product *= i
        if product > limit:
            return False
    return True


@njit(cache=True)
def _search(
    starts: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    budget: int,
    kind: np.ndarray,
    slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
) -> np.ndarray:
    m = costs.shape[0]
    durations = np.empty((3, m))
    finish = np.empty(kind.shape[0])
    best = starts[0].copy()
    low = _evaluate(best, costs, units, kind, slot, prev, dep, durations, finish)
    if _factorial_at_most(m, budget):
        # Every order, in Heap's order; the first of least makespan.
        order = best.copy()
        counter = np.zeros(m, np.int64)
        i = 1
        while i < m:
            if counter[i] < i:
                j = 0 if i % 2 == 0 else counter[i]
                order[j], order[i] = order[i], order[j]
                value = _evaluate(order, costs, units, kind, slot, prev, dep, durations, finish)
                if value < low * (1.0 - 1e-12):
                    low = value
                    best[:] = order
                counter[i] += 1
                i = 1
            else:
                counter[i] = 0
                i += 1
        return best
    for c in range(1, starts.shape[0]):
        value = _evaluate(starts[c], costs, units, kind, slot, prev, dep, durations, finish)
        if value < low:
            low = value
            best[:] = starts[c]
    spent = starts.shape[0]
    ends = np.empty(m, np.int64)  # positions from the ends inwards: 0, M-1, 1, M-2, ...
    for i in range(m):
        ends[i] = i // 2 if i % 2 == 0 else m - 1 - i // 2
    improved = True
    while improved and spent < budget:
        improved = False
        for a in range(m):
            for b in range(a + 1, m):
                if spent >= budget:
                    return best
                i, j = ends[a], ends[b]
                if costs[best[i]] == costs[best[j]]:
                    continue
                best[i], best[j] = best[j], best[i]
                value = _evaluate(best, costs, units, kind, slot, prev, dep, durations, finish)
                spent += 1
                if value < low * (1.0 - 1e-12):
                    low = value
                    improved = True
                else:
                    best[i], best[j] = best[j], best[i]
    return best


def makespan(prog: Program, costs: np.ndarray, units: np.ndarray) -> float:
    """The makespan of ``prog`` with slot ``k`` costing ``costs[k]``.

    Args:
        prog: the schedule's program for ``costs.shape[0]`` micro-batches.
        costs: ``float64`` cost per slot, finite and ``>= 0``.
        units: ``float64`` time per unit of cost of F, B and W on one chunk.

    Example::

        >>> makespan(program(2, 1, "1f1b", 2), np.array([1.0, 1.0]), np.array([0.25, 0.25, 0]))
        1.5
    """
    durations = np.outer(units, costs)
    return float(
        simulate(
            prog.flat_kind,
            prog.flat_slot,
            prog.prev,
            prog.dep,
            durations,
            np.empty(prog.flat_kind.shape[0]),
        )
    )


def search(
    prog: Program, starts: np.ndarray, costs: np.ndarray, units: np.ndarray, budget: int
) -> np.ndarray:
    """Every order when ``M!`` is at most ``budget`` (the best, exactly; the first of least
    makespan in Heap's order from ``starts[0]``); else the best of the ``starts`` orders
    (the first on a tie), improved by swapping two micro-batches of different costs while
    a swap shortens the makespan (first improvement; the positions nearest the ends, where
    the pipeline fills and drains, tried first), for at most ``budget`` simulations in
    all (never fewer than the starts).

    Args:
        prog: the schedule's program for ``costs.shape[0]`` micro-batches.
        starts: ``(c, M)`` int64 orders (permutations) to start from.
        costs: ``float64`` cost per micro-batch.
        units: ``float64`` time per unit of cost of F, B and W on one chunk.
        budget: simulations at most.

    Example::

        >>> units = np.array([1 / 12, 2 / 12, 0.0])  # Pipeline(stages=4)'s F, B and W
        >>> search(program(4, 1, "1f1b", 5), np.array([[0, 1, 2, 3, 4]]),
        ...        np.array([4.0, 4.0, 4.0, 1.0, 1.0]), units, 10).tolist()
        [3, 4, 2, 0, 1]
    """
    return _search(
        starts, costs, units, budget, prog.flat_kind, prog.flat_slot, prog.prev, prog.dep
    )
