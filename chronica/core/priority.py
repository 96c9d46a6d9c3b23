"""Gradient task queue: priorities, partitions, fusion, credit and a rank-identical order.

Pure decisions for gradient-priority communication scheduling (ByteScheduler): no threads,
no clocks, no framework. The dispatcher in ``chronica.runtime.dispatcher`` drives it.

- **Priority** is a tensor's position in the order of first use in the forward pass
  (position 0 is needed first). Tensors are laid out in that order.
- **Partitions** (tasks): a tensor larger than ``partition_bytes`` is cut into nearly equal
  slices, each a task of its own; runs of adjacent smaller tensors of one dtype are fused
  into one task of at most ``partition_bytes``. A partition's priority is its index.
- **Credit**: a partition may be dispatched only while the bytes in flight are below
  ``credit_bytes``, so in-flight bytes never exceed ``credit_bytes`` plus one partition.
- **Dispatch order.** Collectives must be issued in the same order on every rank, but
  gradients become ready at different moments on different ranks. So the order is not
  decided from local timing: it is a fixed sequence, identical on every rank, and the
  dispatcher issues its entries strictly one after the other, each once it is ready locally
  and credit allows. The sequence is a pure function of agreed inputs:
  ``"fifo"`` is the readiness order (backward order) and ``"priority"`` is the order in which
  a preemptive priority scheduler (highest-priority ready partition first, credit-limited)
  dispatches on a simulated run driven by agreed per-tensor ready times and link bandwidth
  (see ``simulate_order``). Preemption is non-destructive: a partition that is already in
  flight is never recalled; a higher-priority partition only overtakes those still queued.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int

__all__ = [
    "GradientQueue",
    "Layout",
    "bucket_layout",
    "build_layout",
    "fifo_order",
    "partition_ready_times",
    "simulate_order",
]


@dataclass(frozen=True)
class Layout:
    """Partitions of a list of tensors given in priority order.

    Partition ``p`` is the segments ``seg_tensor[k], [seg_start[k], seg_stop[k])`` (element
    ranges of flattened tensors) for ``k`` in ``range(part_ptr[p], part_ptr[p + 1])``.
    Guarantees: every element of every tensor lies in exactly one segment; segments of a
    partition are in priority order; a partition is either one slice of one tensor or whole
    tensors of one dtype; partition ``p`` holds no element of a tensor of lower priority than
    any element of partition ``p + 1``.

    Example::

        >>> layout = build_layout(np.array([4, 2]), np.array([4, 4]), 8)
        >>> layout.num_partitions, layout.segments(0)
        (3, [(0, 0, 2)])
    """

    numel: np.ndarray
    itemsize: np.ndarray
    seg_tensor: np.ndarray
    seg_start: np.ndarray
    seg_stop: np.ndarray
    part_ptr: np.ndarray
    part_bytes: np.ndarray
    partition_bytes: int

    @property
    def num_tensors(self) -> int:
        return int(self.numel.shape[0])

    @property
    def num_partitions(self) -> int:
        return int(self.part_bytes.shape[0])

    def parts_per_tensor(self) -> np.ndarray:
        """How many partitions hold a piece of each tensor (in layout order)."""
        return np.bincount(self.seg_tensor, minlength=self.num_tensors).astype(np.int64)

    def label(self, partition: int, names: Sequence[str]) -> str:
        """A readable name for ``partition``: its tensors' ``names`` (given in layout order)
        joined by ``+``; a slice of a larger tensor adds ``[start:stop]``.

        Args:
            partition: the partition's index.
            names: one name per tensor, in layout order.

        Example::

            >>> build_layout(np.array([4]), np.array([4]), 8).label(1, ["w"])
            'w[2:4]'
        """
        segs = self.segments(partition)
        label = "+".join(names[t] for t, _, _ in segs)
        if len(segs) == 1 and segs[0][2] - segs[0][1] < self.numel[segs[0][0]]:
            label += f"[{segs[0][1]}:{segs[0][2]}]"
        return label

    def segments(self, partition: int) -> list[tuple[int, int, int]]:
        """``(tensor, start, stop)`` element ranges of ``partition``, in priority order.

        Args:
            partition: the partition's index.

        Example::

            >>> build_layout(np.array([4]), np.array([4]), 8).segments(1)
            [(0, 2, 4)]
        """
        lo, hi = int(self.part_ptr[partition]), int(self.part_ptr[partition + 1])
        return [
            (int(self.seg_tensor[k]), int(self.seg_start[k]), int(self.seg_stop[k]))
            for k in range(lo, hi)
        ]


def build_layout(
    numel: np.ndarray,
    itemsize: np.ndarray,
    partition_bytes: int,
    dtype_keys: np.ndarray | None = None,
) -> Layout:
    """Cut and fuse tensors (given in priority order) into partitions of ``partition_bytes``.

    ``dtype_keys`` (one int per tensor) keeps tensors of different dtypes out of one fused
    partition; by default ``itemsize`` stands in for the dtype.

    Args:
        numel: elements per tensor, in priority order.
        itemsize: bytes per element of each tensor.
        partition_bytes: the partition size (positive).
        dtype_keys: one int per tensor naming its dtype (default: ``itemsize``).

    Example::

        >>> build_layout(np.array([4, 1, 1]), np.array([4, 4, 4]), 8).num_partitions
        3
    """
    numel, itemsize, keys = _checked(numel, itemsize, dtype_keys)
    check_int("partition_bytes", partition_bytes, 1)
    segs: list[tuple[int, int, int]] = []
    ptr = [0]
    group_bytes = 0
    group_key = -1

    def close() -> None:
        nonlocal group_bytes
        if len(segs) > ptr[-1]:
            ptr.append(len(segs))
        group_bytes = 0

    for t in range(numel.shape[0]):
        n, size, key = int(numel[t]), int(itemsize[t]), int(keys[t])
        nbytes = n * size
        if nbytes > partition_bytes:
            close()
            pieces = min(n, -(-nbytes // partition_bytes))
            edges = (np.arange(pieces + 1, dtype=np.int64) * n // pieces).tolist()
            for a, b in itertools.pairwise(edges):
                segs.append((t, a, b))
                close()
            continue
        if group_bytes + nbytes > partition_bytes or key != group_key:
            close()
        segs.append((t, 0, n))
        group_bytes += nbytes
        group_key = key
    close()
    return _assemble(numel, itemsize, segs, ptr, partition_bytes)


def _checked(numel, itemsize, dtype_keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    numel = np.asarray(numel, dtype=np.int64)
    itemsize = np.asarray(itemsize, dtype=np.int64)
    keys = itemsize if dtype_keys is None else np.asarray(dtype_keys, dtype=np.int64)
    if numel.ndim != 1 or itemsize.shape != numel.shape or keys.shape != numel.shape:
        raise ValueError("numel, itemsize and dtype_keys must be 1-D arrays of one length")
    if (numel < 0).any() or (itemsize <= 0).any():
        raise ValueError("numel must be >= 0 and itemsize > 0 for every tensor")
    return numel, itemsize, keys


def _assemble(
    numel: np.ndarray,
    itemsize: np.ndarray,
    segs: list[tuple[int, int, int]],
    ptr: list[int],
    partition_bytes: int,
) -> Layout:
    arr = np.asarray(segs, dtype=np.int64).reshape(-1, 3)
    part_ptr = np.asarray(ptr, dtype=np.int64)
    seg_bytes = (arr[:, 2] - arr[:, 1]) * itemsize[arr[:, 0]] if len(arr) else np.zeros(0, np.int64)
    part_bytes = np.add.reduceat(seg_bytes, part_ptr[:-1]) if len(arr) else np.zeros(0, np.int64)
    return Layout(
        numel=numel,
        itemsize=itemsize,
        seg_tensor=arr[:, 0].copy(),
        seg_start=arr[:, 1].copy(),
        seg_stop=arr[:, 2].copy(),
        part_ptr=part_ptr,
        part_bytes=part_bytes.astype(np.int64),
        partition_bytes=int(partition_bytes),
    )


def bucket_layout(
    numel: np.ndarray,
    itemsize: np.ndarray,
    bucket_bytes: int,
    first_bucket_bytes: int,
    dtype_keys: np.ndarray | None = None,
) -> Layout:
    """Whole tensors (given in priority order) fused into buckets from the *last* tensor back.

    DDP's bucketing (``compute_bucket_assignment_by_size``): the bucket holding the last
    tensors (ready first in the backward pass) takes tensors until it holds at least
    ``first_bucket_bytes``, every other one until ``bucket_bytes``, the tensor that reaches the
    cap included; tensors are never cut; tensors of different ``dtype_keys`` never share a
    bucket. The result is a ``Layout`` like ``build_layout``'s (partitions in priority order),
    whose partitions are never slices.

    Args:
        numel: elements per tensor, in priority order.
        itemsize: bytes per element of each tensor.
        bucket_bytes: the cap of every bucket but the one holding the last tensors.
        first_bucket_bytes: the cap of the bucket holding the last tensors.
        dtype_keys: one int per tensor naming its dtype (default: ``itemsize``).

    Example::

        >>> bucket_layout(np.array([4, 4, 4]), np.array([4, 4, 4]), 32, 16).num_partitions
        2
    """
    numel, itemsize, keys = _checked(numel, itemsize, dtype_keys)
    check_int("bucket_bytes", bucket_bytes, 1)
    check_int("first_bucket_bytes", first_bucket_bytes, 1)
    groups: list[list[int]] = []  # from the last tensor back
    filled, key, full = 0, -1, True
    for t in range(numel.shape[0] - 1, -1, -1):
        if full or int(keys[t]) != key:
            groups.append([])
            filled = 0
        groups[-1].append(t)
        filled += int(numel[t] * itemsize[t])
        key = int(keys[t])
        full = filled >= (first_bucket_bytes if len(groups) == 1 else bucket_bytes)
    segs = [(t, 0, int(numel[t])) for group in reversed(groups) for t in reversed(group)]
    sizes = [len(group) for group in reversed(groups)]
    ptr = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    return _assemble(numel, itemsize, segs, ptr, bucket_bytes)


def partition_ready_times(layout: Layout, tensor_ready: np.ndarray) -> np.ndarray:
    """When each partition is ready: the latest ready time of the tensors it holds.

    Args:
        layout: the partitions.
        tensor_ready: when each tensor (layout order) is ready, in seconds.

    Example::

        >>> partition_ready_times(build_layout(np.array([1, 1]), np.array([4, 4]), 8), [2.0, 1.0])
        array([2.])
    """
    ready = np.asarray(tensor_ready, dtype=np.float64)[layout.seg_tensor]
    return np.maximum.reduceat(ready, layout.part_ptr[:-1]) if len(ready) else ready


def fifo_order(layout: Layout, tensor_ready: np.ndarray) -> np.ndarray:
    """Partitions in the order they become ready (ties: higher priority first).

    Args:
        layout: the partitions.
        tensor_ready: when each tensor (layout order) is ready, in seconds.

    Example::

        >>> fifo_order(build_layout(np.array([1, 1]), np.array([4, 4]), 4), [2.0, 1.0])
        array([1, 0])
    """
    ready = partition_ready_times(layout, tensor_ready)
    return np.lexsort((np.arange(len(ready)), ready)).astype(np.int64)


def simulate_order(
    layout: Layout,
    tensor_ready: np.ndarray,
    credit_bytes: int,
    bytes_per_second: float,
    latency: float = 0.0,
) -> np.ndarray:
    """The order in which credit-limited preemptive priority scheduling dispatches.

    Simulates one backward pass: partition ``p`` becomes ready at the latest
    ``tensor_ready`` time of its tensors (seconds); whenever bytes in flight are below
    ``credit_bytes`` the ready partition of highest priority (lowest index) is dispatched; the
    link carries partitions one after another at ``bytes_per_second``, each taking
    ``latency`` more seconds. Deterministic: equal inputs give the same order on every rank.

    Args:
        layout: the partitions.
        tensor_ready: when each tensor (layout order) is ready, in seconds.
        credit_bytes: bytes in flight at most before the next dispatch waits.
        bytes_per_second: the link's rate.
        latency: seconds each partition takes on top of its bytes.

    Example::

        >>> layout = build_layout(np.array([1, 1]), np.array([4, 4]), 4)
        >>> simulate_order(layout, [1.0, 0.0], credit_bytes=4, bytes_per_second=1.0)
        array([1, 0])
    """
    if credit_bytes <= 0 or not bytes_per_second > 0 or latency < 0:
        raise ValueError("credit_bytes and bytes_per_second must be > 0 and latency >= 0")
    ready = partition_ready_times(layout, tensor_ready)
    arrivals = deque(np.lexsort((np.arange(len(ready)), ready)).tolist())
    queued: list[int] = []
    flight: deque[tuple[float, int]] = deque()  # (completion time, bytes); completes in order
    in_flight = 0
    link_free = now = 0.0
    order: list[int] = []
    while arrivals or queued:
        while arrivals and ready[arrivals[0]] <= now:
            heapq.heappush(queued, arrivals.popleft())
        while queued and in_flight < credit_bytes:
            p = heapq.heappop(queued)
            nbytes = int(layout.part_bytes[p])
            link_free = max(now, link_free) + nbytes / bytes_per_second
            flight.append((link_free + latency, nbytes))
            in_flight += nbytes
            order.append(p)
        events = [ready[arrivals[0]]] if arrivals else []
        if flight:
            events.append(flight[0][0])
        if not events:
            break
        now = max(now, min(events))
        while flight and flight[0][0] <= now:
            in_flight -= flight.popleft()[1]
    return np.asarray(order, dtype=np.int64)


class GradientQueue:
    """Readiness and credit book-keeping for one step at a time, for a fixed dispatch order.

    Guarantees: ``next_dispatch`` returns the entries of ``order`` exactly once each, in that
    order, each only after every tensor it holds was marked ready and only while bytes in
    flight are below ``credit_bytes`` (so they never exceed ``credit_bytes`` plus the largest
    partition); ``complete`` returns credit. Not thread-safe: the caller holds a lock.

    Args:
        layout: the partitions.
        order: the dispatch order, a permutation of the partitions.
        credit_bytes: bytes in flight at most before the next dispatch waits (positive).

    Example::

        >>> queue = GradientQueue(build_layout(np.array([1]), np.array([4]), 4), [0], 4)
        >>> queue.mark_ready(0), queue.next_dispatch()
        ([0], 0)
    """

    def __init__(self, layout: Layout, order: np.ndarray, credit_bytes: int) -> None:
        order = np.asarray(order, dtype=np.int64)
        if sorted(order.tolist()) != list(range(layout.num_partitions)):
            raise ValueError("order must be a permutation of the layout's partitions")
        if credit_bytes <= 0:
            raise ValueError(f"credit_bytes={credit_bytes!r} must be > 0")
        self.layout = layout
        self.order = order
        self.credit_bytes = int(credit_bytes)
        self._tensor_parts: list[list[int]] = [[] for _ in range(layout.num_tensors)]
        for p in range(layout.num_partitions):
            for t, _, _ in layout.segments(p):
                self._tensor_parts[t].append(p)
        self._need = np.diff(layout.part_ptr)
        self.in_flight = 0
        self.max_in_flight = 0
        self.reset()

    def reset(self) -> None:
        """Start a step: no tensor ready, nothing dispatched (in-flight bytes are kept)."""
        self._missing = self._need.copy()
        self._tensor_done = np.zeros(self.layout.num_tensors, dtype=bool)
        self._cursor = 0

    def mark_ready(self, tensor: int) -> list[int]:
        """Record that ``tensor``'s gradient is final; returns partitions that became ready."""
        if self._tensor_done[tensor]:
            raise RuntimeError(f"tensor {tensor} was marked ready twice in one step")
        self._tensor_done[tensor] = True
        became = []
        for p in self._tensor_parts[tensor]:
            self._missing[p] -= 1
            if self._missing[p] == 0:
                became.append(p)
        return became

    @property
    def done_dispatching(self) -> bool:
        """True once every partition of this step was handed out."""
        return self._cursor == len(self.order)

    def next_dispatch(self) -> int | None:
        """The next partition of the order if it is ready and credit allows, else ``None``."""
        if self._cursor == len(self.order) or self.in_flight >= self.credit_bytes:
            return None
        p = int(self.order[self._cursor])
        if self._missing[p]:
            return None
        self._cursor += 1
        self.in_flight += int(self.layout.part_bytes[p])
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return p

    def complete(self, partition: int) -> None:
        """Return ``partition``'s bytes to the credit."""
        self.in_flight -= int(self.layout.part_bytes[partition])
