"""Small numba kernels shared by the balancing, pool, grouping and packing modules.

Three tools, each deterministic and the same on every machine:

* sorting: ``radix_argsort_into`` (a stable LSD radix argsort of unsigned keys),
  ``descending_keys`` (32-bit keys that sort non-negative floats largest first) and
  ``argsort_descending`` (both together);
* winner trees: ``winner_tree``, ``tree_set`` and ``smallest_leaves``, a binary tree whose
  root is the first smallest of its leaves, updated in ``O(log n)``;
* ``lpt``: capacity-bounded LPT (longest processing time first) over such a tree.

Every kernel is compiled by numba on first use (and cached on disk); each takes and fills
numpy arrays of the dtypes its docstring names. Pure-numpy references of every kernel live
in ``tests/helpers/reference.py`` and ``tests/core/test_kernels.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "argsort_descending",
    "descending_keys",
    "lpt",
    "radix_argsort_into",
    "smallest_leaves",
    "tree_set",
    "winner_tree",
]


@njit(cache=True)
def radix_argsort_into(
    keys: np.ndarray, spare_keys: np.ndarray, order: np.ndarray, spare_order: np.ndarray
) -> np.ndarray:
    """Stable ascending argsort of unsigned integer ``keys`` (32 or 64 bits) by LSD radix, in
    linear time and the same on every machine. Bytes where all keys agree are skipped.

    Args:
        keys: ``uint32`` or ``uint64`` keys; overwritten.
        spare_keys: a buffer of ``keys``' dtype and length; overwritten.
        order: an integer buffer as long as ``keys``; overwritten.
        spare_order: a buffer like ``order``; overwritten.

    Returns:
        ``order`` or ``spare_order``, holding the positions of ``keys`` in ascending key
        order, equal keys in position order (``numpy.argsort(keys, kind="stable")``).

    Example::

        >>> keys = np.array([3, 1, 2, 1], np.uint32)
        >>> n = keys.shape[0]
        >>> radix_argsort_into(keys, np.empty(n, np.uint32), np.empty(n, np.int64),
        ...                    np.empty(n, np.int64))
        array([1, 3, 2, 0])
    """
    n = keys.shape[0]
    width = keys.itemsize
    counts = np.zeros((width, 257), np.int64)
    for i in range(n):
        key = np.uint64(keys[i])
        order[i] = i
        for d in range(width):
            counts[d, ((key >> np.uint64(8 * d)) & np.uint64(0xFF)) + 1] += 1
    for d in range(width):
        digits = counts[d]
        if digits[1:].max() == n:  # one digit for every key: this pass keeps the order
            continue
        for b in range(256):
            digits[b + 1] += digits[b]
        shift = np.uint64(8 * d)
        for i in range(n):
            key = keys[i]
            digit = (np.uint64(key) >> shift) & np.uint64(0xFF)
            slot = digits[digit]
            digits[digit] = slot + 1
            spare_keys[slot] = key
            spare_order[slot] = order[i]
        keys, spare_keys = spare_keys, keys
        order, spare_order = spare_order, order
    return order


@njit(cache=True)
def descending_keys(values: np.ndarray, keys: np.ndarray) -> None:
    """Write a 32-bit key per value that sorts the values descending.

    Non-negative float64 values order like their bit patterns; the top 32 bits keep a
    relative resolution of 2**-20, and the complement turns ascending into descending.

    Args:
        values: ``float64`` values, all ``>= 0`` (no NaN, no ``-0.0``).
        keys: a ``uint32`` buffer as long as ``values``; ``keys[i]`` becomes the key of
            ``values[i]``.

    Example::

        >>> keys = np.empty(3, np.uint32)
        >>> descending_keys(np.array([1.0, 4.0, 2.0]), keys)
        >>> np.argsort(keys, kind="stable")
        array([1, 2, 0])
    """
    bits = values.view(np.uint64)
    for i in range(values.shape[0]):
        keys[i] = np.uint32((~bits[i]) >> np.uint64(32))


@njit(cache=True, nogil=True)
def argsort_descending(values: np.ndarray) -> np.ndarray:
    """Positions of ``values`` from largest to smallest; near-equal values (within 2**-20
    relative) keep position order.

    Args:
        values: ``float64`` values, all ``>= 0``.

    Returns:
        ``int64`` positions, largest value first.

    Example::

        >>> argsort_descending(np.array([1.0, 4.0, 2.0]))
        array([1, 2, 0])
    """
    n = values.shape[0]
    keys = np.empty(n, np.uint32)
    descending_keys(values, keys)
    return radix_argsort_into(
        keys, np.empty(n, np.uint32), np.empty(n, np.int64), np.empty(n, np.int64)
    )


@njit(cache=True)
def winner_tree(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A winner tree over ``keys``, leaves padded to a power of two with ``inf``.

    Node ``v`` holds the smallest key of its subtree and its position, ties to the lower
    position (the left subtree), so the root (node 1) is the first minimum. Leaf ``i`` is
    node ``size + i``.

    Args:
        keys: ``float64`` leaf keys (``inf`` marks a leaf out of play).

    Returns:
        ``(value, where)``: every node's smallest key and its leaf position.

    Example::

        >>> value, where = winner_tree(np.array([3.0, 1.0, 1.0]))
        >>> float(value[1]), int(where[1])
        (1.0, 1)
    """
    size = 1
    while size < keys.shape[0]:
        size *= 2
    value = np.full(2 * size, np.inf)
    where = np.zeros(2 * size, np.int64)
    for i in range(size):
        where[size + i] = i
    value[size : size + keys.shape[0]] = keys
    for v in range(size - 1, 0, -1):
        right = value[2 * v + 1] < value[2 * v]
        value[v] = value[2 * v + 1] if right else value[2 * v]
        where[v] = where[2 * v + 1] if right else where[2 * v]
    return value, where


@njit(cache=True)
def tree_set(value: np.ndarray, where: np.ndarray, i: int, key: float) -> None:
    """Set leaf ``i`` of a winner tree to ``key`` and replay its path to the root.

    Args:
        value: the tree's node keys (from ``winner_tree``); updated in place.
        where: the tree's node positions (from ``winner_tree``); updated in place.
        i: the leaf's position.
        key: its new key (``inf`` takes it out of play).

    Example::

        >>> value, where = winner_tree(np.array([3.0, 1.0]))
        >>> tree_set(value, where, 1, np.inf)
        >>> int(where[1])
        0
    """
    v = value.shape[0] // 2 + i
    value[v] = key
    best, at = key, i
    while v > 1:
        # Only the sibling is read, so the path's winner stays in registers. A left sibling
        # (lower positions) wins ties; a right one must be strictly smaller.
        other = value[v ^ 1]
        if other < best or (other == best and v & 1):
            best, at = other, where[v ^ 1]
        v >>= 1
        value[v] = best
        where[v] = at


@njit(cache=True)
def smallest_leaves(
    value: np.ndarray,
    where: np.ndarray,
    exclude: int,
    picked: np.ndarray,
    taken: np.ndarray,
    keys: np.ndarray,
) -> np.ndarray:
    """Up to ``len(picked)`` finite leaves of a winner tree other than ``exclude``, smallest
    first (ties: lower position): taken from the root one by one, then put back, so the tree
    ends as it began.

    Args:
        value: the tree's node keys (from ``winner_tree``).
        where: the tree's node positions (from ``winner_tree``).
        exclude: a leaf never picked (``-1``: none).
        picked: an ``int64`` buffer; its length is the most leaves returned.
        taken: an ``int64`` buffer one longer than ``picked`` (scratch).
        keys: a ``float64`` buffer one longer than ``picked`` (scratch).

    Returns:
        The filled front of ``picked``.

    Example::

        >>> value, where = winner_tree(np.array([3.0, 1.0, 2.0]))
        >>> smallest_leaves(value, where, 1, np.empty(2, np.int64), np.empty(3, np.int64),
        ...                 np.empty(3))
        array([2, 0])
    """
    filled = removed = 0
    while filled < picked.shape[0] and value[1] < np.inf:
        i = where[1]
        taken[removed] = i
        keys[removed] = value[1]
        removed += 1
        tree_set(value, where, i, np.inf)
        if i != exclude:
            picked[filled] = i
            filled += 1
    for t in range(removed):
        tree_set(value, where, taken[t], keys[t])
    return picked[:filled]


@njit(cache=True)
def lpt(
    sorted_costs: np.ndarray,
    order: np.ndarray,
    members: np.ndarray,
    caps: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    loads: np.ndarray,
) -> None:
    """Capacity-bounded LPT: each item, in descending cost order, to the bin whose predicted
    time ``alpha + beta·load`` is lowest among those with room (ties: lower bin). A winner
    tree holds the times, a full bin's as ``inf``.

    Args:
        sorted_costs: ``float64`` costs in ``order``'s order (read in sequence).
        order: the items' positions by descending cost.
        members: ``(bins, >= max(caps))`` integer buffer; ``members[r, :caps[r]]`` becomes
            bin ``r``'s items in the order it received them.
        caps: ``int64`` items per bin; they must add up to ``len(order)``.
        alpha: ``float64`` fixed time per bin.
        beta: ``float64`` time per unit of load per bin (``> 0``).
        loads: ``float64`` buffer, one per bin; becomes every bin's total cost.

    Example::

        >>> members, loads = np.empty((2, 2), np.int64), np.empty(2)
        >>> lpt(np.array([4.0, 3.0, 2.0, 1.0]), np.arange(4), members,
        ...     np.array([2, 2]), np.zeros(2), np.ones(2), loads)
        >>> members.tolist(), loads.tolist()
        ([[0, 3], [1, 2]], [5.0, 5.0])
    """
    num_ranks = members.shape[0]
    counts = np.zeros(num_ranks, np.int64)
    loads[:] = 0.0
    value, where = winner_tree(np.where(caps > 0, alpha, np.inf))
    for t in range(order.shape[0]):
        i = order[t]
        r = where[1]
        members[r, counts[r]] = i
        counts[r] += 1
        loads[r] += sorted_costs[t]
        time = alpha[r] + beta[r] * loads[r] if counts[r] < caps[r] else np.inf
        tree_set(value, where, r, time)
