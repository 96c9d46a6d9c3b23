"""Flat gradient buffers for ``ScheduledOptimizer``: packing, used flags and bucketed all-reduce.

Each partition of a ``chronica.core.priority.Layout`` owns one preallocated flat buffer; a
gradient is copied into its partitions' buffers once it is final, and after the all-reduce
the averaged buffer is handed back (as a view when the tensor was not cut, so nothing is
copied back). Every tensor also owns one *used flag* element in the buffer of its first
partition: 1 where this rank's backward produced its gradient, else 0; after the sum it is
positive exactly where some rank used the tensor. That is DDP's ``find_unused_parameters``
information carried by the gradients' own collectives, without an extra one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chronica.core.priority import GradientQueue, Layout

__all__ = ["Buckets", "Packing"]

_UNLIMITED = 1 << 62


class Packing:
    """Preallocated buffers of ``layout``'s partitions for ``params`` (in layout order).

    Guarantees: after ``fill`` of every tensor, one sum all-reduce of every buffer and
    ``complete`` of every partition, each tensor's ``.grad`` holds the average over ranks and
    ``used[t]`` says whether any rank used tensor ``t``.
    """

    def __init__(self, layout: Layout, params: list[torch.Tensor]) -> None:
        self.layout = layout
        self.params = params
        self.buffers: list[torch.Tensor] = []
        self.used = np.ones(len(params), dtype=bool)
        # per tensor: (partition, start, stop, offset in the partition's buffer)
        self._places: list[list[tuple[int, int, int, int]]] = [[] for _ in params]
        self._flag: list[tuple[int, int]] = [(0, 0)] * len(params)
        self._segments: list[list[tuple[int, int, int, int]]] = []
        self._flagged: list[tuple[int, list[int]]] = []  # per partition: data length, tensors
        for p in range(layout.num_partitions):
            segs = layout.segments(p)
            length = sum(b - a for _, a, b in segs)
            flagged = [t for t, a, _ in segs if a == 0]
            first = params[segs[0][0]]
            self.buffers.append(
                torch.zeros(length + len(flagged), dtype=first.dtype, device=first.device)
            )
            offset, placed = 0, []
            for t, a, b in segs:
                placed.append((t, a, b, offset))
                self._places[t].append((p, a, b, offset))
                offset += b - a
            for k, t in enumerate(flagged):
                self._flag[t] = (p, length + k)
            self._segments.append(placed)
            self._flagged.append((length, flagged))
        self._whole: list[torch.Tensor | None] = []
        for t, param in enumerate(params):
            places = self._places[t]
            whole = len(places) == 1 and places[0][2] - places[0][1] == param.numel()
            p, _, _, off = places[0] if places else (0, 0, 0, 0)
            view = self.buffers[p][off : off + param.numel()].view(param.shape) if whole else None
            self._whole.append(view)

    def fill(self, t: int, grad: torch.Tensor | None) -> None:
        """Copy tensor ``t``'s gradient (``None``: unused on this rank) into its partitions."""
        flat = grad.reshape(-1) if grad is not None else None
        for p, a, b, off in self._places[t]:
            dst = self.buffers[p][off : off + b - a]
            if flat is None:
                dst.zero_()
            else:
                dst.copy_(flat[a:b])
        p, k = self._flag[t]
        self.buffers[p][k] = 0.0 if grad is None else 1.0

    def complete(self, p: int, world: int) -> None:
        """After partition ``p``'s sum all-reduce: average it and hand its slices to the
        gradients; record the used flags it carries."""
        buf = self.buffers[p]
        buf.div_(world)
        length, flagged = self._flagged[p]
        if flagged:
            for t, flag in zip(flagged, buf[length:].tolist(), strict=True):
                self.used[t] = flag > 0
        for t, a, b, off in self._segments[p]:
            param, whole = self.params[t], self._whole[t]
            if whole is not None:
                param.grad = whole
                continue
            if param.grad is None:  # unused here: no local gradient to copy the slices into
                param.grad = torch.empty_like(param)
            param.grad.view(-1)[a:b].copy_(buf[off : off + b - a])


class Buckets:
    """Bucketed all-reduce issued from the gradient hooks, DDP's way: each bucket's
    asynchronous all-reduce starts as soon as all its tensors were posted, in ``order``
    (identical on every rank), on the posting thread; ``finish`` waits for all of them.
    No thread of its own and no Python work per bucket beyond one call to start it."""

    def __init__(
        self,
        packing: Packing,
        order: np.ndarray,
        group: Any,
        world: int,
    ) -> None:
        self.packing = packing
        self.queue = GradientQueue(packing.layout, order, _UNLIMITED)
        self.issued: list[int] = []  # this step's buckets in the order they were started
        self.last_issued: list[int] = []  # the last finished step's
        self._group, self._world = group, world
        self._works: list[tuple[int, Any]] = []

    def post(self, t: int, grad: torch.Tensor | None) -> None:
        """Tensor ``t``'s gradient is final (``None``: unused on this rank)."""
        self.packing.fill(t, grad)
        self.queue.mark_ready(t)
        while (p := self.queue.next_dispatch()) is not None:
            work = dist.all_reduce(self.packing.buffers[p], group=self._group, async_op=True)
            self._works.append((p, work))
            self.issued.append(p)

    def finish(self) -> None:
        """Wait for every bucket (all must have been posted), average and deliver them, and
        get ready for the next step."""
        for p, work in self._works:
            work.wait()
            self.queue.complete(p)
            self.packing.complete(p, self._world)
        self._works = []
        self.queue.reset()
        self.last_issued, self.issued = self.issued, []
