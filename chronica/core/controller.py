"""Feedback control: per-rank time models and heterogeneity-aware local batch sizes.

Every rank reports its own compute time for a step (forward and backward, before the gradient
all-reduce) together with that step's load (the predicted cost of its samples). From these,
``RankTimeModel`` fits ``t_r = alpha_r + beta_r · load`` per rank, and ``BatchController``
turns the fits into per-rank sample counts whose predicted times are equal:

* the fit is a weighted least-squares line over the rank's recent reports, older reports
  weighing ``memory`` times less per newer one; a few Huber re-weighting passes tame outliers
  (a step that hit a page fault or a garbage collection); a run of reports that all miss the
  fit on the same side by far is a change of speed, and the older history is dropped;
* ``water_fill`` finds counts ``n_r`` with ``Σ n_r`` equal to the global batch *exactly*,
  every count within ``[low, high]``, equalising ``alpha_r + beta_r · unit · n_r``, rounded
  by largest remainder;
* ``BatchController`` re-evaluates every window of steps and adopts new counts only when
  their predicted step time is lower by more than ``hysteresis``, so it does not oscillate.

Everything here is deterministic: the same reports in the same order give the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import SupportsInt

import numpy as np
from numba import njit

from chronica.core.checks import check_int, check_number

__all__ = ["BatchController", "ControllerOptions", "RankTimeModel", "water_fill"]

# Re-weighting passes of the robust fit: an outlier pulls the first fit, and with it the
# residual scale, so one pass does not push it out.
_HUBER_ROUNDS = 4


@dataclass(frozen=True, repr=False)
class ControllerOptions:
    """Tuning of the feedback loop; the defaults suit steps of 10 ms to 10 s. Validated on
    construction: ``TypeError`` for a field of the wrong type, ``ValueError`` for a value out
    of range, both naming the field.

    Args:
        memory: weight ratio of a report to the next newer one, in ``(0, 1]`` (0.9: the last
            ~10 reports dominate).
        history: reports kept per rank, ``>= 2``.
        hysteresis: relative predicted gain needed before counts change, in ``[0, 1)``.
        change_run: that many newest reports all off the fit by more than ``change_error``,
            on the same side, mean the rank's speed changed (the older reports are then
            forgotten); an int in ``[1, history)``.
        change_error: the relative error of ``change_run``, ``> 0``.
        ridge: pull of the fixed cost ``alpha`` towards 0 while loads hardly vary (it cannot
            be told apart from ``beta``), ``>= 0``.

    Example::

        >>> ControllerOptions(memory=0.8, hysteresis=0.05)
        ControllerOptions(memory=0.8, hysteresis=0.05)
    """

    memory: float = 0.9
    history: int = 48
    hysteresis: float = 0.02
    change_run: int = 3
    change_error: float = 0.15
    ridge: float = 0.01

    def __post_init__(self) -> None:
        # Checked, never rewritten: the fields are part of the configuration digest.
        memory = check_number("memory", self.memory, 0.0, 1.0)
        if memory == 0:
            raise ValueError(f"memory={self.memory!r} must be in (0, 1]")
        check_int("history", self.history, 2)
        hysteresis = check_number("hysteresis", self.hysteresis, 0.0, 1.0)
        if hysteresis == 1:
            raise ValueError(f"hysteresis={self.hysteresis!r} must be in [0, 1)")
        check_int("change_run", self.change_run, 1, self.history - 1, hint=" ([1, history))")
        if not check_number("change_error", self.change_error, 0.0) > 0:
            raise ValueError(f"change_error={self.change_error!r} must be > 0")
        check_number("ridge", self.ridge, 0.0)

    def __repr__(self) -> str:
        """The fields that differ from their defaults, as a call."""
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"ControllerOptions({', '.join(shown)})"


class RankTimeModel:
    """Per-rank ``t = alpha + beta · load`` fitted from reports, robust and forgetting.

    ``params()`` returns ``(alpha, beta)`` for every rank: ``alpha >= 0``, ``beta > 0``.
    A rank without reports borrows the median fit of the ranks with reports; with no
    reports at all every rank is ``(0, 1)``, i.e. time equals load, which makes dynamic
    plans equal to static ones.

    Args:
        num_ranks: the ranks modelled.
        options: the feedback loop's tuning (default ``ControllerOptions()``).

    Example::

        >>> model = RankTimeModel(2)
        >>> for load in (10.0, 20.0, 30.0):
        ...     model.observe(0, load, 0.5 + 0.1 * load)
        >>> alpha, beta = model.params()
        >>> round(float(beta[0]), 2), round(float(beta[1]), 2)  # rank 1 borrows rank 0's
        (0.1, 0.1)
    """

    def __init__(self, num_ranks: int, options: ControllerOptions | None = None) -> None:
        self.num_ranks = int(num_ranks)
        self.options = options or ControllerOptions()
        size = self.options.history
        self._loads = np.zeros((self.num_ranks, size))
        self._times = np.zeros((self.num_ranks, size))
        self._count = np.zeros(self.num_ranks, np.int64)  # reports kept, newest last
        self._fit = np.zeros((self.num_ranks, 2))
        self._fitted = np.zeros(self.num_ranks, bool)

    def observe(self, rank: int, load: float, seconds: float) -> None:
        """Add rank ``rank``'s report: ``seconds`` of compute for a step of ``load``.

        Reports with a non-finite or negative value are ignored (a clock hiccup must not
        poison the fit); the caller validates ranges of untrusted input before this.

        Args:
            rank: the reporting rank.
            load: the step's predicted load on that rank.
            seconds: the rank's measured compute time of the step.
        """
        if not (math.isfinite(load) and math.isfinite(seconds)) or load < 0 or seconds < 0:
            return
        size = self.options.history
        n = int(self._count[rank])
        if n == size:
            self._loads[rank, :-1] = self._loads[rank, 1:]
            self._times[rank, :-1] = self._times[rank, 1:]
            n -= 1
        self._loads[rank, n] = load
        self._times[rank, n] = seconds
        self._count[rank] = n + 1
        self._refit(rank)

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """``(alpha, beta)``, one entry per rank."""
        alpha = self._fit[:, 0].copy()
        beta = self._fit[:, 1].copy()
        if not self._fitted.any():
            return np.zeros(self.num_ranks), np.ones(self.num_ranks)
        missing = ~self._fitted
        alpha[missing] = np.median(alpha[self._fitted])
        beta[missing] = np.median(beta[self._fitted])
        return alpha, beta

    def reports(self, rank: int) -> int:
        """How many reports of ``rank`` the fit currently uses.

        Args:
            rank: the rank.
        """
        return int(self._count[rank])

    def _refit(self, rank: int) -> None:
        opts = self.options
        n = int(self._count[rank])
        loads, times = self._loads[rank, :n], self._times[rank, :n]
        ok, alpha, beta = _robust_line(loads, times, opts.memory, opts.ridge, _HUBER_ROUNDS)
        if not ok:
            return
        run = opts.change_run
        if n > run and _changed(loads[-run:], times[-run:], alpha, beta, opts.change_error):
            # The rank changed speed: keep only the reports since the change.
            self._loads[rank, :run] = loads[-run:]
            self._times[rank, :run] = times[-run:]
            self._count[rank] = run
            self._refit(rank)
            return
        self._fit[rank] = alpha, beta
        self._fitted[rank] = True


@njit(cache=True)
def _changed(loads: np.ndarray, times: np.ndarray, alpha: float, beta: float, error: float) -> bool:
    """Whether every report is off the line ``alpha + beta·load`` by more than ``error``
    (relative), all on the same side."""
    above = below = True
    for i in range(loads.shape[0]):
        predicted = alpha + beta * loads[i]
        off = (times[i] - predicted) / max(predicted, 1e-300)
        above = above and off > error
        below = below and off < -error
    return above or below


@njit(cache=True)
def _weighted_line(
    loads: np.ndarray, times: np.ndarray, weights: np.ndarray, ridge: float
) -> tuple[bool, float, float]:
    """Weighted least squares ``t = alpha + beta·load`` with ``alpha`` shrunk towards 0;
    falls back to ``t = beta·load`` when the line would have ``alpha < 0`` or ``beta <= 0``.
    ``(False, 0, 0)`` when neither fits."""
    sw = sl = sll = st = slt = 0.0
    for i in range(loads.shape[0]):
        w, x, t = weights[i], loads[i], times[i]
        sw += w
        sl += w * x
        sll += w * x * x
        st += w * t
        slt += w * x * t
    if sll <= 0 or sw <= 0:
        return False, 0.0, 0.0
    # Relative to the total weight, the ridge outweighs the data on alpha only while the
    # loads' spread is small; then alpha goes to 0 and beta to the mean time per load.
    lam = ridge * sw
    det = (sw + lam) * sll - sl * sl
    if det > 0:
        alpha = (st * sll - sl * slt) / det
        beta = ((sw + lam) * slt - sl * st) / det
        if alpha >= 0 and beta > 0:
            return True, alpha, beta
    beta = slt / sll
    if beta > 0:
        return True, 0.0, beta
    return False, 0.0, 0.0


@njit(cache=True)
def _robust_line(
    loads: np.ndarray, times: np.ndarray, memory: float, ridge: float, rounds: int
) -> tuple[bool, float, float]:
    """``_weighted_line`` with weights ``memory ** age`` (newest report last, age 0), then
    ``rounds`` Huber re-weightings (residuals beyond 2.5 robust scales count less)."""
    n = loads.shape[0]
    weights = np.empty(n)
    for i in range(n):
        weights[i] = memory ** (n - 1 - i)
    ok, alpha, beta = _weighted_line(loads, times, weights, ridge)
    if not ok:
        return False, 0.0, 0.0
    residual = np.empty(n)
    robust = np.empty(n)
    for _ in range(rounds):
        for i in range(n):
            residual[i] = abs(times[i] - (alpha + beta * loads[i]))
        scale = 1.4826 * np.median(residual)
        if scale <= 0:
            break
        for i in range(n):
            robust[i] = weights[i] * min(1.0, 2.5 * scale / max(residual[i], 1e-300))
        refit, a, b = _weighted_line(loads, times, robust, ridge)
        if refit:
            alpha, beta = a, b
    return True, alpha, beta


def water_fill(
    total: int,
    alpha: np.ndarray,
    beta: np.ndarray,
    unit: float,
    low: int,
    high: int,
) -> np.ndarray:
    """Integer counts ``n`` with ``n.sum() == total`` and ``low <= n <= high`` that equalise
    the predicted times ``alpha + beta · unit · n`` as far as the bounds allow.

    The real-valued solution fills every rank up to a common time level (clipped to the
    bounds); the integer counts are its floors plus one for the ranks with the largest
    fractional parts (ties: lower rank).

    Args:
        total: samples to split.
        alpha: fixed time per rank.
        beta: time per unit of load per rank.
        unit: load of one sample.
        low: the fewest samples of a rank.
        high: the most samples of a rank.

    Example::

        >>> water_fill(12, np.zeros(2), np.array([1.0, 2.0]), 1.0, 1, 12).tolist()
        [8, 4]
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    w = alpha.shape[0]
    if not (w * low <= total <= w * high):
        raise ValueError(
            f"{total} samples cannot be split over {w} ranks with {low} to {high} each"
        )
    rate = beta * max(unit, 1e-300)
    if not (np.isfinite(alpha).all() and np.isfinite(rate).all() and (rate > 0).all()):
        raise ValueError("alpha must be finite and beta · unit finite and > 0 for every rank")

    def filled(level: float) -> np.ndarray:
        return np.clip((level - alpha) / rate, low, high)

    lo = float((alpha + rate * low).min())
    hi = float((alpha + rate * high).max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        settled = mid in (lo, hi)
        if filled(mid).sum() < total:
            lo = mid
        else:
            hi = mid
        # lo and hi are neighbouring floats: every later step would repeat this one, so
        # stopping here gives the 200 steps' result (bit for bit) in about 60.
        if settled:
            break
    return _round_to_total(filled(hi), total, low, high)


class BatchController:
    """Chooses every rank's local batch size for the next window of steps.

    ``counts(total, alpha, beta, unit)`` returns counts for a step of ``total`` samples
    split between this controller's ranks: the equal split until a heterogeneity-aware
    split predicts a step time lower by more than ``options.hysteresis``; then that split,
    kept until another one beats it by the same margin. Counts always add up to ``total``
    and stay within ``[low, high]`` (``low`` is relaxed for short trailing steps that
    cannot give every rank ``low`` samples).

    Args:
        num_ranks: the ranks sharing a step.
        low: the fewest samples of a rank.
        high: the most samples of a rank.
        options: the feedback loop's tuning (``hysteresis``).

    Example::

        >>> controller = BatchController(2, 1, 12)
        >>> controller.counts(12, np.zeros(2), np.array([1.0, 2.0]), 1.0).tolist()
        [8, 4]
    """

    def __init__(
        self, num_ranks: int, low: int, high: int, options: ControllerOptions | None = None
    ) -> None:
        self.num_ranks = int(num_ranks)
        self.low = int(low)
        self.high = int(high)
        self.options = options or ControllerOptions()
        self._shares: np.ndarray | None = None  # the adopted counts of a full step
        self._full = 0

    def counts(self, total: int, alpha: np.ndarray, beta: np.ndarray, unit: float) -> np.ndarray:
        """Every rank's count for a step of ``total`` samples (see the class docstring).

        Args:
            total: the step's samples.
            alpha: fixed time per rank.
            beta: time per unit of load per rank.
            unit: load of one sample.
        """
        w = self.num_ranks
        if self._shares is not None and total < self._full:
            # A short trailing step: the adopted shares, scaled down to ``total``.
            low = min(self.low, total // w)
            return _round_to_total(self._shares * (total / self._full), total, low, self.high)
        if self._shares is None or total != self._full:
            self._full = total
            self._shares = _round_to_total(np.full(w, total / w), total, self.low, self.high)
        candidate = water_fill(total, alpha, beta, unit, self.low, self.high)
        now = _predicted(self._shares, alpha, beta, unit)
        new = _predicted(candidate, alpha, beta, unit)
        if new < now * (1.0 - self.options.hysteresis):
            self._shares = candidate
        return self._shares.copy()

    def state_dict(self) -> dict[str, object]:
        """The adopted counts, to restore a restarted controller."""
        shares = None if self._shares is None else self._shares.tolist()
        return {"shares": shares, "full": self._full}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the adopted counts of ``state_dict``.

        Args:
            state: a ``state_dict()`` of a controller of as many ranks.
        """
        shares = state.get("shares")
        self._shares = None if shares is None else np.asarray(shares, dtype=np.int64)
        full = state.get("full", 0)
        if not isinstance(full, SupportsInt):
            raise TypeError(f"state['full'] must be an integer, not {type(full).__name__}")
        self._full = int(full)


def _predicted(counts: np.ndarray, alpha: np.ndarray, beta: np.ndarray, unit: float) -> float:
    return float((alpha + beta * unit * counts).max())


def _round_to_total(real: np.ndarray, total: int, low: int, high: int) -> np.ndarray:
    """Largest-remainder rounding of ``real`` to integers in ``[low, high]`` adding to
    ``total``."""
    # NaN (from a degenerate time model) must not reach the integer cast below.
    real = np.clip(np.nan_to_num(real, nan=float(low)), low, high)
    counts = np.floor(real).astype(np.int64)
    fraction = real - counts
    for rank in np.argsort(-fraction, kind="stable"):
        if counts.sum() >= total:
            break
        if counts[rank] < high:
            counts[rank] += 1
    while counts.sum() < total:  # every fraction used: spread what is left
        counts[np.argmin(counts)] += 1
    # With extreme speed ratios the real solution can overshoot by more than one per rank:
    # take back in passes, smallest fractions first, until the total is exact.
    while counts.sum() > total:
        for rank in np.argsort(fraction, kind="stable"):
            if counts.sum() <= total:
                break
            if counts[rank] > low:
                counts[rank] -= 1
    return counts
