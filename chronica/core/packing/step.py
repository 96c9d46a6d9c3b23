"""``pack_step``: one step's documents as token-capped micro-batches of every rank.

With ``Packing`` a step's documents are not dealt out in equal counts: every rank's share
is cut into the same number of micro-batches (gradient accumulation), each holding at most
``max_tokens`` tokens laid out as ``max_tokens // row_length`` rows of ``row_length`` tokens
with several documents per row. Documents never attend across their boundaries, so a
micro-batch costs the sum of its documents' costs ``a + b·L + c·L²``.

``pack_step`` decides one step: the fewest micro-batches per rank at which every document
fits, plus one more for as long as that lowers the slowest rank's time by 1% (the cap, not
the costs, held it back: typically a fast rank whose fair share of the tokens does not fit),
or exactly ``Packing.micro_batches`` where the documents fit; every document to a rank, a
micro-batch and a row (``chronica.core.packing.kernels``), so that the slowest rank's
predicted time (its cost over its speed) is as small as the kernel finds and a rank's
micro-batches carry similar costs.

If a document fits nowhere, the same count is tried again with every document in the
fullest row of its rank it fits in (best fit: tighter, micro-batches less even); if that
fails too, the step takes one more micro-batch per rank and starts again.

With ``Packing(balance="micro")`` the objective is the lockstep step instead, the sum over
micro-batches of the slowest rank's micro-batch (``chronica.core.packing.lockstep``); the
count is then at most what gives every (rank, micro-batch) cell a document, where the
tokens allow, and grows by one while that shortens the lockstep step by 1% (on ranks of one
speed, not where ``lockstep_floor``, a bound of every count's step, says it cannot). Counts are
rounded up to ``Packing.micro_batch_multiple`` (and the pipeline's rule, whose depth is also
the fewest); documents count ``pad_multiple``-padded tokens. ``in_pipeline_order`` then
orders a packed step's micro-batches for ``Packing.pipeline``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int
from chronica.core.kernels import argsort_descending
from chronica.core.packing.kernels import pack_attempt
from chronica.core.packing.lockstep import lockstep_attempt
from chronica.core.packing.lockstep_bound import lockstep_floor
from chronica.core.packing.options import Packing
from chronica.core.pipeline import order_micro_batches

__all__ = ["PackedStep", "fill_empty", "in_pipeline_order", "pack_step"]

# One more micro-batch per rank than the tokens need is taken while it lowers the slowest
# rank's time by at least this much (relative) and that time is this far above the bound.
_MICRO_GAIN = 0.01
# The lockstep floor is lowered by this much (relative) against rounding in its sums.
_FLOOR_SLACK = 1e-9


@dataclass(frozen=True)
class PackedStep:
    """One step packed for ``num_replicas`` ranks: document ``i`` (in the step's order) goes
    to rank ``rank[i]``, micro-batch ``micro[i]`` of that rank, row ``row[i]`` of it.
    Every rank runs ``num_micro`` micro-batches; ``loads[r]`` is rank ``r``'s predicted cost
    (its time is ``loads[r] / speeds[r]``), ``cells[r, k]`` that of its micro-batch ``k``;
    no micro-batch holds more than ``max_tokens`` tokens and no row more than
    ``row_length``. Built by ``pack_step``.

    Args:
        rank: ``int64``, every document's rank.
        micro: ``int64``, every document's micro-batch within its rank.
        row: ``int64``, every document's row within its micro-batch.
        num_micro: micro-batches per rank.
        loads: ``float64``, every rank's predicted cost.
        cells: ``float64`` ``(ranks, num_micro)``, every micro-batch's predicted cost.

    Example::

        >>> step = pack_step(np.array([3, 2, 2]), np.array([3.0, 2.0, 2.0]), 2,
        ...                  Packing(max_tokens=4))
        >>> step.rank.tolist(), step.num_micro, step.order().tolist()
        ([0, 1, 1], 1, [0, 1, 2])
    """

    rank: np.ndarray
    micro: np.ndarray
    row: np.ndarray
    num_micro: int
    loads: np.ndarray
    cells: np.ndarray

    def order(self) -> np.ndarray:
        """Positions of the step's documents rank after rank, micro-batch after micro-batch,
        row after row (step order within a row)."""
        return np.lexsort((self.row, self.micro, self.rank))


def pack_step(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_replicas: int,
    packing: Packing,
    speeds: np.ndarray | None = None,
    num_micro: int | None = None,
    docs: np.ndarray | None = None,
) -> PackedStep:
    """Pack one step's documents (token ``lengths`` at most ``packing.row_length`` each
    once padded, predicted ``costs``, finite and non-negative) for ``num_replicas`` ranks of
    relative ``speeds`` (positive; default equal); ``num_micro`` micro-batches per rank at
    least (default ``packing.micro_batches``, else the fewest the tokens need). See the
    module docstring.

    Args:
        lengths: tokens per document (or per group packed as one unit), each at most
            ``packing.row_length`` once padded (cut longer documents with ``pieces``).
        costs: predicted cost per document, finite and ``>= 0`` (a ``CostModel`` of the
            lengths).
        num_replicas: the ranks sharing the step, ``>= 1``.
        packing: the token cap, the rows, the objective and the count rules.
        speeds: relative speed per rank, finite and ``> 0`` (default: equal).
        num_micro: the fewest micro-batches per rank (default ``packing.micro_batches``).
        docs: documents per unit (default one each), counted against
            ``packing.max_documents_per_row``.

    Example::

        >>> step = pack_step(np.array([300, 200, 200, 100]), np.array([3.0, 2.0, 2.0, 1.0]),
        ...                  2, Packing(max_tokens=400))
        >>> step.num_micro, step.loads.tolist()
        (1, [4.0, 4.0])
    """
    if packing.context_parallel > 1:
        raise ValueError(
            f"Packing(context_parallel={packing.context_parallel}) steps are planned by "
            "chronica.plan_step (chronica.core.packing.context_step); the samplers do not "
            "plan context-parallel steps yet"
        )
    lengths = packing.padded(np.ascontiguousarray(lengths, dtype=np.int64))
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    n = lengths.shape[0]
    unit_docs = None if docs is None else np.ascontiguousarray(docs, np.int64)
    w = check_int("num_replicas", num_replicas, 1)
    speed = None if speeds is None else np.ascontiguousarray(speeds, dtype=np.float64)
    # min/max: NaN fails both comparisons, as an infinity fails one.
    if costs.shape != lengths.shape or (n and not (costs.min() >= 0 and costs.max() < np.inf)):
        raise ValueError(
            f"costs must be finite and >= 0, one per document ({n}); use a CostModel of the lengths"
        )
    check_speeds(speed, w, speeds)
    if n and int(lengths.max()) > packing.length:
        raise ValueError(
            f"a document of {int(lengths.max())} tokens (padded) is longer than row_length="
            f"{packing.length}; cut documents with chronica.core.packing.pieces first"
        )
    if unit_docs is not None:
        check_unit_docs(unit_docs, n, packing)
    return pack_checked(lengths, costs, w, packing, speed, num_micro, unit_docs)


def check_speeds(speed: np.ndarray | None, w: int, given: object) -> None:
    """``ValueError`` unless ``speed`` is ``None`` (equal speeds) or ``w`` finite numbers
    ``> 0`` (``pack_step``'s check of its ``speeds``).

    Args:
        speed: ``float64`` relative speed per rank, or ``None``.
        w: the ranks.
        given: what the caller passed, as the message shows it.

    Example::

        >>> check_speeds(np.array([1.0, 0.0]), 2, [1.0, 0.0])
        Traceback (most recent call last):
        ValueError: speeds must be 2 finite numbers > 0 (one per rank), got [1.0, 0.0]
    """
    # min/max: NaN fails both comparisons, as an infinity fails one.
    if speed is not None and (
        speed.shape != (w,) or not (speed.min() > 0 and speed.max() < np.inf)
    ):
        raise ValueError(f"speeds must be {w} finite numbers > 0 (one per rank), got {given!r}")


def check_unit_docs(unit_docs: np.ndarray, n: int, packing: Packing) -> None:
    """``ValueError`` unless ``unit_docs`` holds ``n`` counts, none above
    ``packing.max_documents_per_row`` (``pack_step``'s check of its ``docs``).

    Args:
        unit_docs: ``int64`` documents per unit.
        n: the step's units.
        packing: the options the step is packed under.

    Example::

        >>> check_unit_docs(np.array([3, 1]), 2, Packing(max_tokens=8, max_documents_per_row=2))
        Traceback (most recent call last):
        ValueError: a unit of 3 documents exceeds max_documents_per_row=2; raise the limit ...
    """
    # Without a limit, more slots than the step has documents: the count never binds.
    row_docs = packing.max_documents_per_row or int(unit_docs.sum()) + 1
    if unit_docs.shape != (n,) or (n and int(unit_docs.max()) > row_docs):
        raise ValueError(
            f"a unit of {int(unit_docs.max())} documents exceeds max_documents_per_row="
            f"{packing.max_documents_per_row}; raise the limit or make the groups smaller"
        )


def pack_checked(
    lengths: np.ndarray,
    costs: np.ndarray,
    w: int,
    packing: Packing,
    speed: np.ndarray | None,
    num_micro: int | None,
    unit_docs: np.ndarray | None,
) -> PackedStep:
    """``pack_step`` of arguments it has already checked and converted (padded ``int64``
    ``lengths`` that fit a row, finite non-negative ``float64`` ``costs``, ``speed``
    ``float64`` and positive or ``None`` for equal, ``unit_docs`` checked or ``None`` for one
    document per unit): callers that validated their input skip the second pass.

    Args:
        lengths: ``int64`` padded tokens per unit.
        costs: ``float64`` predicted cost per unit.
        w: the ranks.
        packing: the options.
        speed: ``float64`` relative speed per rank, or ``None`` (equal).
        num_micro: the fewest micro-batches per rank, or ``None``.
        unit_docs: ``int64`` documents per unit, or ``None`` (one each).

    Example::

        >>> step = pack_checked(np.array([3, 2, 2]), np.array([3.0, 2.0, 2.0]), 2,
        ...                     Packing(max_tokens=4), None, None, None)
        >>> step.rank.tolist(), step.loads.tolist()
        ([0, 1, 1], [3.0, 4.0])
    """
    n = lengths.shape[0]
    speed = np.ones(w) if speed is None else speed
    if unit_docs is None:
        unit_docs = np.ones(n, np.int64)
        row_docs = packing.max_documents_per_row or n + 1
    else:
        row_docs = packing.max_documents_per_row or int(unit_docs.sum()) + 1
    lockstep = packing.balance == "micro"
    multiple = packing.count_multiple
    rows, length = packing.rows, packing.length
    fewest = max(1, math.ceil(int(lengths.sum()) / (w * rows * length)))
    fixed = num_micro or packing.micro_batches
    depth = 1 if packing.pipeline is None else packing.pipeline.min_micro_batches
    m = _round_up(max(fewest, fixed or 1, depth), multiple)
    order = argsort_descending(costs)

    def attempt(num: int) -> PackedStep | None:
        # Fresh outputs per attempt: a kept attempt's arrays are never written again.
        rank, micro, row = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        if lockstep:
            cells = np.zeros((w, num))
            if not lockstep_attempt(
                lengths, costs, unit_docs, order, speed, num, rows, length, row_docs, rank,
                micro, row, cells,
            ):  # fmt: skip
                return None
            return PackedStep(rank, micro, row, num, cells.sum(1), cells)
        # Rank sums: even micro-batches first, then packed tightly.
        loads = np.empty(w)
        if not (
            pack_attempt(
                lengths, costs, unit_docs, order, speed, num, rows, length, row_docs, False,
                rank, micro, row, loads,
            )
            or pack_attempt(
                lengths, costs, unit_docs, order, speed, num, rows, length, row_docs, True,
                rank, micro, row, loads,
            )
        ):  # fmt: skip
            return None
        # In document order, as ``np.add.at`` would add them, without its overhead; the rank
        # kernel's own sums as the loads, so that its plans stay bitwise what they were.
        sums = np.bincount(rank * num + micro, weights=costs, minlength=w * num)
        return PackedStep(rank, micro, row, num, loads, sums.reshape(w, num))

    # One micro-batch per document always fits, so the loop ends.
    best = attempt(m)
    while best is None:
        m += multiple
        best = attempt(m)
    # One rank's step is its total under either objective, at any count: nothing to gain.
    if fixed or not n or w == 1:
        return best
    # Free counts: while the token cap, not the costs, keeps the step more than 1% above what
    # any split allows, ``multiple`` more micro-batches per rank are worth their overhead;
    # the lockstep objective stops where a cell would be left without a document.
    if m + multiple > n // (w if lockstep else 1):
        return best
    bound = max(costs.sum() / speed.sum(), costs.max() / speed.max())
    top = _figure(best, speed, lockstep)
    floor = -1.0  # the lockstep floor of any count, computed where first needed
    equal = lockstep and bool((speed == speed[0]).all())
    while top > bound * (1 + _MICRO_GAIN) and m + multiple <= n // (w if lockstep else 1):
        if equal:
            # No plan of any count is shorter than the floor: where the floor is not 1%
            # below the step, the attempt could not be kept (the same plan, sooner).
            if floor < 0:
                cap = rows * length
                floor = lockstep_floor(lengths, costs, w, cap) / speed[0] * (1 - _FLOOR_SLACK)
            if floor > top * (1 - _MICRO_GAIN):
                break
        m += multiple
        more = attempt(m)
        if more is None:
            break
        figure = _figure(more, speed, lockstep)
        if figure > top * (1 - _MICRO_GAIN):
            break
        best, top = more, figure
    return best


def _round_up(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def _figure(step: PackedStep, speeds: np.ndarray, lockstep: bool) -> float:
    """The step's predicted time under its objective: the slowest rank's sum, or the sum
    over micro-batches of the slowest rank's micro-batch."""
    times = step.cells / speeds[:, None]
    return float(times.max(0).sum() if lockstep else times.sum(1).max())


def in_pipeline_order(step: PackedStep, speeds: np.ndarray, packing: Packing) -> PackedStep:
    """``step`` with every rank's micro-batches renumbered in the order that shortens
    ``packing.pipeline``'s simulated step (``chronica.core.pipeline.order_micro_batches`` of
    their times); under ``balance="micro"`` one order for all ranks, from each micro-batch's
    slowest rank, so micro-batch *k* still runs in lockstep. Unchanged without a pipeline.

    Args:
        step: a packed step (``pack_step``).
        speeds: relative speed per rank.
        packing: the options the step was packed under.

    Example::

        >>> from chronica.core.pipeline import Pipeline
        >>> packing = Packing(max_tokens=4, pipeline=Pipeline(stages=2))
        >>> step = pack_step(np.array([4, 1, 1]), np.array([4.0, 1.0, 1.0]), 1, packing)
        >>> in_pipeline_order(step, np.ones(1), packing).cells.tolist()
        [[4.0, 2.0]]
    """
    if packing.pipeline is None:
        return step
    times = step.cells / np.asarray(speeds, dtype=np.float64)[:, None]
    if packing.balance == "micro":
        orders = np.tile(order_micro_batches(times.max(0), packing.pipeline), (times.shape[0], 1))
    else:
        orders = np.array([order_micro_batches(t, packing.pipeline) for t in times])
    position = np.empty_like(orders)
    np.put_along_axis(position, orders, np.arange(step.num_micro)[None, :], axis=1)
    cells = np.take_along_axis(step.cells, orders, axis=1)
    micro = position[step.rank, step.micro]
    return PackedStep(step.rank, micro, step.row, step.num_micro, step.loads, cells)


def fill_empty(
    step: PackedStep, unit_cost: np.ndarray, pinned: np.ndarray | None = None
) -> PackedStep:
    """The step's placement with no empty rank and no empty micro-batch on a rank that has
    as many units as micro-batches. The kernels leave a slow rank empty when a faster one
    finishes its share sooner, and a rank's micro-batch empty when it has few units; the
    cheapest movable unit of the rank (or micro-batch) with the most units moves to the
    empty one's first row, which has room for any unit.

    Args:
        step: the kernels' placement of the step's units.
        unit_cost: ``float64`` predicted cost per unit.
        pinned: ``bool`` per unit: units that count but never move (chunks of documents
            sharded over a context-parallel group); ``None``: every unit may move.

    Where nothing moves, the result holds ``step``'s own arrays (no copies).

    Example::

        >>> step = PackedStep(np.array([0, 0]), np.array([0, 0]), np.array([0, 0]), 1,
        ...                   np.array([3.0, 0.0]), np.array([[3.0], [0.0]]))
        >>> fill_empty(step, np.array([2.0, 1.0])).rank.tolist()
        [0, 1]
    """
    filled = fill_cells(step, unit_cost, pinned)
    if filled is not step:
        return filled
    return PackedStep(
        step.rank, step.micro, step.row, step.num_micro, step.cells.sum(1), step.cells
    )


def fill_cells(
    step: PackedStep, unit_cost: np.ndarray, pinned: np.ndarray | None = None
) -> PackedStep:
    """``fill_empty``'s placement; ``step`` itself (its ``loads`` as they were) where
    nothing moves, for callers that read only the placement and ``cells``.

    Args:
        step: the kernels' placement of the step's units.
        unit_cost: ``float64`` predicted cost per unit.
        pinned: ``bool`` per unit: units that never move; ``None``: every unit may move.

    Example::

        >>> step = pack_step(np.array([3, 2]), np.array([3.0, 2.0]), 2, Packing(max_tokens=4))
        >>> fill_cells(step, np.array([3.0, 2.0])) is step
        True
    """
    w, m = step.cells.shape
    # Only a rank with at least ``m`` units and an empty micro-batch has one to fill (an
    # empty rank is one too); where there is none the placement stands as it is.
    per_cell = np.bincount(step.rank * m + step.micro, minlength=w * m).reshape(w, m)
    if per_cell.min() > 0 or (per_cell.any(1) & ((per_cell.sum(1) < m) | per_cell.all(1))).all():
        return step
    rank, micro, row, cells = (
        step.rank.copy(),
        step.micro.copy(),
        step.row.copy(),
        step.cells.copy(),
    )
    movable = np.ones(rank.shape[0], np.bool_) if pinned is None else ~pinned

    def move(unit: int, to_rank: int, to_micro: int) -> None:
        cells[rank[unit], micro[unit]] -= unit_cost[unit]
        cells[to_rank, to_micro] += unit_cost[unit]
        rank[unit], micro[unit], row[unit] = to_rank, to_micro, 0

    counts = np.bincount(rank, minlength=w)
    for empty in np.flatnonzero(counts == 0).tolist():
        donors = np.bincount(rank[movable], minlength=w) > 0
        mine = np.flatnonzero((rank == int(np.argmax(np.where(donors, counts, -1)))) & movable)
        if not mine.size:
            break
        unit = int(mine[np.argmin(unit_cost[mine])])
        counts[rank[unit]] -= 1
        counts[empty] += 1
        # The same micro-batch: under lockstep, the donor's shrinks as the empty rank's grows.
        move(unit, empty, int(micro[unit]))
    per_cell = np.bincount(rank * m + micro, minlength=w * m).reshape(w, m)
    short = (per_cell.sum(1) >= m) & (per_cell == 0).any(1)
    for r in np.flatnonzero(short).tolist():
        mine = np.flatnonzero(rank == r)
        per_micro = np.bincount(micro[mine], minlength=m)
        while mine.size >= m and (per_micro == 0).any():
            fullest = mine[(micro[mine] == int(np.argmax(per_micro))) & movable[mine]]
            if not fullest.size:
                break
            unit = int(fullest[np.argmin(unit_cost[fullest])])
            per_micro[micro[unit]] -= 1
            k = int(np.argmin(per_micro))
            per_micro[k] += 1
            move(unit, r, k)
    return PackedStep(rank, micro, row, step.num_micro, cells.sum(1), cells)
