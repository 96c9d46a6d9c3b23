"""The gradient task queue (chronica.core.priority) without any framework: layout,
reassembly, buckets, credit and the rank-identical order."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.priority import (
    GradientQueue,
    bucket_layout,
    build_layout,
    fifo_order,
    simulate_order,
)

tensors = st.lists(st.tuples(st.integers(0, 300), st.sampled_from([1, 2, 4, 8])), max_size=12)


def _layout(spec, part):
    numel = np.array([n for n, _ in spec], dtype=np.int64)
    itemsize = np.array([s for _, s in spec], dtype=np.int64)
    return build_layout(numel, itemsize, part)


@given(spec=tensors, part=st.integers(1, 600))
def test_partitions_reassemble_every_tensor_exactly(spec, part):
    layout = _layout(spec, part)
    rng = np.random.default_rng(0)
    originals = [rng.standard_normal(n) for n, _ in spec]
    # Pack each partition as a transport buffer would, then scatter it back.
    buffers = [
        np.concatenate([originals[t][a:b] for t, a, b in layout.segments(p)] or [np.zeros(0)])
        for p in range(layout.num_partitions)
    ]
    rebuilt = [np.full(n, np.nan) for n, _ in spec]
    for p, buf in enumerate(buffers):
        offset = 0
        for t, a, b in layout.segments(p):
            assert np.isnan(rebuilt[t][a:b]).all()  # no element in two partitions
            rebuilt[t][a:b] = buf[offset : offset + b - a]
            offset += b - a
    for got, want in zip(rebuilt, originals, strict=True):
        np.testing.assert_array_equal(got, want)
    for p in range(layout.num_partitions):
        segs = layout.segments(p)
        sizes = {spec[t][1] for t, _, _ in segs}
        assert len(sizes) == 1  # one dtype per partition
        if len(segs) > 1 or layout.part_bytes[p] <= part:
            assert layout.part_bytes[p] <= max(part, spec[segs[0][0]][1])
        assert [t for t, _, _ in segs] == sorted(t for t, _, _ in segs)


def test_cut_big_and_fuse_small():
    layout = build_layout(np.array([10, 10, 1000, 10]), np.array([4, 4, 4, 4]), 1024)
    assert [layout.segments(p) for p in range(layout.num_partitions)] == [
        [(0, 0, 10), (1, 0, 10)],
        [(2, 0, 250)],
        [(2, 250, 500)],
        [(2, 500, 750)],
        [(2, 750, 1000)],
        [(3, 0, 10)],
    ]
    with pytest.raises(ValueError, match="partition_bytes"):
        build_layout(np.array([1]), np.array([4]), 0)


def _drive(queue, ready_order, rng):
    """Mark tensors ready in ``ready_order``, completing in-flight work at random moments."""
    issued, flight, pending = [], [], list(ready_order)
    largest = int(queue.layout.part_bytes.max(initial=0))
    while pending or flight or not queue.done_dispatching:
        choice = rng.random()
        if pending and choice < 0.5:
            queue.mark_ready(pending.pop(0))
        elif flight and choice < 0.8:
            queue.complete(flight.pop(0))
        while (p := queue.next_dispatch()) is not None:
            issued.append(p)
            flight.append(p)
            assert queue.in_flight <= queue.credit_bytes + largest
        if not pending and not flight and not queue.done_dispatching:
            raise AssertionError("stuck")
    return issued


@given(spec=tensors, cap=st.integers(1, 900), first=st.integers(1, 900))
def test_buckets_hold_whole_tensors_fused_from_the_last_one(spec, cap, first):
    numel = np.array([n for n, _ in spec], dtype=np.int64)
    itemsize = np.array([s for _, s in spec], dtype=np.int64)
    layout = bucket_layout(numel, itemsize, cap, first)
    segs = [layout.segments(p) for p in range(layout.num_partitions)]
    assert [t for part in segs for t, _, _ in part] == list(range(len(spec)))  # in order, once
    assert all(a == 0 and b == numel[t] for part in segs for t, a, b in part)  # never cut
    for p, part in enumerate(segs):
        assert len({itemsize[t] for t, _, _ in part}) == 1
        limit = first if p == len(segs) - 1 else cap  # the last bucket is ready first
        # filled from the back, DDP's way: below the limit until its first tensor joined
        assert layout.part_bytes[p] - numel[part[0][0]] * itemsize[part[0][0]] < limit
        if p > 0 and itemsize[segs[p - 1][-1][0]] == itemsize[part[0][0]]:
            assert layout.part_bytes[p] >= limit  # closed because it reached its limit


@given(spec=tensors, part=st.integers(1, 600), credit=st.integers(1, 2000), seed=st.integers(0, 99))
def test_credit_bound_and_order_identical_whatever_the_timing(spec, part, credit, seed):
    layout = _layout(spec, part)
    ready = np.random.default_rng(seed).permutation(layout.num_tensors)
    order = fifo_order(layout, np.argsort(ready).astype(float))
    runs = []
    for rank in range(3):  # "ranks": different readiness orders and completion timing
        queue = GradientQueue(layout, order, credit)
        perm = np.random.default_rng(seed + rank).permutation(layout.num_tensors).tolist()
        runs.append(_drive(queue, perm, random.Random(rank)))
        assert queue.in_flight == 0
        assert queue.max_in_flight <= credit + int(layout.part_bytes.max(initial=0))
    assert runs[0] == runs[1] == runs[2] == order.tolist()


def _reference_order(ready, nbytes, credit):
    """Tick-by-tick ByteScheduler: completions, arrivals, then highest priority under credit."""
    order, queued, flight, link_free, t = [], [], [], 0, 0
    while len(order) < len(ready):
        flight = [(end, b) for end, b in flight if end > t]
        queued += [p for p in range(len(ready)) if ready[p] == t]
        while queued and sum(b for _, b in flight) < credit:
            p = min(queued)
            queued.remove(p)
            link_free = max(t, link_free) + nbytes[p]
            flight.append((link_free, nbytes[p]))
            order.append(p)
        t += 1
    return order


@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=10),
    data=st.data(),
    credit=st.integers(1, 60),
)
@settings(max_examples=60)
def test_simulated_priority_order_matches_tick_reference(sizes, data, credit):
    ready = data.draw(st.lists(st.integers(0, 40), min_size=len(sizes), max_size=len(sizes)))
    layout = build_layout(np.array(sizes), np.ones(len(sizes), np.int64), max(sizes))
    got = simulate_order(layout, np.array(ready, float), credit, bytes_per_second=1.0)
    want = _reference_order(
        [max(ready[t] for t, _, _ in layout.segments(p)) for p in range(layout.num_partitions)],
        layout.part_bytes.tolist(),
        credit,
    )
    assert got.tolist() == want


def test_simulated_order_limits():
    layout = build_layout(np.full(6, 100), np.full(6, 4), 400)
    backward = np.arange(6, 0, -1, dtype=float)  # last layer ready first
    # An infinitely fast link sends in readiness order; a slow one sends the first partition
    # to become ready, then strictly by priority.
    assert simulate_order(layout, backward, 400, 1e12).tolist() == [5, 4, 3, 2, 1, 0]
    assert simulate_order(layout, backward, 400, 1e-3).tolist() == [5, 0, 1, 2, 3, 4]
    assert fifo_order(layout, backward).tolist() == [5, 4, 3, 2, 1, 0]
