"""``pack_context_step``: one step packed for a data-parallel × context-parallel mesh.

With ``Packing(context_parallel=g)`` the step's ``W`` devices form ``W / g`` data-parallel
groups of ``g`` context-parallel ranks (torch's device mesh ``("dp", "cp")``: device ``r``
is CP rank ``r % g`` of group ``r // g``). A CP group runs micro-batch ``k`` together: a
*sharded* document is cut into ``2·g`` head-tail chunks (``context_layout``), so each CP
rank holds ``1/g`` of its tokens and, causal attention included, exactly ``1/g`` of its
cost; a *whole* document lives on one device.

Which documents are sharded (``shard_choice``): those whose cost exceeds half a device's
fair share of the step (``total cost / W``), and those longer than a row (up to ``g`` rows
long), single documents only (groups stay whole); if the slowest device then stays more than
5% above the mean, a quarter of the fair share is tried too and the better plan kept. The
sharded documents are placed first, costliest first, onto the groups (the same micro-batch
and row slot on every CP rank of the group); then the whole documents onto the devices from
that load, by the rank kernel's LPT and refinement
(``chronica.core.packing.context_kernels.place_loaded``). The micro-batch count follows
``pack_step``'s rules (fewest that fit, one more while it lowers the slowest device by 1%).

The result is a ``PackedStep`` over *pieces*: every whole unit is one piece, every sharded
document ``g`` pieces (one per CP rank of its group, ``1/g`` of its cost each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int
from chronica.core.kernels import argsort_descending
from chronica.core.packing.context_kernels import place_loaded
from chronica.core.packing.options import Packing
from chronica.core.packing.step import _MICRO_GAIN, PackedStep, _figure, _round_up

__all__ = ["ContextStep", "pack_context_step", "shard_choice"]

# A document costlier than this fraction of a device's fair share of the step is sharded;
# the next, smaller fraction is tried while the slowest device is more than _RETRY_ABOVE
# above the mean (the better plan is kept).
SHARD_SHARES = (0.5, 0.25)
_RETRY_ABOVE = 0.05


@dataclass(frozen=True)
class ContextStep:
    """One step packed over a DP × CP mesh (built by ``pack_context_step``).

    Args:
        step: the placement of the pieces over the devices (``rank`` is a device).
        unit: ``int64`` the unit every piece belongs to.
        pinned: ``bool`` per piece, whether it is a chunk of a sharded unit (such pieces
            must stay where they are: their group runs them together).
        sharded: ``bool`` per unit, whether it is sharded over its group.

    Example::

        >>> packing = Packing(max_tokens=8, context_parallel=2, pad_multiple=4)
        >>> out = pack_context_step(np.array([8, 4, 4, 4, 4]), np.ones(5) + [7, 0, 0, 0, 0], 4,
        ...                         packing)
        >>> out.sharded.tolist(), out.step.rank.tolist(), out.step.cells.sum(1).tolist()
        ([True, False, False, False, False], [2, 3, 2, 3, 0, 1], [4.0, 4.0, 2.0, 2.0])
    """

    step: PackedStep
    unit: np.ndarray
    pinned: np.ndarray
    sharded: np.ndarray


def shard_choice(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    devices: int,
    packing: Packing,
    share: float = SHARD_SHARES[0],
) -> np.ndarray:
    """Which units a step shards over their context-parallel group: single documents costlier
    than ``share`` of a device's fair share (``costs.sum() / devices``), and those
    longer than ``packing.row_length`` (which must be sharded). ``ValueError`` for a unit
    no group can hold (longer than ``g`` rows, or a group of documents longer than a row).

    Args:
        lengths: ``int64`` padded tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit.
        devices: ``W``, every device of the mesh.
        packing: the options (``context_parallel``, ``row_length``).
        share: the fraction of the fair share above which a document is sharded.

    Example::

        >>> shard_choice(np.array([8, 4, 4, 4]), np.array([8.0, 2.0, 2.0, 2.0]),
        ...              np.ones(4, np.int64), 2, Packing(max_tokens=8, context_parallel=2,
        ...              pad_multiple=4)).tolist()
        [True, False, False, False]
    """
    g, length = packing.context_parallel, packing.length
    long = lengths > length
    if np.any(long & ((docs > 1) | (lengths > g * length))):
        u = int(np.flatnonzero(long & ((docs > 1) | (lengths > g * length)))[0])
        raise ValueError(
            f"a unit of {int(lengths[u])} tokens (padded, {int(docs[u])} document(s)) fits "
            f"no context-parallel group: a sharded document may be at most context_parallel "
            f"· row_length = {g * length} tokens and a group of documents one row; raise "
            "max_tokens/row_length or context_parallel, or cut documents with "
            "chronica.core.packing.pieces"
        )
    if g == 1:
        return np.zeros(lengths.shape[0], np.bool_)
    fair = float(costs.sum()) / devices
    return long | ((docs == 1) & (costs > share * fair))


def pack_context_step(
    lengths: np.ndarray,
    costs: np.ndarray,
    devices: int,
    packing: Packing,
    speeds: np.ndarray | None = None,
    docs: np.ndarray | None = None,
) -> ContextStep:
    """Pack one step's units for ``devices`` devices in groups of
    ``packing.context_parallel`` (see the module docstring). Deterministic.

    Args:
        lengths: tokens per unit (padded to ``packing.pad_multiple`` here).
        costs: predicted cost per unit, finite and ``>= 0``.
        devices: ``W = DP · g``, a multiple of ``packing.context_parallel``.
        packing: the cap, rows, count rules and ``context_parallel``.
        speeds: relative speed per device (default equal).
        docs: documents per unit (default one each).

    Example::

        >>> packing = Packing(max_tokens=8, context_parallel=2, pad_multiple=4)
        >>> pack_context_step(np.array([16, 4, 4]), np.array([16.0, 1.0, 1.0]), 2,
        ...                   packing).step.cells.tolist()
        [[8.0, 1.0], [8.0, 1.0]]
    """
    g = packing.context_parallel
    w = check_int("world_size", devices, g)
    if w % g:
        raise ValueError(
            f"world_size={w} devices must be a multiple of context_parallel={g} "
            "(W = data-parallel groups · context_parallel)"
        )
    if packing.balance != "rank" or packing.pipeline is not None:
        raise ValueError(
            "Packing(context_parallel>1) plans balance='rank' without a pipeline so far; "
            "drop balance='micro' / pipeline=, or set context_parallel=1"
        )
    lengths = packing.padded(np.ascontiguousarray(lengths, dtype=np.int64))
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    n = lengths.shape[0]
    units = np.ones(n, np.int64) if docs is None else np.ascontiguousarray(docs, np.int64)
    speed = np.ones(w) if speeds is None else np.ascontiguousarray(speeds, dtype=np.float64)
    if speed.shape != (w,) or not (np.isfinite(speed).all() and (speed > 0).all()):
        raise ValueError(f"speeds must be {w} finite numbers > 0 (one per device)")
    best: ContextStep | None = None
    for share in SHARD_SHARES:
        sharded = shard_choice(lengths, costs, units, w, packing, share)
        if best is not None and np.array_equal(sharded, best.sharded):
            continue
        out = _pack(lengths, costs, units, speed, packing, sharded)
        if best is None or _figure(out.step, speed, False) < _figure(best.step, speed, False):
            best = out
        if _figure(best.step, speed, False) <= costs.sum() / speed.sum() * (1 + _RETRY_ABOVE):
            break
    assert best is not None
    return best


def _pack(
    lengths: np.ndarray,
    costs: np.ndarray,
    units: np.ndarray,
    speed: np.ndarray,
    packing: Packing,
    sharded: np.ndarray,
) -> ContextStep:
    """``pack_context_step`` for one choice of sharded units."""
    n, w, g = lengths.shape[0], speed.shape[0], packing.context_parallel
    split, whole = np.flatnonzero(sharded), np.flatnonzero(~sharded)
    # Every CP rank takes 1/g of a sharded document: its tokens, its cost.
    chunk_len, chunk_cost = lengths[split] // g, costs[split] / g
    row_docs = packing.max_documents_per_row or int(units.sum()) + 1
    shape = (packing.rows, packing.length, row_docs)
    group_speed = speed.reshape(w // g, g).min(1)
    multiple = packing.count_multiple
    fewest = max(1, math.ceil(int(lengths.sum()) / (w * packing.rows * packing.length)))
    fixed = packing.micro_batches
    m = _round_up(max(fewest, fixed or 1), multiple)

    def attempt(num: int) -> ContextStep | None:
        placed = _place(
            num, shape, (chunk_len, chunk_cost, group_speed),
            (lengths[whole], costs[whole], units[whole], speed),
        )  # fmt: skip
        if placed is None:
            return None
        return _pieces(placed, split, whole, n, (w, g, num), chunk_cost, costs)

    best = attempt(m)
    while best is None:
        m += multiple
        best = attempt(m)
    if fixed or not n:
        return best
    piece_cost = np.concatenate((costs[whole], np.repeat(chunk_cost, g)))
    bound = max(piece_cost.sum() / speed.sum(), piece_cost.max() / speed.max())
    top = _figure(best.step, speed, False)
    while top > bound * (1 + _MICRO_GAIN) and m + multiple <= n:
        m += multiple
        more = attempt(m)
        if more is None or _figure(more.step, speed, False) > top * (1 - _MICRO_GAIN):
            break
        best, top = more, _figure(more.step, speed, False)
    return best


def _place(
    num: int,
    shape: tuple[int, int, int],
    chunks: tuple[np.ndarray, np.ndarray, np.ndarray],
    wholes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, ...] | None:
    """Sharded chunks onto the groups, then whole units onto the devices from that load
    (loosely, then best fit): ``(group, micro, row)`` of every sharded unit and ``(device,
    micro, row)`` of every whole one, or ``None`` if something fits nowhere."""
    rows, length, row_docs = shape
    chunk_len, chunk_cost, group_speed = chunks
    groups = group_speed.shape[0]
    free = np.full((groups, num, rows), length, np.int64)
    slots = np.full((groups, num, rows), row_docs, np.int64)
    micro_loads = np.zeros((groups, num))
    loads = np.zeros(groups)
    s = chunk_len.shape[0]
    g_rank, g_micro, g_row = (np.empty(s, np.int64) for _ in range(3))
    if not place_loaded(
        chunk_len, chunk_cost, np.ones(s, np.int64), argsort_descending(chunk_cost),
        group_speed, False, False, free, slots, micro_loads, loads, g_rank, g_micro, g_row,
    ):  # fmt: skip
        return None
    w_len, w_cost, w_docs, speed = wholes
    g = speed.shape[0] // groups
    order = argsort_descending(w_cost)
    rank, micro, row = (np.empty(w_len.shape[0], np.int64) for _ in range(3))
    for tight in (False, True):
        # Every CP rank of a group starts from the group's rows and load.
        state = [np.repeat(a, g, axis=0) for a in (free, slots, micro_loads, loads)]
        if place_loaded(w_len, w_cost, w_docs, order, speed, tight, True, *state, rank, micro, row):
            return g_rank, g_micro, g_row, rank, micro, row
    return None


def _pieces(
    placed: tuple[np.ndarray, ...],
    split: np.ndarray,
    whole: np.ndarray,
    n: int,
    shape: tuple[int, int, int],
    chunk_cost: np.ndarray,
    costs: np.ndarray,
) -> ContextStep:
    """The placement as pieces: whole units first (in unit order), then the ``g`` chunks of
    every sharded unit (CP rank after CP rank)."""
    g_rank, g_micro, g_row, rank, micro, row = placed
    w, g, num = shape
    cp = np.tile(np.arange(g), split.shape[0])
    piece_rank = np.concatenate((rank, np.repeat(g_rank * g, g) + cp))
    piece_micro = np.concatenate((micro, np.repeat(g_micro, g)))
    piece_row = np.concatenate((row, np.repeat(g_row, g)))
    piece_cost = np.concatenate((costs[whole], np.repeat(chunk_cost, g)))
    cells = np.zeros((w, num))
    np.add.at(cells, (piece_rank, piece_micro), piece_cost)
    sharded = np.zeros(n, np.bool_)
    sharded[split] = True
    return ContextStep(
        step=PackedStep(piece_rank, piece_micro, piece_row, num, cells.sum(1), cells),
        unit=np.concatenate((whole, np.repeat(split, g))),
        pinned=np.concatenate((np.zeros(whole.shape[0], np.bool_), np.ones(split.size * g, bool))),
        sharded=sharded,
    )
