"""Checks shared by the gradient-scheduling tests of the three frameworks."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

__all__ = ["assert_tiled", "spans_by_tensor"]


def spans_by_tensor(parts: Sequence[Sequence[Sequence]]) -> dict[str, list[tuple[int, int]]]:
    """The ``(start, stop)`` element ranges each tensor has across partitions reported as
    lists of ``(name, start, stop)``, sorted."""
    covered: dict[str, list[tuple[int, int]]] = {}
    for part in parts:
        for name, a, b in part:
            covered.setdefault(name, []).append((a, b))
    return {name: sorted(spans) for name, spans in covered.items()}


def assert_tiled(covered: Mapping[str, list[tuple[int, int]]], sizes: Mapping[str, int]) -> None:
    """Every tensor named in ``covered`` is cut into contiguous ranges from 0 to its size."""
    for name, spans in covered.items():
        assert spans[0][0] == 0 and spans[-1][1] == sizes[name]
        assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))
