"""Online calibration of a packed job's cost model and rank speeds from measured times.

A rank's compute time for a packed step is modelled as ``s_r · (a·n + b·ΣL + c·ΣL²)``: its
documents (pieces) ``n``, their tokens ``ΣL`` and squared tokens ``ΣL²`` under one cost
model shared by every rank, times the rank's own slowness ``s_r``. ``CostCalibration``
keeps the last ``history`` reports of every rank and fits both by alternating least
squares: the coefficients by non-negative least squares on times divided by slowness
(``CostModel.fit``), then each slowness as the median ratio of measured to predicted time,
scaled so that the slowness of the ranks with reports averages 1. Until enough reports with
varied work arrive, the prior model and equal speeds stand.
"""

from __future__ import annotations

import math

import numpy as np

from chronica.core.checks import check_int
from chronica.core.cost import CostModel

__all__ = ["CostCalibration"]

# Alternating rounds, at most: they stop once no rank's slowness moves by _SETTLED.
_ROUNDS = 50
_SETTLED = 1e-6


class CostCalibration:
    """Fits ``a, b, c`` (shared) and every rank's speed from ``observe``-d reports.

    Guarantees: ``model()`` is the prior until at least ``min_reports`` reports in all were
    taken and they determine a non-zero model, then the fitted one (in seconds); ``speeds()``
    are positive, one per rank, 1 for ranks without reports (the median of the others once
    some have reports) and proportional to ``1 / s_r`` otherwise. Non-finite or negative
    reports are ignored. ``prior`` of another type than ``CostModel`` raises ``TypeError``.

    Args:
        num_ranks: the ranks reporting, ``>= 1``.
        prior: the cost model planned with until the reports determine one.
        history: reports kept per rank, ``>= 2``.
        min_reports: reports (all ranks together) before the first fit, ``>= 1``.

    Example::

        >>> calibration = CostCalibration(2, CostModel.linear(), min_reports=2)
        >>> for rank, slowness in ((0, 1.0), (1, 2.0)):
        ...     for tokens in (100.0, 300.0):
        ...         calibration.observe(rank, np.array([1.0, tokens, 0.0]), slowness * tokens)
        >>> [round(float(s), 3) for s in calibration.speeds()]
        [1.5, 0.75]
        >>> calibration  # doctest: +ELLIPSIS
        CostCalibration(num_ranks=2, prior=CostModel(...), history=48, min_reports=2)
    """

    def __init__(
        self, num_ranks: int, prior: CostModel, history: int = 48, min_reports: int = 8
    ) -> None:
        self.num_ranks = check_int("num_ranks", num_ranks, 1)
        if not isinstance(prior, CostModel):
            raise TypeError(f"prior={prior!r} must be a chronica.core.CostModel")
        self.prior = prior
        self.history = check_int("history", history, 2)
        self.min_reports = check_int("min_reports", min_reports, 1)
        self._features = np.zeros((self.num_ranks, self.history, 3))
        self._seconds = np.zeros((self.num_ranks, self.history))
        self._count = np.zeros(self.num_ranks, np.int64)
        self._model = prior
        self._slowness = np.ones(self.num_ranks)
        self._stale = False

    def observe(self, rank: int, features: np.ndarray, seconds: float) -> None:
        """Rank ``rank`` computed work of ``features`` ``(n, ΣL, ΣL²)`` in ``seconds``.

        Args:
            rank: the reporting rank.
            features: documents, summed tokens and summed squared tokens of the work.
            seconds: the time it took (``> 0``; other reports are ignored).
        """
        values = np.asarray(features, dtype=np.float64)
        if values.shape != (3,) or not (np.isfinite(values).all() and math.isfinite(seconds)):
            return
        if (values < 0).any() or seconds <= 0 or not values.any():
            return
        n = int(self._count[rank])
        if n == self.history:
            self._features[rank, :-1] = self._features[rank, 1:]
            self._seconds[rank, :-1] = self._seconds[rank, 1:]
            n -= 1
        self._features[rank, n] = values
        self._seconds[rank, n] = seconds
        self._count[rank] = n + 1
        self._stale = True

    def __repr__(self) -> str:
        """The configuration: ranks, prior, history and the reports before a first fit."""
        return (
            f"CostCalibration(num_ranks={self.num_ranks}, prior={self.prior!r}, "
            f"history={self.history}, min_reports={self.min_reports})"
        )

    def model(self) -> CostModel:
        """The cost model to plan with: fitted (seconds) once the reports allow, else the prior."""
        self._refit()
        return self._model

    def speeds(self) -> np.ndarray:
        """Every rank's relative speed (``1 / s_r``)."""
        self._refit()
        return 1.0 / self._slowness

    def _refit(self) -> None:
        if not self._stale:
            return
        self._stale = False
        if int(self._count.sum()) < self.min_reports:
            return
        ranks = np.repeat(np.arange(self.num_ranks), self._count)
        features = np.concatenate([self._features[r, :c] for r, c in enumerate(self._count)])
        seconds = np.concatenate([self._seconds[r, :c] for r, c in enumerate(self._count)])
        slowness = np.ones(self.num_ranks)
        reported = self._count > 0
        for _ in range(_ROUNDS):
            try:
                model = CostModel.fit(*_columns(features), seconds / slowness[ranks])
            except ValueError:
                return  # the reports do not determine a model yet: keep the last one
            predicted = features @ np.array(model.to_tuple())
            ratio = seconds / np.maximum(predicted, 1e-300)
            before = slowness.copy()
            for r in np.flatnonzero(reported):
                slowness[r] = float(np.median(ratio[ranks == r]))
            slowness[reported] /= float(slowness[reported].mean())
            slowness[~reported] = float(np.median(slowness[reported]))
            if np.abs(slowness - before).max() < _SETTLED:
                break
        self._model = CostModel.fit(*_columns(features), seconds / slowness[ranks])
        self._slowness = slowness


def _columns(features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces, tokens and squared tokens of every report."""
    return features[:, 0], features[:, 1], features[:, 2]
