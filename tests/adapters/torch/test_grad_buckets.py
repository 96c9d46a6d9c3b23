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
