"""Measured micro-batches against the cost model: the features of a micro-batch, the fit of
``overhead + a·n + b·ΣL + c·ΣL²`` to measured seconds, and a plan's predicted times.

Shared by the benchmarks that time planned micro-batches (``fsdp_micro`` on CPU, the GPU
scripts): the same rows, the same fit and the same aggregation on both sides of every
predicted-versus-measured figure.

A *layout* is one global batch's micro-batches per rank, ``layout[r][k]`` the document indices
of rank ``r``'s micro-batch ``k``; a *times* array is ``(ranks, micro-batches)`` seconds (the
ranks of a lockstep layout run equally many). The lockstep step is ``Σₖ maxᵣ t[r, k]``
(FSDP, ZeRO-3, experts), the rank step ``maxᵣ Σₖ t[r, k]`` (DDP).

A measured time is its prediction times ``1 + e``, ``e`` a noise no model removes (the
repeats' median still moves with the machine). The max over ranks lifts it: the expected
lockstep step is ``Σₖ E[maxᵣ p[r, k]·(1 + eᵣ)]``, above ``Σₖ maxᵣ p[r, k]`` the more the
ranks' micro-batches are equal (for two equal ones by ``E|e₀ - e₁| / 2``). ``noisy_lockstep``
predicts that figure from the errors the fit makes on its own calibration micro-batches
(``relative_errors``).

Example::

    >>> import numpy as np
    >>> from chronica import CostModel
    >>> lengths = np.array([10, 20, 30])
    >>> layout = [[np.array([0, 1])], [np.array([2])]]
    >>> rows = features(layout, lengths)
    >>> rows.tolist()
    [[2.0, 30.0, 500.0], [1.0, 30.0, 900.0]]
    >>> times = predicted(layout, lengths, 1.0, CostModel(0.0, 1.0, 0.0))
    >>> times.tolist(), lockstep(times), rank_step(times)
    ([[31.0], [31.0]], 31.0, 31.0)
    >>> errors = relative_errors([np.array([[34.1], [27.9]])], [times])
    >>> errors.round(6).tolist(), round(noisy_lockstep(times, errors), 6)
    ([[0.1, -0.1]], 34.1)
"""

from __future__ import annotations

import numpy as np

from chronica import CostModel

Layout = list[list[np.ndarray]]


def features(layout: Layout, lengths: np.ndarray) -> np.ndarray:
    """``(micro-batches, 3)`` rows ``(documents, tokens, squared tokens)`` of every
    micro-batch of ``layout``, rank by rank, in execution order.

    Args:
        layout: micro-batches per rank (document indices into ``lengths``).
        lengths: the global batch's token counts.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    rows = [
        [len(docs), lengths[docs].sum(), (lengths[docs] ** 2).sum()]
        for rank in layout
        for docs in (np.asarray(d, dtype=np.int64) for d in rank)
    ]
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def fit(rows: np.ndarray) -> tuple[float, CostModel]:
    """``(overhead, model)`` from measured rows ``(documents, tokens, squares, seconds)``:
    the non-negative least-squares fit of ``overhead + a·documents + b·tokens + c·squares``
    to the seconds (absolute errors, as the summed step figures weigh them), the fixed cost
    per micro-batch apart from ``chronica.CostModel(a, b, c)``. ``ValueError`` when the rows
    fit no positive per-document cost.

    Args:
        rows: ``(n, 4)`` measurements, one per micro-batch.

    Example::

        >>> rows = np.array(
        ...     [[1, 10, 100, 3.1], [2, 30, 500, 6.5], [1, 40, 1600, 7.6], [3, 90, 2700, 15.7]]
        ... )
        >>> overhead, model = fit(rows)
        >>> round(overhead, 6), [round(x, 6) for x in model.to_tuple()]
        (1.0, [1.0, 0.1, 0.001])
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != 4 or rows.shape[0] == 0:
        raise ValueError(
            f"rows must be (n, 4): documents, tokens, squares, seconds (got {rows.shape})"
        )
    design = np.column_stack([np.ones(len(rows)), rows[:, :3]])
    coefficients = _nonnegative_least_squares(design, rows[:, 3])
    if not coefficients[1:].any():
        raise ValueError(
            "the rows fit no positive per-document cost; measure more varied micro-batches"
        )
    overhead, a, b, c = (float(x) for x in coefficients)
    return overhead, CostModel(a, b, c)


def predicted(layout: Layout, lengths: np.ndarray, overhead: float, model: CostModel) -> np.ndarray:
    """``(ranks, micro-batches)`` predicted seconds of every micro-batch of ``layout``:
    ``overhead`` plus the model's cost of its documents.

    Args:
        layout: micro-batches per rank (equally many on every rank).
        lengths: the global batch's token counts.
        overhead: the fixed seconds of a micro-batch.
        model: the per-document cost.
    """
    costs = model(np.asarray(lengths, dtype=np.float64))
    return np.array(
        [[overhead + costs[np.asarray(d, dtype=np.int64)].sum() for d in rank] for rank in layout]
    )


def lockstep(times: np.ndarray) -> float:
    """``Σₖ maxᵣ times[r, k]``: the step when micro-batch ``k`` of every rank runs together.

    Args:
        times: ``(ranks, micro-batches)`` seconds.
    """
    return float(np.asarray(times).max(axis=0).sum())


def rank_step(times: np.ndarray) -> float:
    """``maxᵣ Σₖ times[r, k]``: the step when ranks meet once, after their last micro-batch.

    Args:
        times: ``(ranks, micro-batches)`` seconds.
    """
    return float(np.asarray(times).sum(axis=1).max())


def relative_errors(measured: list[np.ndarray], predicted: list[np.ndarray]) -> np.ndarray:
    """``(micro-batches, ranks)`` relative errors ``measured / predicted - 1``: one row per
    lockstep micro-batch, rank ``r``'s error in column ``r`` (the ranks' errors on the
    micro-batch they ran together, their correlation kept), for ``noisy_lockstep``.

    Args:
        measured: per global batch, ``(ranks, micro-batches)`` measured seconds.
        predicted: the same batches' predicted seconds, in the same shapes.

    Example::

        >>> relative_errors([np.array([[1.1, 2.0], [0.9, 2.2]])], [np.ones((2, 2)) * [[1], [2]]])
        array([[ 0.1 , -0.55],
               [ 1.  ,  0.1 ]])
    """
    if len(measured) != len(predicted):
        raise ValueError(
            f"measured and predicted must hold the same batches ({len(measured)} and "
            f"{len(predicted)})"
        )
    rows = []
    for m, p in zip(measured, predicted, strict=True):
        m, p = np.asarray(m, dtype=np.float64), np.asarray(p, dtype=np.float64)
        if m.shape != p.shape or m.ndim != 2:
            raise ValueError(
                f"a batch's measured and predicted times must be the same (ranks, "
                f"micro-batches) shape (got {m.shape} and {p.shape})"
            )
        rows.append((m / p - 1).T)
    return np.concatenate(rows) if rows else np.zeros((0, 0))


def noisy_lockstep(times: np.ndarray, errors: np.ndarray) -> float:
    """``Σₖ E[maxᵣ times[r, k]·(1 + eᵣ)]``: the lockstep step that times measured with the
    noise of ``errors`` are expected to add up to, exactly over the errors' empirical
    distribution (no sampling). Equals ``lockstep(times)`` when every error is zero.

    Args:
        times: ``(ranks, micro-batches)`` predicted seconds.
        errors: ``(n, ranks)``: ``n`` joint draws of the ranks' relative errors (rows of
            ``relative_errors``); or ``(n,)``: draws that each rank takes independently
            (micro-batches timed apart from each other, as one device playing every rank).

    Example::

        >>> times = np.array([[1.0, 2.0], [1.0, 1.0]])
        >>> round(noisy_lockstep(times, np.array([[0.1, -0.1], [-0.1, 0.1]])), 6)
        3.1
        >>> round(noisy_lockstep(times, np.array([0.1, -0.1])), 6)  # independent draws
        3.05
    """
    times = np.asarray(times, dtype=np.float64)
    errors = np.asarray(errors, dtype=np.float64)
    if times.ndim != 2:
        raise ValueError(f"times must be (ranks, micro-batches) (got {times.shape})")
    if errors.ndim == 2 and errors.shape[1] == times.shape[0] and len(errors):
        # (ranks, micro-batches, draws): every draw's max over ranks, averaged.
        noisy = times[:, :, None] * (1 + errors.T[:, None, :])
        return float(noisy.max(axis=0).mean(axis=1).sum())
    if errors.ndim == 1 and len(errors):
        return float(sum(_expected_max(column, errors) for column in times.T))
    raise ValueError(
        f"errors must be (n, {times.shape[0]}) joint draws or (n,) independent ones, n > 0 "
        f"(got {errors.shape})"
    )


def _expected_max(times: np.ndarray, errors: np.ndarray) -> float:
    """``E[maxᵣ times[r]·(1 + eᵣ)]``, each ``eᵣ`` drawn independently from ``errors``: the
    max's distribution is the product of the ranks' distributions, evaluated at every value
    one of them takes."""
    spread = np.sort(1 + errors)
    values = np.sort(np.outer(times, spread).ravel())
    below = np.ones(len(values))
    for t in times:  # the share of rank r's draws at or below every value
        below *= np.searchsorted(t * spread, values, side="right") / len(spread)
    return float(values @ np.diff(below, prepend=0.0))


def _nonnegative_least_squares(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``argmin |design·x - target|`` over ``x >= 0``, exact for a handful of columns: the
    best unconstrained fit among the column subsets whose solution is non-negative (columns
    scaled to unit norm, so seconds per token and per squared token weigh alike)."""
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    scaled = design / scale
    best, best_error = np.zeros(design.shape[1]), float(target @ target)
    for mask in range(1, 1 << design.shape[1]):
        columns = [j for j in range(design.shape[1]) if mask >> j & 1]
        solution = np.linalg.lstsq(scaled[:, columns], target, rcond=None)[0]
        if (solution < 0).any():
            continue
        error = float(np.sum((scaled[:, columns] @ solution - target) ** 2))
        if error < best_error:
            best, best_error = np.zeros(design.shape[1]), error
            best[columns] = solution
    return best / scale
