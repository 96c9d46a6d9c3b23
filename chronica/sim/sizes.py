"""Sample sizes for a simulation: drawn from a named distribution or read from a file.

Files are read by ``chronica.sizes_io`` (shared with ``chronica coordinator``). Every function
returns a read-only float64 vector validated by ``chronica.core.sizes``
(finite, non-negative, one-dimensional), so the simulator plans exactly what the real
scheduler would be given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chronica import sizes_io
from chronica.core.checks import is_int
from chronica.core.sizes import validate_sizes

__all__ = ["DISTRIBUTIONS", "SizeDistribution", "read_sizes", "resample"]

DISTRIBUTIONS = ("lognormal", "uniform", "bimodal")
# Spread (lognormal sigma) of each mode of ``bimodal``.
_MODE_SIGMA = 0.25


_DEFAULTS = {
    "lognormal": (5.0, 1.0),
    "uniform": (16.0, 512.0),
    "bimodal": (64.0, 2048.0, 0.1),
}


@dataclass(frozen=True)
class SizeDistribution:
    """A seeded distribution of integer sizes (token counts, at least 1).

    ``lognormal:MU:SIGMA``: ``exp(N(MU, SIGMA))`` (default 5, 1: median ~148, heavy tail);
    ``uniform:LOW:HIGH``: integers uniform in ``[LOW, HIGH]`` (default 16, 512);
    ``bimodal:SHORT:LONG:FRACTION``: a fraction of long samples around LONG, the rest short
    around SHORT, each mode lognormal with sigma 0.25 (default 64, 2048, 0.1).
    ``params`` left out take those defaults. Guarantees: ``draw(n, seed)`` is
    deterministic and returns ``n`` validated sizes >= 1.
    """

    kind: str = "lognormal"
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ValueError(
                f"--dist {self.kind!r} is not one of {DISTRIBUTIONS}; e.g. --dist lognormal:5:1"
            )
        defaults = _DEFAULTS[self.kind]
        if len(self.params) > len(defaults):
            raise ValueError(f"--dist {self.kind} takes at most {len(defaults)} parameters")
        params = tuple(float(p) for p in self.params) + defaults[len(self.params) :]
        object.__setattr__(self, "params", params)
        if not all(math.isfinite(p) for p in params):
            raise ValueError(f"--dist {self.describe()}: parameters must be finite numbers")
        if self.kind == "lognormal" and params[1] <= 0:
            raise ValueError(f"--dist {self.describe()}: SIGMA must be > 0")
        if self.kind != "lognormal" and not 1 <= params[0] <= params[1]:
            raise ValueError(f"--dist {self.describe()}: need 1 <= the first <= the second")
        if self.kind == "bimodal" and not 0 <= params[2] <= 1:
            raise ValueError(f"--dist {self.describe()}: FRACTION must be in [0, 1]")

    @classmethod
    def parse(cls, text: str) -> SizeDistribution:
        """From ``kind[:a[:b[:c]]]``, e.g. ``lognormal:5:1``, ``uniform:16:512``,
        ``bimodal:64:2048:0.1``."""
        kind, *numbers = text.strip().split(":")
        try:
            params = tuple(float(x) for x in numbers)
        except ValueError:
            raise ValueError(
                f"--dist {text!r}: parameters must be numbers, e.g. lognormal:5:1, "
                f"uniform:16:512 or bimodal:64:2048:0.1"
            ) from None
        return cls(kind, params)

    def describe(self) -> str:
        return ":".join([self.kind, *(f"{p:g}" for p in self.params)])

    def draw(self, n: int, seed: int) -> np.ndarray:
        """``n`` sizes drawn with ``numpy.random.default_rng([seed, 0x5153])``."""
        if not is_int(n) or n < 1:
            raise ValueError(f"--samples {n!r} must be an int >= 1")
        rng = np.random.default_rng([seed, 0x5153])
        a, b, *rest = self.params
        if self.kind == "lognormal":
            raw = rng.lognormal(a, b, int(n))
        elif self.kind == "uniform":
            raw = rng.integers(int(a), int(b) + 1, int(n)).astype(np.float64)
        else:
            centre = np.where(rng.random(int(n)) < rest[0], b, a)
            raw = centre * rng.lognormal(0.0, _MODE_SIGMA, int(n))
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
