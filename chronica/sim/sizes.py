"""Sample sizes for a simulation: drawn from a named distribution or read from a file.

Every function returns a read-only float64 vector validated by ``chronica.core.sizes``
(finite, non-negative, one-dimensional), so the simulator plans exactly what the real
scheduler would be given.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
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
    """Sizes from a file, by extension: ``.npy`` (a 1-D array), ``.csv`` (the column named
    ``column``, header on the first line), ``.parquet`` (column ``column``; needs pyarrow),
    anything else text with one number per line (blank lines and ``#`` comments ignored).

    Guarantees: the result is validated (finite, non-negative, at least one entry); every
    failure is a ``ValueError`` naming ``--sizes``/``--column`` and what to change.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--sizes {str(path)!r}: no such file; give the path of a sizes file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".parquet"):
        if not column:
            raise ValueError(
                f"--sizes {path.name} is a table: name the column with --column NAME"
                f"{_columns_hint(path)}"
            )
        values = _read_parquet(path, column) if suffix == ".parquet" else _read_csv(path, column)
    elif column:
        raise ValueError(f"--column {column!r} only applies to .csv and .parquet files")
    elif suffix == ".npy":
        values = np.load(path, allow_pickle=False)
        if values.ndim != 1:
            raise ValueError(
                f"--sizes {path.name} holds an array of shape {values.shape}; save a 1-D array"
            )
    else:
        values = _read_text(path)
    where = f"--sizes {path.name}" + (f" --column {column}" if column else "")
    if np.asarray(values).size == 0:
        raise ValueError(f"{where}: no sizes found; give one number per sample")
    return validate_sizes(values, name=where)


def resample(sizes: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` sizes drawn with replacement from ``sizes`` (seeded): a larger data set with
    the same size distribution. ``n == len(sizes)`` returns ``sizes`` unchanged."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"--samples {n!r} must be an int >= 1")
    if n == sizes.shape[0]:
        return sizes
    rng = np.random.default_rng([seed, 0x5253])
    return validate_sizes(sizes[rng.integers(0, sizes.shape[0], int(n))], name="--samples")


def _read_text(path: Path) -> np.ndarray:
    values: list[float] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                values.append(float(text))
            except ValueError:
                raise ValueError(
                    f"--sizes {path.name}:{number}: {text!r} is not a number; write one size "
                    f"per line"
                ) from None
    return np.asarray(values, dtype=np.float64)


def _read_csv(path: Path, column: str) -> np.ndarray:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"--sizes {path.name} is empty")
        names = [h.strip() for h in header]
        if column not in names:
            raise ValueError(f"--column {column!r} is not in {path.name}; its columns: {names}")
        at = names.index(column)
        cells = [row[at].strip() if at < len(row) else "" for row in reader]
    values = np.empty(len(cells), dtype=np.float64)
    for i, cell in enumerate(cells):
        try:
            values[i] = float(cell)
        except ValueError:
            raise ValueError(
                f"--sizes {path.name} line {i + 2}, --column {column}: {cell!r} is not a "
                f"number; every row needs a size"
            ) from None
    return values


def _read_parquet(path: Path, column: str) -> np.ndarray:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ValueError(
            f"--sizes {path.name}: reading Parquet needs pyarrow (pip install pyarrow), or "
            f"export the column to .csv or .npy"
        ) from None
    schema = pq.read_schema(path)
    if column not in schema.names:
        raise ValueError(f"--column {column!r} is not in {path.name}; its columns: {schema.names}")
    array = pq.read_table(path, columns=[column]).column(column)
    if array.null_count:
        raise ValueError(f"--sizes {path.name} --column {column}: {array.null_count} empty cells")
    return np.asarray(array.to_numpy(), dtype=np.float64)


def _columns_hint(path: Path) -> str:
    if path.suffix.lower() != ".csv":
        return ""
    with path.open(newline="", encoding="utf-8") as f:
        header: Sequence[str] | None = next(csv.reader(f), None)
    return f" (its columns: {[h.strip() for h in header]})" if header else ""
