"""Pure-Python references of the pipeline model (``chronica.core.pipeline``): every
schedule's per-device operations written out from their definitions, and a makespan
computed without the kernels' topological order or event loop.

An operation ends its duration after the later of its device's previous operation and the
operation it needs: a memoised recursion over that definition. Zero-bubble's order comes
from a discrete-event run at F = B = W = 1 in which each device, when free, runs its next
forward or backward if its input is done by then, else its oldest pending weight-gradient
operation, else waits for the input.
"""

from __future__ import annotations

import sys
from collections import deque
from functools import cache

F, B, W = "F", "B", "W"


def device_operations(stages: int, virtual: int, schedule: str, micro: int, d: int) -> list:
    """Device ``d``'s forwards and backwards in order: ``(kind, chunk, micro-batch)``."""
    if schedule == "interleaved":
        total = micro * virtual
        per_group = stages * virtual

        def forward(i):
            return (F, (i // stages) % virtual, (i // per_group) * stages + i % stages)

        def backward(i):
            return (
                B,
                virtual - 1 - (i // stages) % virtual,
                (i // per_group) * stages + i % stages,
            )

        if micro == stages:
            warm = total
        else:
            warm = min((stages - d - 1) * 2 + (virtual - 1) * stages, total)
        ops = [forward(i) for i in range(warm)]
        for i in range(total - warm):
            ops += [forward(warm + i), backward(i)]
        return ops + [backward(i) for i in range(total - warm, total)]
    warm = min(stages - d - 1, micro)
    ops = [(F, 0, k) for k in range(warm)]
    for i in range(micro - warm):
        ops += [(F, 0, warm + i), (B, 0, i)]
    return ops + [(B, 0, k) for k in range(micro - warm, micro)]


def zero_bubble_operations(stages: int, micro: int) -> list[list[tuple]]:
    """ZB-H1's per-device order: a discrete-event run at F = B = W = 1 in which a device,
    when free, runs its next forward or backward if its input is done by then, else its
    oldest pending W, else waits; every operation recorded where it ran."""
    lists = [device_operations(stages, 1, "1f1b", micro, d) for d in range(stages)]
    done: dict[tuple, int] = {}
    free, at = [0] * stages, [0] * stages
    pending: list[deque] = [deque() for _ in range(stages)]
    out: list[list[tuple]] = [[] for _ in range(stages)]
    waiting = [False] * stages  # no W to run and the input is not simulated yet
    while True:
        live = [
            d for d in range(stages) if not waiting[d] and (at[d] < len(lists[d]) or pending[d])
        ]
        if not live:
            break
        d = min(live, key=lambda e: (free[e], e))
        if at[d] < len(lists[d]):
            op = lists[d][at[d]]
            need = _needs(op, d, stages, stages)
            ready = 0 if need is None else done.get(need)
            if ready is not None and (ready <= free[d] or not pending[d]):
                free[d] = max(free[d], ready) + 1
                done[(op[0], d, op[2])] = free[d]
                out[d].append(op)
                if op[0] == B:
                    pending[d].append(op[2])
                at[d] += 1
                waiting = [False] * stages
                continue
            if not pending[d]:
                waiting[d] = True
                continue
        out[d].append((W, 0, pending[d].popleft()))
        free[d] += 1
    return out


def reference_makespan(
    costs: list[float], stages: int, virtual: int, schedule: str, backward_ratio: float
) -> float:
    """The makespan of micro-batches of ``costs`` (in order) under the schedule: an
    operation ends its duration after the later of its device's previous operation and
    the operation it needs (a memoised recursion)."""
    chunks = stages * virtual
    forward = 1.0 / ((1.0 + backward_ratio) * chunks)
    backward = backward_ratio * forward
    micro = len(costs)
    if schedule == "zero_bubble":
        unit = {F: forward, B: backward / 2, W: backward / 2}
        lists = zero_bubble_operations(stages, micro)
    else:
        unit = {F: forward, B: backward, W: 0.0}
        lists = [device_operations(stages, virtual, schedule, micro, d) for d in range(stages)]
    place = {}  # (kind, global chunk, micro) -> (device, position)
    for d, ops in enumerate(lists):
        for i, (kind, chunk, k) in enumerate(ops):
            place[(kind, chunk * stages + d, k)] = (d, i)

    @cache
    def end(d: int, i: int) -> float:
        kind, _, k = lists[d][i]
        start = end(d, i - 1) if i > 0 else 0.0
        need = _needs(lists[d][i], d, stages, chunks)
        if need is not None:
            start = max(start, end(*place[need]))
        return start + unit[kind] * costs[k]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        return max(end(d, len(ops) - 1) for d, ops in enumerate(lists))
    finally:
        sys.setrecursionlimit(limit)


def _needs(op: tuple, d: int, stages: int, chunks: int) -> tuple | None:
    """The operation whose output ``op`` on device ``d`` needs (``None``: none; a W needs
    only its own backward, which runs before it on the device)."""
    kind, chunk, k = op
    g = chunk * stages + d
    if kind == F:
        return None if g == 0 else (F, g - 1, k)
    if kind == B:
        return None if g == chunks - 1 else (B, g + 1, k)
    return None
