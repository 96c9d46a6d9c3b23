"""The pipeline schedules as programs, and the numba kernels that run and reorder them.

A *program* is one replica's step under a schedule family for a micro-batch count: every
device's operations in execution order (``kind``: F, B or W; ``chunk``: the device's model
chunk; ``slot``: the micro-batch's position in the order). Schedules with a fixed order
(1F1B, interleaved) are also flattened into one topological order of all operations with,
for each, the previous operation of its device and the operation whose output it needs,
so that a makespan is one pass over the operations (``simulate_fixed``). The zero-bubble
schedule chooses its weight-gradient operations by time, so it is simulated event by
event (``simulate_greedy``). ``search`` orders micro-batches with either.

Pure-Python references of both simulations live in ``tests/core/test_pipeline_kernels.py``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = [
    "B",
    "F",
    "Program",
    "W",
    "makespan",
    "program",
    "search",
    "simulate_fixed",
    "simulate_greedy",
]

# Operation kinds.
F, B, W = 0, 1, 2
_UNKNOWN = -1.0


class Program(NamedTuple):
    """One schedule's operations for one micro-batch count (arrays read-only, int64).

    ``kind``, ``chunk``, ``slot``: ``(stages, n)``, every device's operations in order.
    ``split``: whether backwards leave weight-gradient operations (zero-bubble).
    ``chunks``: model chunks in all (``stages · virtual``). ``flat_kind``, ``flat_slot``,
    ``prev``, ``dep``: for fixed orders, every operation in a topological order with the
    position (in that order) of its device's previous operation and of the operation it
    needs (``-1``: none); empty with ``split``.
    """

    kind: np.ndarray
    chunk: np.ndarray
    slot: np.ndarray
    split: bool
    chunks: int
    flat_kind: np.ndarray
    flat_slot: np.ndarray
    prev: np.ndarray
    dep: np.ndarray


@lru_cache(maxsize=128)
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
    ops = np.array(rows, dtype=np.int64)  # (stages, n, 3)
    kind, chunk, slot = (np.ascontiguousarray(ops[:, :, j]) for j in range(3))
    split = schedule == "zero_bubble"
    flat = _flatten(kind, chunk, slot) if not split else [np.empty(0, np.int64)] * 4
    arrays = [kind, chunk, slot, *flat]
    for a in arrays:
        a.setflags(write=False)
    return Program(kind, chunk, slot, split, stages * virtual, *flat)


def _device(
    stages: int, virtual: int, schedule: str, micro: int, d: int
) -> list[tuple[int, int, int]]:
    """Device ``d``'s forwards and backwards in order (1F1B's order for zero-bubble too)."""
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


def _flatten(kind: np.ndarray, chunk: np.ndarray, slot: np.ndarray) -> list[np.ndarray]:
    """A topological order of a fixed-order program: ``[kind, slot, prev, dep]``."""
    stages, n = kind.shape
    last = int(chunk.max() + 1) * stages - 1
    where: dict[tuple[int, int, int], int] = {}  # (kind, global chunk, slot) -> position
    order: list[tuple[int, int, int, int]] = []
    at = [0] * stages
    while len(order) < stages * n:
        moved = False
        for d in range(stages):
            while at[d] < n:
                op, k = int(kind[d, at[d]]), int(slot[d, at[d]])
                g = int(chunk[d, at[d]]) * stages + d
                need = (F, g - 1, k) if op == F else (B, g + 1, k)
                if (op == F and g == 0) or (op == B and g == last):
                    need = (-1, -1, -1)
                if need[0] >= 0 and need not in where:
                    break
                where[(op, g, k)] = len(order)
                order.append((op, k, d, where.get(need, -1)))
                at[d] += 1
                moved = True
        assert moved, "the schedule deadlocks"
    last_of = [-1] * stages
    prev = []
    for position, (_, _, d, _) in enumerate(order):
        prev.append(last_of[d])
        last_of[d] = position
    columns = list(zip(*order, strict=True))
    return [
        np.array(columns[0], np.int64),
        np.array(columns[1], np.int64),
        np.array(prev, np.int64),
        np.array(columns[3], np.int64),
    ]


@njit(cache=True)
def simulate_fixed(
    kind: np.ndarray,
    slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
    durations: np.ndarray,
    finish: np.ndarray,
) -> float:
    """The makespan of a fixed-order program (``Program``'s ``flat_kind``, ``flat_slot``,
    ``prev``, ``dep``): every operation starts once its device's previous operation and the
    operation it needs are done. ``durations[op, k]``: time of one operation of kind ``op``
    of slot ``k``; ``finish``: a buffer as long as ``kind``."""
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
def simulate_greedy(
    kind: np.ndarray,
    chunk: np.ndarray,
    slot: np.ndarray,
    durations: np.ndarray,
    split: bool,
    finish_f: np.ndarray,
    finish_b: np.ndarray,
    queue: np.ndarray,
) -> float:
    """The makespan of one replica's step. Device ``d`` runs its forward and backward
    operations (``kind[d]``, ``chunk[d]``, ``slot[d]``: ``(stages, n)`` int64) in order,
    each once the device is free and its input is done. With ``split``, every backward
    leaves a weight-gradient operation W of the same chunk and micro-batch, which the
    device runs, oldest first, whenever its next operation's input is not done yet, and at
    the end. ``durations[op, k]``: time of one operation of kind ``op`` (F, B, W) of slot
    ``k`` on one chunk. Devices are advanced in time order (the free one with the earliest
    time first, the lowest index on a tie), so a W is chosen exactly when the input is
    not there yet. ``finish_f``, ``finish_b``: ``(stages · virtual, micro)`` buffers;
    ``queue``: ``(stages, n)`` int64. Returns -1.0 if the order deadlocks."""
    stages, n = kind.shape
    last = finish_f.shape[0] - 1
    finish_f[:, :] = _UNKNOWN
    finish_b[:, :] = _UNKNOWN
    at = np.zeros(stages, np.int64)
    head = np.zeros(stages, np.int64)
    tail = np.zeros(stages, np.int64)
    blocked = np.zeros(stages, np.bool_)
    free = np.zeros(stages)
    d = 0
    while True:
        # Without W to choose, any order gives the same times: stay on a device while it
        # can go on.
        if split or blocked[d] or at[d] == n:
            d = -1
            for e in range(stages):
                if not blocked[e] and (at[e] < n or head[e] < tail[e]):
                    if d < 0 or free[e] < free[d]:
                        d = e
            if d < 0:
                break
        t = free[d]
        waiting = head[d] < tail[d]
        if at[d] < n:
            i = at[d]
            op = kind[d, i]
            k = slot[d, i]
            g = chunk[d, i] * stages + d
            ready = 0.0
            if op == F and g > 0:
                ready = finish_f[g - 1, k]
            elif op == B:
                ready = finish_f[g, k]
                if g < last:
                    after = finish_b[g + 1, k]
                    ready = after if after < 0 else max(ready, after)
            if ready >= 0 and (ready <= t or not waiting):
                end = max(t, ready) + durations[op, k]
                if op == F:
                    finish_f[g, k] = end
                    if g < last:
                        blocked[(g + 1) % stages] = False
                else:
                    finish_b[g, k] = end
                    if g > 0:
                        blocked[(g - 1) % stages] = False
                    if split:
                        queue[d, tail[d]] = k
                        tail[d] += 1
                free[d] = end
                at[d] = i + 1
                continue
            if not waiting:
                blocked[d] = True
                continue
        k = queue[d, head[d]]
        head[d] += 1
        free[d] = t + durations[W, k]
    for e in range(stages):
        if at[e] < n:
            return -1.0
    return free.max()


@njit(cache=True)
def _evaluate(
    order: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    kind: np.ndarray,
    chunk: np.ndarray,
    slot: np.ndarray,
    split: bool,
    flat_kind: np.ndarray,
    flat_slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
    durations: np.ndarray,
    finish: np.ndarray,
    finish_f: np.ndarray,
    finish_b: np.ndarray,
    queue: np.ndarray,
) -> float:
    """The makespan of micro-batch ``order[k]`` in slot ``k`` (``units``: time per unit of
    cost of F, B and W on one chunk)."""
    for k in range(order.shape[0]):
        for op in range(3):
            durations[op, k] = units[op] * costs[order[k]]
    if split:
        return simulate_greedy(kind, chunk, slot, durations, True, finish_f, finish_b, queue)
    return simulate_fixed(flat_kind, flat_slot, prev, dep, durations, finish)


@njit(cache=True)
def _factorial_at_most(m: int, limit: int) -> bool:
    """Whether ``m! <= limit``."""
    product = 1
    for i in range(2, m + 1):
        product *= i
        if product > limit:
            return False
    return True


@njit(cache=True)
def _every_order(
    order: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    kind: np.ndarray,
    chunk: np.ndarray,
    slot: np.ndarray,
    split: bool,
    flat_kind: np.ndarray,
    flat_slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
    durations: np.ndarray,
    finish: np.ndarray,
    finish_f: np.ndarray,
    finish_b: np.ndarray,
    queue: np.ndarray,
) -> np.ndarray:
    """The first order of least makespan among every permutation of ``order``, visited in
    Heap's order."""
    m = order.shape[0]
    best = order.copy()
    low = _evaluate(
        order, costs, units, kind, chunk, slot, split, flat_kind, flat_slot, prev, dep,
        durations, finish, finish_f, finish_b, queue,
    )  # fmt: skip
    counter = np.zeros(m, np.int64)
    i = 1
    while i < m:
        if counter[i] < i:
            j = 0 if i % 2 == 0 else counter[i]
            order[j], order[i] = order[i], order[j]
            value = _evaluate(
                order, costs, units, kind, chunk, slot, split, flat_kind, flat_slot, prev, dep,
                durations, finish, finish_f, finish_b, queue,
            )  # fmt: skip
            if value < low * (1.0 - 1e-12):
                low = value
                best[:] = order
            counter[i] += 1
            i = 1
        else:
            counter[i] = 0
            i += 1
    return best


@njit(cache=True)
def _search(
    starts: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    budget: int,
    kind: np.ndarray,
    chunk: np.ndarray,
    slot: np.ndarray,
    split: bool,
    chunks: int,
    flat_kind: np.ndarray,
    flat_slot: np.ndarray,
    prev: np.ndarray,
    dep: np.ndarray,
) -> np.ndarray:
    m = costs.shape[0]
    durations = np.empty((3, m))
    finish = np.empty(flat_kind.shape[0])
    finish_f = np.empty((chunks, m))
    finish_b = np.empty((chunks, m))
    queue = np.empty(kind.shape, np.int64)
    best = starts[0].copy()
    low = np.inf
    if _factorial_at_most(m, budget):
        return _every_order(
            best, costs, units, kind, chunk, slot, split, flat_kind, flat_slot, prev, dep,
            durations, finish, finish_f, finish_b, queue,
        )  # fmt: skip
    for c in range(starts.shape[0]):
        value = _evaluate(
            starts[c], costs, units, kind, chunk, slot, split, flat_kind, flat_slot, prev, dep,
            durations, finish, finish_f, finish_b, queue,
        )  # fmt: skip
        if value < low:
            low = value
            best[:] = starts[c]
    spent = starts.shape[0]
    ends = np.empty(m, np.int64)
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
                value = _evaluate(
                    best, costs, units, kind, chunk, slot, split, flat_kind, flat_slot, prev,
                    dep, durations, finish, finish_f, finish_b, queue,
                )  # fmt: skip
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
    m = costs.shape[0]
    return float(_evaluate(np.arange(m), costs, units, *_arrays(prog, m)))


def search(
    prog: Program, starts: np.ndarray, costs: np.ndarray, units: np.ndarray, budget: int
) -> np.ndarray:
    """Every order when ``M!`` is at most ``budget`` (the best, exactly); else the best of
    the ``starts`` orders (``(c, M)`` int64, each a permutation; the first on a tie),
    improved by swapping two micro-batches of different costs while a swap shortens the
    makespan (first improvement; the positions nearest the ends, where the pipeline fills
    and drains, tried first), for at most ``budget`` simulations in all (never fewer than
    the starts).

    Args:
        prog: the schedule's program for ``costs.shape[0]`` micro-batches.
        starts: ``(c, M)`` int64 orders to start from.
        costs: ``float64`` cost per micro-batch.
        units: ``float64`` time per unit of cost of F, B and W on one chunk.
        budget: simulations at most.

    Example::

        >>> units = np.array([1 / 12, 2 / 12, 0.0])  # Pipeline(stages=4)'s F, B and W
        >>> search(program(4, 1, "1f1b", 4), np.array([[0, 1, 2, 3]]),
        ...        np.array([4.0, 4.0, 1.0, 1.0]), units, 50).tolist()
        [2, 3, 0, 1]
    """
    m = costs.shape[0]
    fixed = (starts, costs, units, budget)
    arrays = _arrays(prog, m)
    return _search(*fixed, *arrays[:4], prog.chunks, *arrays[4:8])


def _arrays(prog: Program, m: int) -> tuple:
    """``_evaluate``'s arguments after ``order``, ``costs`` and ``units``."""
    return (
        prog.kind,
        prog.chunk,
        prog.slot,
        prog.split,
        prog.flat_kind,
        prog.flat_slot,
        prog.prev,
        prog.dep,
        np.empty((3, m)),
        np.empty(prog.flat_kind.shape[0]),
        np.empty((prog.chunks, m)),
        np.empty((prog.chunks, m)),
        np.empty(prog.kind.shape, np.int64),
    )
