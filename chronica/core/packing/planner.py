"""``plan_step``: one global batch, already in memory, planned for every rank in one call.

RL and SFT trainers hold the step's global batch themselves (rollouts, preference pairs,
packed SFT batches); they need the micro-batches of every rank, not a sampler. ``plan_step``
takes the batch's lengths (and optional group ids and loss-token counts) and returns a
``StepPlan``: per rank, its micro-batches in execution order, their rows, loss weights and
``cu_seqlens``-ready offsets, plus the predicted figures. It uses the samplers' kernels
(``pack_step``), so a plan here is the plan a sampler would make for the same step.

Guarantees, wherever the step has at least as many units (documents, or groups kept whole)
as ranks: every rank runs the same number of micro-batches; no rank is empty; no
micro-batch holds more than ``max_tokens`` padded tokens, no row more than ``row_length``
(nor more than ``max_documents_per_row`` documents); a group's documents share one rank
and one micro-batch; every document appears exactly once; the loss weights make the
accumulated, rank-averaged update the global mean over the chosen units. A step with fewer
units than ranks is refused with a ``ValueError`` (no rank runs a dummy forward pass).

Under ``Packing(context_parallel=g)`` the ranks are the devices of a data-parallel ×
context-parallel mesh and some documents are sharded over a CP group
(``chronica.core.packing.context_step``): every token of every document is then held by
exactly one device, the caps hold per device, and ``context_shards`` gives each CP rank's
layout (``chronica.core.packing.context_parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.core.cost import as_cost_model
from chronica.core.packing.context_parallel import ContextShard, context_layout
from chronica.core.packing.context_step import pack_context_step
from chronica.core.packing.options import Packing
from chronica.core.packing.step import (
    check_speeds,
    check_unit_docs,
    fill_cells,
    in_pipeline_order,
    pack_checked,
)
from chronica.core.pipeline import equal_cost_bound, pipeline_makespan

__all__ = ["StepPlan", "plan_step"]


def _integers(name: str, values: Any, n: int | None, hint: str) -> np.ndarray:
    """``values`` as a 1-D ``int64`` array of non-negative integers (``n`` of them if given):
    ``TypeError`` for booleans or non-integers, ``ValueError`` for shape or sign."""
    array = np.asarray(values)
    # Booleans are neither: np.issubdtype(bool, np.integer) is False.
    floating = np.issubdtype(array.dtype, np.floating)
    if not (np.issubdtype(array.dtype, np.integer) or (floating and np.all(np.mod(array, 1) == 0))):
        raise TypeError(f"{name} must be whole numbers{hint}, got dtype {array.dtype}")
    if array.ndim != 1 or (n is not None and array.shape[0] != n):
        want = f"{n} of them, one per document" if n is not None else "a 1-D sequence"
        raise ValueError(f"{name} must be {want}, got shape {array.shape}")
    # Integers are finite: only floating point needs the check.
    if array.size and ((floating and not np.all(np.isfinite(array))) or array.min() < 0):
        raise ValueError(f"{name} must be finite and >= 0{hint}")
    return array.astype(np.int64)


@dataclass(frozen=True, repr=False)
class StepPlan:
    """One global batch planned for ``world_size`` ranks (built by ``plan_step``).

    Under ``Packing(context_parallel=g)`` a rank is a device of the ``("dp", "cp")`` mesh
    (module ``chronica.core.packing.context_step``). Document ``i`` (an index into the
    batch) runs on rank ``rank[i]``, in micro-batch
    ``micro[i]`` of that rank (execution order: every rank runs micro-batch ``k`` as its
    ``k``-th), in row ``row[i]`` of it. Every rank runs ``num_micro`` micro-batches.

    Args:
        lengths: ``int64`` tokens per document, unpadded.
        padded: ``int64`` tokens per document after ``Packing.pad_multiple``.
        units: ``int64`` weight units per document (tokens, 1, or loss tokens, by
            ``Packing.loss``).
        rank: ``int64`` every document's rank.
        micro: ``int64`` every document's micro-batch within its rank.
        row: ``int64`` every document's row within its micro-batch.
        num_micro: micro-batches per rank.
        micro_costs: ``float64`` ``(world_size, num_micro)`` predicted cost per micro-batch.
        speeds: ``float64`` relative speed per rank.
        packing: the options the plan was made under.
        bound: a lower bound of ``rank_time`` and ``lockstep_time``: the larger of the
            mean time (the total cost over the summed speeds) and the costliest unit on the
            fastest rank.
        sharded: under ``Packing(context_parallel=g)``, ``bool`` per document: whether it
            is sharded over its CP group (``rank`` is then CP rank 0 of the group, and every
            CP rank of it holds ``1/g`` of it, ``context_shards``); ``None`` otherwise.

    Example::

        >>> plan = plan_step([300, 200, 200, 100], 2, Packing(max_tokens=400))
        >>> [m.tolist() for m in plan.micro_batches(0)], plan.rank_costs.tolist()
        ([[0, 3]], [400.0, 400.0])
    """

    lengths: np.ndarray
    padded: np.ndarray
    units: np.ndarray
    rank: np.ndarray
    micro: np.ndarray
    row: np.ndarray
    num_micro: int
    micro_costs: np.ndarray
    speeds: np.ndarray
    packing: Packing
    bound: float
    sharded: np.ndarray | None = None

    @cached_property
    def _layout(self) -> list[list[np.ndarray]]:
        # Every rank's micro-batches' documents, built once on first use (a planner that
        # needs only the arrays and the loss weights, as a streamed window, never builds it).
        world = self.speeds.shape[0]
        doc, rank = np.arange(self.rank.shape[0]), self.rank
        if self.sharded is not None and self.sharded.any():
            # A sharded document is held by every CP rank of its group.
            split = np.flatnonzero(self.sharded)
            g = self.context_parallel
            doc = np.concatenate((doc, np.repeat(split, g - 1)))
            rank = np.concatenate(
                (rank, np.repeat(rank[split], g - 1) + np.tile(np.arange(1, g), split.size))
            )
        micro, row = self.micro[doc], self.row[doc]
        order = np.lexsort((doc, row, micro, rank))
        cut = np.searchsorted(
            (rank * self.num_micro + micro)[order], np.arange(1, world * self.num_micro)
        )
        cells = np.split(doc[order], cut)
        return [cells[r * self.num_micro : (r + 1) * self.num_micro] for r in range(world)]

    @property
    def world_size(self) -> int:
        """The ranks the batch is planned for."""
        return int(self.speeds.shape[0])

    @property
    def rank_costs(self) -> np.ndarray:
        """Predicted cost per rank: the sum of its micro-batches' costs."""
        return self.micro_costs.sum(1)

    @property
    def rank_time(self) -> float:
        """The slowest rank's predicted time, ``max_r rank_costs[r] / speeds[r]``: the step
        of DDP with gradient accumulation (``balance="rank"``'s objective)."""
        return float((self.rank_costs / self.speeds).max())

    @property
    def lockstep_time(self) -> float:
        """``sum_k max_r micro_costs[r, k] / speeds[r]``: the step when every micro-batch
        ends in a collective (FSDP, ZeRO-3, experts; ``balance="micro"``'s objective)."""
        return float((self.micro_costs / self.speeds[:, None]).max(0).sum())

    @property
    def pipeline_time(self) -> float | None:
        """With ``Packing.pipeline``: the slowest rank's simulated pipeline step over its
        micro-batches in execution order (``chronica.core.pipeline.pipeline_makespan``);
        ``None`` without a pipeline."""
        if self.packing.pipeline is None:
            return None
        times = self.micro_costs / self.speeds[:, None]
        return max(pipeline_makespan(t, self.packing.pipeline) for t in times)

    @property
    def pipeline_bound(self) -> float | None:
        """With ``Packing.pipeline``: the largest over ranks of the step the same micro-batch
        costs would take if they were equal (``equal_cost_bound``), the figure
        ``pipeline_time`` is measured against; ``None`` without a pipeline."""
        if self.packing.pipeline is None:
            return None
        times = self.micro_costs / self.speeds[:, None]
        return max(equal_cost_bound(t, self.packing.pipeline) for t in times)

    def micro_batches(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s micro-batches in execution order, each the ``int64`` indices of
        its documents, row after row (batch order within a row).

        Args:
            rank: a rank in ``0 .. world_size - 1``.

        Example::

            >>> plan = plan_step([5, 4, 3, 2], 2, Packing(max_tokens=8))
            >>> [m.tolist() for m in plan.micro_batches(1)]
            [[1, 2]]
        """
        return list(self._layout[self._rank(rank)])

    def rows(self, rank: int, micro: int) -> list[np.ndarray]:
        """The documents of micro-batch ``micro`` of ``rank``, one array per row (``rows``
        of ``Packing``; empty rows included).

        Args:
            rank: a rank in ``0 .. world_size - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> plan = plan_step([3, 2, 2], 1, Packing(max_tokens=8, row_length=4))
            >>> [r.tolist() for r in plan.rows(0, 0)]
            [[0], [1, 2]]
        """
        docs = self._cell(rank, micro)
        return [docs[self.row[docs] == q] for q in range(self.packing.rows)]

    def cu_seqlens(self, rank: int, micro: int) -> np.ndarray:
        """``int32`` offsets of micro-batch ``micro`` of ``rank``'s documents laid end to end
        (padded lengths, row after row), ``[0, l0, l0 + l1, ...]``: flash-attention's
        variable-length ``cu_seqlens``. Under ``Packing(context_parallel=g)`` the device's
        local query segments (``context_shards``: a whole document, or one head-tail chunk of
        a sharded one).

        Args:
            rank: a rank in ``0 .. world_size - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> plan = plan_step([3, 2], 1, Packing(max_tokens=8, pad_multiple=2))
            >>> plan.cu_seqlens(0, 0).tolist()
            [0, 4, 6]
        """
        if self.context_parallel > 1:
            return self._local(rank, micro).cu_seqlens
        docs = self._cell(rank, micro)
        return np.concatenate(([0], np.cumsum(self.padded[docs]))).astype(np.int32)

    def position_ids(self, rank: int, micro: int) -> np.ndarray:
        """``int64`` positions of every token of micro-batch ``micro`` of ``rank`` (documents
        end to end as in ``cu_seqlens``), restarting at 0 at every document; under context
        parallelism, the positions of the device's local tokens within their documents.

        Args:
            rank: a rank in ``0 .. world_size - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> plan_step([3, 2], 1, Packing(max_tokens=8)).position_ids(0, 0).tolist()
            [0, 1, 2, 0, 1]
        """
        if self.context_parallel > 1:
            return self._local(rank, micro).position_ids
        lengths = self.padded[self._cell(rank, micro)]
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) - starts

    def loss_weights(self, rank: int) -> np.ndarray:
        """``float64`` weight per micro-batch of ``rank``: multiply micro-batch ``k``'s *mean*
        loss (over its tokens, documents or loss tokens, by ``Packing.loss``) by weight
        ``k``, sum over the rank's micro-batches and average over the ranks (DDP and FSDP
        do): the result is the global batch's mean over those units. An empty micro-batch
        weighs 0.

        Args:
            rank: a rank in ``0 .. world_size - 1``.

        Example::

            >>> plan = plan_step([3, 1], 1, Packing(max_tokens=3))
            >>> plan.loss_weights(0).tolist()
            [0.75, 0.25]
        """
        total = self._total
        if total == 0:
            return np.zeros(self.num_micro)
        if self.context_parallel > 1:
            # A device's mean runs over its local tokens (within their documents' lengths).
            units = [self._local_units(rank, k) for k in range(self.num_micro)]
            return np.array(units) * self.world_size / total
        return self._weights[self._rank(rank)].copy()

    @property
    def micro_weights(self) -> np.ndarray:
        """``float64`` ``(world_size, num_micro)``: row ``r`` is ``loss_weights(r)``, every
        rank's at once.

        Example::

            >>> plan_step([3, 1, 2, 2], 2, Packing(max_tokens=3)).micro_weights.tolist()
            [[0.75, 0.25], [0.5, 0.5]]
        """
        if self.context_parallel > 1:
            return np.array([self.loss_weights(r) for r in range(self.world_size)])
        return self._weights.copy()

    @cached_property
    def _total(self) -> float:
        return float(self.units.sum())  # the loss normaliser

    @cached_property
    def _weights(self) -> np.ndarray:
        # Every rank's ``loss_weights`` (without context parallelism), built once.
        total = self._total
        if total == 0:
            return np.zeros((self.world_size, self.num_micro))
        # Exact integer sums per micro-batch (float64 holds them exactly), in one pass.
        w, m = self.world_size, self.num_micro
        sums = np.bincount(self.rank * m + self.micro, weights=self.units, minlength=w * m)
        return np.asarray(sums.reshape(w, m) * w / total, dtype=np.float64)

    @property
    def context_parallel(self) -> int:
        """The context-parallel size ``g`` (``Packing.context_parallel``): device ``r`` is CP
        rank ``r % g`` of data-parallel group ``r // g``."""
        return self.packing.context_parallel

    def context_documents(self, group: int, micro: int) -> np.ndarray:
        """The ``int64`` batch indices of the documents that data-parallel ``group`` runs in
        micro-batch ``micro`` (on any of its CP ranks), row after row (batch order within a
        row): the micro-batch that ``context_shards`` lays out, whose index
        ``ContextShard.documents`` counts in.

        Args:
            group: a data-parallel group in ``0 .. world_size / context_parallel - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> packing = Packing(max_tokens=16, context_parallel=2, pad_multiple=4)
            >>> plan = plan_step([16, 4, 4, 3], 2, packing, cost="quadratic")
            >>> plan.sharded.tolist(), plan.context_documents(0, 0).tolist()
            ([True, False, False, False], [0, 1, 2, 3])
        """
        g = self.context_parallel
        q = check_int("group", group, 0, self.world_size // g - 1, hint=" (< world_size / g)")
        docs = np.unique(np.concatenate([self._cell(q * g + c, micro) for c in range(g)]))
        return docs[np.lexsort((docs, self.row[docs]))]

    def context_shards(self, group: int, micro: int) -> list[ContextShard]:
        """Per CP rank of data-parallel ``group``, what it holds of micro-batch ``micro``
        (``chronica.core.packing.context_parallel.context_layout`` of ``context_documents``'
        padded lengths): sharded documents in head-tail chunks on every CP rank, whole ones
        on their device. ``restore_order`` of the result puts the group's tokens back in the
        micro-batch's order.

        Args:
            group: a data-parallel group in ``0 .. world_size / context_parallel - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> packing = Packing(max_tokens=16, context_parallel=2, pad_multiple=4)
            >>> plan = plan_step([16, 4, 4, 3], 2, packing, cost="quadratic")
            >>> [s.cu_seqlens.tolist() for s in plan.context_shards(0, 0)]
            [[0, 4, 8, 12, 16], [0, 4, 8, 12]]
        """
        docs = self.context_documents(group, micro)
        g = self.context_parallel
        split = np.zeros(docs.shape[0], np.bool_) if self.sharded is None else self.sharded[docs]
        return context_layout(
            self.padded[docs], sharded=split, owner=np.where(split, 0, self.rank[docs] % g), size=g
        )

    def global_cu_seqlens(self, group: int, micro: int) -> np.ndarray:
        """``int32`` offsets of ``context_documents(group, micro)`` laid end to end (padded
        lengths): the whole micro-batch's ``cu_seqlens`` before it is split over the CP
        ranks (Transformer Engine's THD ``cu_seqlens``; ``ContextShard.tokens`` index into it).

        Args:
            group: a data-parallel group in ``0 .. world_size / context_parallel - 1``.
            micro: a micro-batch in ``0 .. num_micro - 1``.

        Example::

            >>> packing = Packing(max_tokens=16, context_parallel=2, pad_multiple=4)
            >>> plan = plan_step([16, 4, 4, 3], 2, packing, cost="quadratic")
            >>> plan.global_cu_seqlens(0, 0).tolist()
            [0, 16, 20, 24, 28]
        """
        docs = self.context_documents(group, micro)
        return np.concatenate(([0], np.cumsum(self.padded[docs]))).astype(np.int32)

    def _local(self, rank: int, micro: int) -> ContextShard:
        r = self._rank(rank)
        return self.context_shards(r // self.context_parallel, micro)[r % self.context_parallel]

    def _local_units(self, rank: int, micro: int) -> int:
        shard = self._local(rank, micro)
        docs = self.context_documents(self._rank(rank) // self.context_parallel, micro)
        return int(np.sum(shard.position_ids < self.lengths[docs][shard.documents]))

    def _rank(self, rank: int) -> int:
        return check_int("rank", rank, 0, self.world_size - 1, hint=" (< world_size)")

    def _cell(self, rank: int, micro: int) -> np.ndarray:
        k = check_int("micro", micro, 0, self.num_micro - 1, hint=" (< num_micro)")
        return self._layout[self._rank(rank)][k]

    def __repr__(self) -> str:
        """The plan's shape and figures."""
        return (
            f"StepPlan(world_size={self.world_size}, documents={self.rank.shape[0]}, "
            f"num_micro={self.num_micro}, balance={self.packing.balance!r}, "
            f"rank_time={self.rank_time:.6g}, lockstep_time={self.lockstep_time:.6g}, "
            f"bound={self.bound:.6g})"
        )


def plan_step(
    lengths: Any,
    world_size: int,
    packing: Packing,
    *,
    groups: Any = None,
    loss_tokens: Any = None,
    cost: Any = "linear",
    speeds: Any = None,
) -> StepPlan:
    """Plan one global batch for ``world_size`` ranks: every document to a rank, a
    micro-batch and a row, under ``packing``'s cap, objective and constraints (see the
    module docstring for what is guaranteed). Deterministic: the same arguments give the
    same plan on every machine, so every rank may call it with the same batch.

    Args:
        lengths: tokens per document of the global batch (whole numbers ``>= 0``), each at
            most ``packing.row_length`` once padded to ``packing.pad_multiple`` (``g`` rows
            under ``Packing(context_parallel=g)``: longer documents are sharded).
        world_size: the data-parallel ranks, ``>= 1``; under ``Packing(context_parallel=g)``
            every device, ``DP · g`` (``("dp", "cp")`` mesh order).
        packing: the cap, rows, objective (``balance``), padding and count rules.
        groups: a group id per document (any integers): documents sharing one run on the
            same rank in the same micro-batch and row, and count as one unit for balance
            (DPO chosen/rejected pairs, GRPO responses of one prompt); ``None``: every
            document alone.
        loss_tokens: the tokens that carry loss per document (``<=`` its length), needed by
            ``Packing(loss="loss_token")``.
        cost: predicted cost of a document from its padded length: a
            ``chronica.CostModel`` or ``"linear"``/``"quadratic"``.
        speeds: relative speed per rank (finite, ``> 0``); default equal.

    Example::

        >>> plan = plan_step([900, 500, 400, 300, 200, 100], 2,
        ...                  Packing(max_tokens=1024, balance="micro"))
        >>> plan.num_micro, [m.tolist() for m in plan.micro_batches(0)]
        (2, [[0], [3]])
    """
    if not isinstance(packing, Packing):
        raise TypeError(
            f"packing must be a chronica.Packing, got {type(packing).__name__}; e.g. "
            "Packing(max_tokens=16384, balance='micro')"
        )
    if packing.outliers is not None:
        raise ValueError(
            "Packing(outliers=...) moves documents between the steps of an epoch, and "
            "plan_step plans one step: drop outliers= here and let chronica.OutlierQueue "
            "choose each step's documents before plan_step plans them"
        )
    w = check_int("world_size", world_size, 1)
    raw = _integers("lengths", lengths, None, " (tokens per document)")
    n = raw.shape[0]
    padded = packing.padded(raw)
    model = as_cost_model(cost)
    doc_costs = np.asarray(model(padded), dtype=np.float64)  # the model reads them as float64
    unit_of = None if groups is None else _group_units(groups, n)
    units = n if unit_of is None else int(unit_of.max()) + 1 if n else 0
    if units < w:
        raise ValueError(
            f"the batch has {units} unit(s) (documents, or groups kept whole) for "
            f"world_size={w} ranks: a rank would be left empty; give the step at least "
            f"{w} units or plan it for fewer ranks"
        )
    # Without groups every document is its own unit: the sums per unit are the documents'.
    unit_len = (
        padded
        if unit_of is None
        else np.bincount(unit_of, weights=padded, minlength=units).astype(np.int64)
    )
    if packing.context_parallel > 1:
        every = np.arange(n) if unit_of is None else unit_of
        plan = _plan_context(raw, padded, doc_costs, every, unit_len, w, packing, speeds)
        _loss_units(packing, raw, loss_tokens)  # refuses loss_tokens= under loss="token"
        return plan
    if int(unit_len.max()) > packing.length:
        u = int(np.argmax(unit_len))
        what = "a document" if groups is None else f"group {np.asarray(groups)[unit_of == u][0]}"
        raise ValueError(
            f"{what} of {int(unit_len[u])} tokens (padded) is longer than row_length="
            f"{packing.length}; raise max_tokens/row_length, or cut documents with "
            "chronica.core.packing.pieces (groups must fit in one row)"
        )
    speed = None if speeds is None else np.asarray(speeds, dtype=np.float64)
    # ``pack_step``'s checks of what is not checked above, in its order; the costs come
    # from a ``CostModel``, finite and >= 0 by construction.
    packed_speed = np.ones(w) if speed is None else np.ascontiguousarray(speed)
    check_speeds(None if speed is None else packed_speed, w, speed)
    unit_cost = (
        doc_costs if unit_of is None else np.bincount(unit_of, weights=doc_costs, minlength=units)
    )
    unit_docs = None if unit_of is None else np.bincount(unit_of, minlength=units)
    if unit_docs is not None:
        check_unit_docs(unit_docs, units, packing)
    step = pack_checked(unit_len, unit_cost, w, packing, packed_speed, None, unit_docs)
    if speed is None:
        # Equal speeds: their sum is ``w`` and their largest 1 (the same floats).
        speed, speed_sum, speed_max = packed_speed, float(w), 1.0
    else:
        speed_sum, speed_max = float(speed.sum()), speed.max()
    step = in_pipeline_order(fill_cells(step, unit_cost), speed, packing)
    return StepPlan(
        lengths=raw,
        padded=padded,
        units=_loss_units(packing, raw, loss_tokens),
        rank=step.rank if unit_of is None else step.rank[unit_of],
        micro=step.micro if unit_of is None else step.micro[unit_of],
        row=step.row if unit_of is None else step.row[unit_of],
        num_micro=step.num_micro,
        micro_costs=step.cells,
        speeds=speed,
        packing=packing,
        bound=max(float(doc_costs.sum()) / speed_sum, unit_cost.max() / speed_max),
    )


def _plan_context(
    raw: np.ndarray,
    padded: np.ndarray,
    doc_costs: np.ndarray,
    unit_of: np.ndarray,
    unit_len: np.ndarray,
    devices: int,
    packing: Packing,
    speeds: Any,
) -> StepPlan:
    """``plan_step`` under ``Packing(context_parallel=g)``: ``pack_context_step`` over the
    units, no device left empty, every sharded document on CP rank 0 of its group."""
    if packing.loss != "token":
        raise ValueError(
            f"Packing(context_parallel={packing.context_parallel}) weights the loss by local "
            f"tokens (loss='token'); loss={packing.loss!r} is not supported with it yet"
        )
    units = unit_len.shape[0]
    unit_cost = np.bincount(unit_of, weights=doc_costs, minlength=units)
    speed = None if speeds is None else np.asarray(speeds, dtype=np.float64)
    cp = pack_context_step(
        unit_len, unit_cost, devices, packing, speed, docs=np.bincount(unit_of, minlength=units)
    )
    speed = np.ones(devices) if speed is None else speed
    g = packing.context_parallel
    piece_cost = np.where(cp.sharded, unit_cost / g, unit_cost)[cp.unit]
    step = fill_cells(cp.step, piece_cost, cp.pinned)
    # The first piece of every unit: a whole unit's only one, a sharded unit's CP rank 0.
    first = np.unique(cp.unit, return_index=True)[1]
    return StepPlan(
        lengths=raw,
        padded=padded,
        units=raw,
        rank=step.rank[first][unit_of],
        micro=step.micro[first][unit_of],
        row=step.row[first][unit_of],
        num_micro=step.num_micro,
        micro_costs=step.cells,
        speeds=speed,
        packing=packing,
        bound=max(float(doc_costs.sum()) / float(speed.sum()), piece_cost.max() / speed.max()),
        sharded=cp.sharded[unit_of],
    )


def _group_units(groups: Any, n: int) -> np.ndarray:
    """Unit index per document: groups numbered by first appearance in the batch."""
    ids = np.asarray(groups)
    if ids.shape != (n,) or not (np.issubdtype(ids.dtype, np.integer) and ids.dtype != np.bool_):
        raise TypeError(
            f"groups must be {n} integer group ids (one per document), got "
            f"shape {ids.shape}, dtype {ids.dtype}"
        )
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    renumber = np.empty(first.shape[0], np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    return renumber[inverse.reshape(-1)]


def _loss_units(packing: Packing, lengths: np.ndarray, loss_tokens: Any) -> np.ndarray:
    """What each document counts in the loss normaliser, by ``packing.loss``."""
    if packing.loss == "loss_token":
        if loss_tokens is None:
            raise ValueError(
                "Packing(loss='loss_token') normalises by the tokens that carry loss: pass "
                "loss_tokens= (their count per document)"
            )
        counted = _integers("loss_tokens", loss_tokens, lengths.shape[0], " (per document)")
        if np.any(counted > lengths):
            raise ValueError("loss_tokens must be <= lengths, document by document")
        return counted
    if loss_tokens is not None:
        raise ValueError(
            f"loss_tokens= is used by Packing(loss='loss_token'); loss={packing.loss!r} "
            "ignores it: drop it or set loss='loss_token'"
        )
    return lengths if packing.loss == "token" else np.ones_like(lengths)
