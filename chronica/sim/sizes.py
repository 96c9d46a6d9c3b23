"""Sample sizes for a simulation: drawn from a named distribution or read from a file.

Files are read by ``chronica.sizes_io`` (shared with ``chronica coordinator``). Every function
returns a read-only float64 vector validated by ``chronica.core.sizes``
(finite, non-negative, one-dimensional), so the simulator plans exactly what the real
scheduler would be given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chronica import sizes_io
from chronica.core.checks import is_int
from chronica.core.sizes import validate_sizes

__all__ = ["DISTRIBUTIONS", "SizeDistribution", "read_sizes", "resample"]

# Spread (lognormal sigma) of each mode of ``bimodal``.
_MODE_SIGMA = 0.25

Params = tuple[float, ...]


def _positive_sigma(params: Params) -> str | None:
    return "SIGMA must be > 0" if params[1] <= 0 else None


def _ordered_range(params: Params) -> str | None:
    return None if 1 <= params[0] <= params[1] else "need 1 <= the first <= the second"


def _ordered_range_and_fraction(params: Params) -> str | None:
    if problem := _ordered_range(params):
        return problem
    return None if 0 <= params[2] <= 1 else "FRACTION must be in [0, 1]"


def _lognormal(rng: np.random.Generator, params: Params, n: int) -> np.ndarray:
    mu, sigma = params
    return rng.lognormal(mu, sigma, n)


def _uniform(rng: np.random.Generator, params: Params, n: int) -> np.ndarray:
    low, high = params
    return rng.integers(int(low), int(high) + 1, n).astype(np.float64)


def _bimodal(rng: np.random.Generator, params: Params, n: int) -> np.ndarray:
    short, long, fraction = params
    centre = np.where(rng.random(n) < fraction, long, short)
    return centre * rng.lognormal(0.0, _MODE_SIGMA, n)


@dataclass(frozen=True)
class _Family:
    """One named family of distributions: its default parameters, the check of a choice of
    parameters (the problem, or ``None``) and its sampler (raw, unrounded sizes)."""

    defaults: Params
    problem: Callable[[Params], str | None]
    sample: Callable[[np.random.Generator, Params, int], np.ndarray]


_FAMILIES = {
    "lognormal": _Family((5.0, 1.0), _positive_sigma, _lognormal),
    "uniform": _Family((16.0, 512.0), _ordered_range, _uniform),
    "bimodal": _Family((64.0, 2048.0, 0.1), _ordered_range_and_fraction, _bimodal),
}
DISTRIBUTIONS = tuple(_FAMILIES)


@dataclass(frozen=True)
class SizeDistribution:
    """A seeded distribution of integer sizes (token counts, at least 1).

    ``lognormal:MU:SIGMA``: ``exp(N(MU, SIGMA))`` (default 5, 1: median ~148, heavy tail);
    ``uniform:LOW:HIGH``: integers uniform in ``[LOW, HIGH]`` (default 16, 512);
    ``bimodal:SHORT:LONG:FRACTION``: a fraction of long samples around LONG, the rest short
    around SHORT, each mode lognormal with sigma 0.25 (default 64, 2048, 0.1).
    ``params`` left out take those defaults. Guarantees: ``draw(n, seed)`` is
    deterministic and returns ``n`` validated sizes >= 1.

    Args:
        family: one of ``DISTRIBUTIONS``.
        params: the family's parameters, in the order above; missing ones take the defaults.

    Example::

        >>> SizeDistribution("uniform", (8,)).describe()
        'uniform:8:512'
        >>> SizeDistribution.parse("lognormal:5:1").draw(3, seed=0).shape
        (3,)
    """

    family: str = "lognormal"
    params: Params = ()

    def __post_init__(self) -> None:
        if self.family not in _FAMILIES:
            raise ValueError(
                f"--dist {self.family!r} is not one of {DISTRIBUTIONS}; e.g. --dist lognormal:5:1"
            )
        defaults = _FAMILIES[self.family].defaults
        if len(self.params) > len(defaults):
            raise ValueError(f"--dist {self.family} takes at most {len(defaults)} parameters")
        params = tuple(float(p) for p in self.params) + defaults[len(self.params) :]
        object.__setattr__(self, "params", params)
        if not all(math.isfinite(p) for p in params):
            raise ValueError(f"--dist {self.describe()}: parameters must be finite numbers")
        if problem := _FAMILIES[self.family].problem(params):
            raise ValueError(f"--dist {self.describe()}: {problem}")

    @classmethod
    def parse(cls, text: str) -> SizeDistribution:
        """From ``family[:a[:b[:c]]]``, e.g. ``lognormal:5:1``, ``uniform:16:512``,
        ``bimodal:64:2048:0.1``."""
        family, *numbers = text.strip().split(":")
        try:
            params = tuple(float(x) for x in numbers)
        except ValueError:
            raise ValueError(
                f"--dist {text!r}: parameters must be numbers, e.g. lognormal:5:1, "
                f"uniform:16:512 or bimodal:64:2048:0.1"
            ) from None
        return cls(family, params)

    def describe(self) -> str:
        """``family:a:b[:c]``, the text ``parse`` reads back."""
        return ":".join([self.family, *(f"{p:g}" for p in self.params)])

    def draw(self, n: int, seed: int) -> np.ndarray:
        """``n`` sizes drawn with ``numpy.random.default_rng([seed, 0x5153])``."""
        if not is_int(n) or n < 1:
            raise ValueError(f"--samples {n!r} must be an int >= 1")
        rng = np.random.default_rng([seed, 0x5153])
        raw = _FAMILIES[self.family].sample(rng, self.params, int(n))
        return validate_sizes(np.maximum(1.0, np.rint(raw)), name=f"--dist {self.describe()}")


def read_sizes(path: str | Path, column: str | None = None) -> np.ndarray:
    """Sizes from a file, read by ``chronica.sizes_io.read_sizes`` (the reader ``chronica
    coordinator --sizes`` uses too): text, ``.npy``, a ``.csv`` or ``.parquet`` column.

    Guarantees: the result is validated (finite, non-negative, at least one entry); every
    failure is a ``ValueError`` naming ``--sizes``/``--column`` and what to change.
    """
    return validate_sizes(sizes_io.read_sizes(path, column), name=sizes_io.describe(path, column))


def resample(sizes: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` sizes drawn with replacement from ``sizes`` (seeded): a larger data set with
    the same size distribution. ``n == len(sizes)`` returns ``sizes`` unchanged."""
    if not is_int(n) or n < 1:
        raise ValueError(f"--samples {n!r} must be an int >= 1")
    if n == sizes.shape[0]:
        return sizes
    rng = np.random.default_rng([seed, 0x5253])
    return validate_sizes(sizes[rng.integers(0, sizes.shape[0], int(n))], name="--samples")
