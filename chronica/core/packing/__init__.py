"""Token budgets and packing: each rank's share of a step as micro-batches under a token cap.

A *document* is a sample whose size is its length in tokens. With ``Packing`` a step's
documents are cut into the same number of micro-batches on every rank (gradient
accumulation), each holding at most ``max_tokens`` tokens in rows of ``row_length``. The
package's rooms, each one job:

``options``   ``Packing``: the cap, the rows, the budget, what long documents and the loss do;
``documents`` ``Pieces``/``pieces``: the sequences documents are trained as (split, truncated);
``kernels``   the numba kernels: LPT under row capacities, refinement by moves and trades;
``step``      ``pack_step``/``PackedStep``: one step for its ranks, the fewest micro-batches
              (``fill_empty``: no empty rank or micro-batch where units allow);
``lockstep``  the numba kernel of ``balance="micro"``: cells of (rank, micro-batch) in lockstep;
``ladder``    the cells kept sorted by cost for it (find, climb, sink one cell);
``lockstep_relief``  the pass after its greedy: one-for-one swaps that lower a micro-batch's
              slowest cell without raising another above its own;
``weights``   ``micro_weights``: loss normalisation per micro-batch;
``epoch``     ``step_starts``, ``pack_epoch``, ``pack_steps``: steps cut from owners' streams
              and assembled into the arrays of a packed ``EpochPlan``;
``planner``   ``plan_step``/``StepPlan``: one in-memory global batch planned in one call
              (groups kept whole, loss weights, ``cu_seqlens``), for trainers;
``outliers``  ``OutlierDelay``/``OutlierQueue``: documents heavier than a share of their
              step's fair share moved to later steps of the epoch (bounded delay and queue);
``context_parallel``  ``context_layout``: one micro-batch over a context-parallel group,
              sharded documents in head-tail chunks (equal causal work per rank);
``context_step``, ``context_kernels``  ``plan_step`` under ``Packing(context_parallel=g)``:
              which documents to shard over a group, and the whole ones packed around them.

Loss normalisation: ``micro_weights`` gives each micro-batch the factor that turns its mean
loss (per token or per document) into its share of the global batch's mean, so that summing
the micro-batches' gradients and averaging over ranks gives the global-mean gradient.

Example::

    >>> import numpy as np
    >>> from chronica.core.packing import Packing, pack_step
    >>> step = pack_step(np.array([300, 200, 200, 100]), np.array([3.0, 2.0, 2.0, 1.0]), 2,
    ...                  Packing(max_tokens=400))
    >>> step.loads.tolist()
    [4.0, 4.0]
"""

from chronica.core.packing.documents import Pieces, pieces
from chronica.core.packing.epoch import PackedEpoch, pack_epoch, pack_steps, step_starts
from chronica.core.packing.options import BALANCES, LONG_DOCUMENTS, LOSS_NORMALISATIONS, Packing
from chronica.core.packing.planner import StepPlan, plan_step
from chronica.core.packing.step import PackedStep, fill_empty, in_pipeline_order, pack_step
from chronica.core.packing.weights import micro_weights

__all__ = [
    "BALANCES",
    "LONG_DOCUMENTS",
    "LOSS_NORMALISATIONS",
    "PackedEpoch",
    "PackedStep",
    "Packing",
    "Pieces",
    "StepPlan",
    "fill_empty",
    "in_pipeline_order",
    "micro_weights",
    "pack_epoch",
    "pack_step",
    "pack_steps",
    "pieces",
    "plan_step",
    "step_starts",
]
