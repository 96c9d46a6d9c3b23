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

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chronica.core.priority import Layout
from chronica.runtime import gradients

__all__ = ["Buckets", "Packing"]


class Packing:
    """Preallocated buffers of ``layout``'s partitions for ``params`` (in layout order).

    Guarantees: after ``fill`` of every tensor, one sum all-reduce of every buffer over
    ``world`` ranks and ``complete`` of every partition, each tensor's ``.grad`` holds the
    average over ranks, bitwise equal to the sum divided by ``world``, and ``used[t]`` says
    whether any rank used tensor ``t``. With a power-of-two ``world`` the division happens
    while filling (one pass over the gradient instead of two, as DDP does): scaling by a
    power of two is exact, so the sum of the scaled gradients is the scaled sum, bit for bit.

    Args:
        layout: the partitions (tensors in priority order).
        params: the parameters, in layout order.
        world: number of ranks averaged over.

    Example::

        >>> packing = Packing(layout, ordered_params, world=2)   # doctest: +SKIP
        >>> packing.fill(0, param.grad); packing.buffers[0]       # doctest: +SKIP
    """

    def __init__(self, layout: Layout, params: list[torch.Tensor], world: int) -> None:
        self.layout = layout
        self.params = params
        self._world = world
        self._prescale = 1.0 / world if world & (world - 1) == 0 else None
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
        # Destinations of each tensor's segments: (buffer slice, start, stop, whole tensor).
        self._dst = [
            [
                (self.buffers[p][o : o + b - a], a, b, b - a == params[t].numel())
                for p, a, b, o in places
            ]
            for t, places in enumerate(self._places)
        ]
        # Flags are set through numpy views where the buffers live in host memory (cheap).
        cpu = all(buf.device.type == "cpu" for buf in self.buffers)
        self._flags: list[Any] = [buf.numpy() if cpu else buf for buf in self.buffers]
        self._whole: list[torch.Tensor | None] = []
        # In host memory, the gradients autograd produced, replaced by buffer views in
        # complete(), live until the next backward fills again (as DDP's live until
        # zero_grad): freed amid step(), glibc gave the heap's top back to the kernel and the
        # next forward faulted it in again, 0.5-4 ms per step on the benchmarks' conv net
        # (docs/gradients.md). A device's caching allocator has no such cost.
        self._keep_stale = cpu
        self._stale: list[torch.Tensor] = []
        for t, param in enumerate(params):
            places = self._places[t]
            whole = len(places) == 1 and places[0][2] - places[0][1] == param.numel()
            p, _, _, off = places[0] if places else (0, 0, 0, 0)
            view = self.buffers[p][off : off + param.numel()].view(param.shape) if whole else None
            self._whole.append(view)

    def fill(self, t: int, grad: torch.Tensor | None) -> None:
        """Copy tensor ``t``'s gradient (``None``: unused on this rank) into its partitions.

        Args:
            t: the tensor's index in the layout.
            grad: its gradient, or ``None`` when this rank did not use it.

        Example::

            >>> packing.fill(0, None)   # doctest: +SKIP
        """
        self._stale.clear()
        if grad is None:
            for dst, _, _, _ in self._dst[t]:
                dst.zero_()
        else:
            flat = grad.reshape(-1)
            for dst, a, b, whole in self._dst[t]:
                src = flat if whole else flat[a:b]
                if self._prescale is None:
                    dst.copy_(src)
                else:
                    torch.mul(src, self._prescale, out=dst)
        p, k = self._flag[t]
        self._flags[p][k] = 0.0 if grad is None else 1.0

    def complete(self, p: int) -> None:
        """After partition ``p``'s sum all-reduce: average it (unless ``fill`` did) and hand
        its slices to the gradients; record the used flags it carries.

        Args:
            p: the partition's index.

        Example::

            >>> packing.complete(0)   # doctest: +SKIP
        """
        buf = self.buffers[p]
        if self._prescale is None:
            buf.div_(self._world)
        length, flagged = self._flagged[p]
        if flagged:
            flags = self._flags[p][length:]
            if isinstance(flags, torch.Tensor):  # in device memory: one copy to the host
                flags = flags.cpu().numpy()
            self.used[flagged] = flags > 0
        for t, a, b, off in self._segments[p]:
            param, whole = self.params[t], self._whole[t]
            if whole is not None:
                if param.grad is not None and self._keep_stale:
                    self._stale.append(param.grad)
                param.grad = whole
                continue
            if param.grad is None:  # unused here: no local gradient to copy the slices into
                param.grad = torch.empty_like(param)
            param.grad.view(-1)[a:b].copy_(buf[off : off + b - a])


class Buckets:
    """Bucketed all-reduce issued from the gradient hooks, DDP's way: each bucket's
    asynchronous all-reduce starts as soon as all its tensors were posted and every bucket
    before it in ``order`` (identical on every rank) was started, on the posting thread;
    ``finish`` waits for all of them. No thread of its own; the book-keeping is a counter per
    bucket in plain Python lists (a hook's cost is the training thread's).

    Args:
        packing: the buckets' buffers (a ``bucket_layout``, whole tensors).
        order: the buckets' start order, identical on every rank.
        group: the process group of the all-reduces.

    Example::

        >>> buckets = Buckets(Packing(layout, params, 2), order, dist.group.WORLD)  # doctest: +SKIP
        >>> buckets.post(0, grad); buckets.finish()                                 # doctest: +SKIP
    """

    def __init__(self, packing: Packing, order: np.ndarray, group: Any) -> None:
        layout = packing.layout
        if layout.num_partitions and int(layout.parts_per_tensor().max()) > 1:
            raise ValueError("buckets hold whole tensors: use bucket_layout for the layout")
        self.packing = packing
        self.order = [int(p) for p in order]
        self.issued: list[int] = []  # this step's buckets in the order they were started
        self.last_issued: list[int] = []  # the last finished step's
        self.started = 0.0  # perf_counter() when this step's first bucket was started
        self.last_started = 0.0  # ... and its last one
        self.last_bytes = 0  # the last bucket's bytes
        self._group = group
        self._bucket_of = [0] * layout.num_tensors
        for k, t in enumerate(layout.seg_tensor.tolist()):
            self._bucket_of[t] = int(np.searchsorted(layout.part_ptr, k, side="right")) - 1
        self._tensors = np.diff(layout.part_ptr).tolist()
        self._missing = list(self._tensors)
        self._posted = [False] * layout.num_tensors
        self._works: list[tuple[int, Any]] = []

    def post(self, t: int, grad: torch.Tensor | None) -> None:
        """Tensor ``t``'s gradient is final (``None``: unused on this rank).

        Args:
            t: the tensor's index in the layout.
            grad: its gradient, or ``None`` when this rank did not use it.

        Example::

            >>> buckets.post(0, param.grad)   # doctest: +SKIP
        """
        if self._posted[t]:
            raise RuntimeError(
                f"tensor {t}'s gradient was final twice in one step: accumulating gradients "
                "over several backward passes before one step() is not supported"
            )
        self._posted[t] = True
        self.packing.fill(t, grad)
        self._missing[self._bucket_of[t]] -= 1
        order, issued = self.order, self.issued
        while len(issued) < len(order) and not self._missing[order[len(issued)]]:
            p = order[len(issued)]
            self.last_started = time.perf_counter()
            self.last_bytes = int(self.packing.layout.part_bytes[p])
            if not issued:
                self.started = self.last_started
            work = dist.all_reduce(self.packing.buffers[p], group=self._group, async_op=True)
            self._works.append((p, work))
            issued.append(p)

    def link_busy(self, reduced: float) -> float:
        """Seconds the link needed for this step's buckets, all reduced at ``reduced``: the
        last bucket's bytes went from its start to ``reduced``, all the bytes at that rate;
        no more than the time since the first bucket started.

        Args:
            reduced: ``time.perf_counter()`` once ``finish`` returned.

        Example::

            >>> buckets.link_busy(time.perf_counter())   # doctest: +SKIP
            0.036
        """
        total = int(self.packing.layout.part_bytes.sum())
        return gradients.link_busy(self.started, self.last_started, reduced, self.last_bytes, total)

    def finish(self) -> None:
        """Wait for every bucket (all must have been posted), average and deliver them, and
        get ready for the next step."""
        for p, work in self._works:
            work.wait()
            self.packing.complete(p)
        self._works = []
        self._missing = list(self._tensors)
        self._posted = [False] * len(self._posted)
        self.last_issued, self.issued = self.issued, []
