"""The bucketed engine's buckets are DDP's: ``bucket_layout`` against torch's own
``compute_bucket_assignment_by_size`` over the gradient-ready (reverse forward) order, the
assignment DDP's reducer rebuilds after its first iteration."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from chronica.core.priority import bucket_layout  # noqa: E402


def ddp_buckets(numel: list[int], first: int, cap: int) -> list[list[int]]:
    """DDP's buckets (forward-order tensor indices), the first one ready first."""
    ready = list(range(len(numel)))[::-1]
    tensors = [torch.empty(numel[t]) for t in ready]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        tensors, [first, cap], [False] * len(ready), ready
    )
    return [sorted(bucket) for bucket in buckets]


def our_buckets(numel: list[int], first: int, cap: int) -> list[list[int]]:
    layout = bucket_layout(np.asarray(numel), np.full(len(numel), 4), cap, first)
    parts = [[t for t, _, _ in layout.segments(p)] for p in range(layout.num_partitions)]
    return parts[::-1]


@given(
    numel=st.lists(st.integers(1, 3000), min_size=1, max_size=14),
    first=st.integers(1, 4000),
    cap=st.integers(1, 12000),
)
def test_bucket_layout_equals_ddp_assignment(numel, first, cap):
    assert our_buckets(numel, first, cap) == ddp_buckets(numel, first, cap)


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        # gradsched's vgg: the 4 MiB fc1 weight joins the last layers' first bucket
        (
            [864, 32, 9216, 32, 18432, 64, 1048576, 256, 65536, 256, 2560, 10],
            [[6, 7, 8, 9, 10, 11]],
        ),
        # mlp670k: the first bucket takes the 512x512 layer that reaches 1 MiB
        ([401408, 512, 262144, 512, 5120, 10], [[2, 3, 4, 5]]),
    ],
)
def test_benchmark_models_first_bucket(shapes, expected):
    assert our_buckets(shapes, 1 << 20, 25 << 20)[:1] == expected
    assert ddp_buckets(shapes, 1 << 20, 25 << 20)[:1] == expected


def test_autograd_gradients_live_until_the_next_fill():
    """On CPU the gradient a step replaced by its buffer view is freed when the next backward
    fills again, not inside step() (where glibc returned its pages and the next forward
    faulted them back in); the parameter sees the averaged view at once."""
    import gc
    import weakref

    from chronica.adapters.torch.grad_buffers import Packing

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    layout = bucket_layout(np.array([3, 2]), np.full(2, 4), 1 << 20, 1 << 20)
    packing = Packing(layout, params, world=1)
    grads = [torch.arange(3.0), torch.ones(2)]
    alive = [weakref.ref(g) for g in grads]
    for t, (param, grad) in enumerate(zip(params, grads, strict=True)):
        param.grad = grad
        packing.fill(t, grad)
    del grads, grad
    for p in range(layout.num_partitions):
        packing.complete(p)
    gc.collect()
    assert [param.grad.tolist() for param in params] == [[0.0, 1.0, 2.0], [1.0, 1.0]]
    assert all(ref() is not None for ref in alive)
    for param in params:
        param.grad = None
    packing.fill(0, torch.zeros(3))
    gc.collect()
    assert all(ref() is None for ref in alive)
