"""The one reader of sizes files, shared by ``chronica simulate --sizes``, ``chronica
coordinator --sizes`` and ``chronica demo --lengths``, so all three accept the same files.

A leaf: imports numpy only (pyarrow lazily, for Parquet); no other chronica module. It reads;
the caller validates the values (``chronica.core.sizes.validate_sizes``: finite,
non-negative), naming them with ``describe``.

Formats, by extension: ``.npy`` (a 1-D numeric array), ``.csv`` (the column ``column``,
header on the first line), ``.parquet`` (column ``column``; needs pyarrow), anything else text
with one number per line (blank lines and ``#`` comments ignored).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

__all__ = ["MAX_LINE", "SIZES_HELP", "describe", "read_sizes"]

MAX_LINE = 4096
"""The longest line a text sizes file may have (a number and a comment)."""

SIZES_HELP = (
    "sizes file: text (one number per line, # comments), .npy (1-D), or .csv/.parquet with "
    "--column NAME (Parquet needs pyarrow)"
)


def describe(
    path: str | os.PathLike[str], column: str | None = None, option: str = "--sizes"
) -> str:
    """How messages name the values read from ``path``: ``--sizes s.csv --column tokens``."""
    return f"{option} {Path(path).name}" + (f" --column {column}" if column else "")


def read_sizes(
    path: str | os.PathLike[str], column: str | None = None, option: str = "--sizes"
) -> np.ndarray:
    """The numbers in ``path`` as a 1-D float64 array with at least one entry.

    ``column`` names the column of a ``.csv`` or ``.parquet`` file (required there, refused
    elsewhere). Every failure (a missing, empty or blank file, a cell or line that is not a
    number, a table without the column) is a ``ValueError`` that names ``option`` (the
    command-line flag the path came from), the file and what to change.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{option} {str(path)!r}: no such file; give the path of a sizes file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".parquet"):
        if not column:
            raise ValueError(
                f"{option} {path.name} is a table: name the column with --column NAME"
                f"{_columns_hint(path)}"
            )
        if suffix == ".parquet":
            values = _read_parquet(path, column, option)
        else:
            values = _read_csv(path, column, option)
    elif column:
        raise ValueError(f"--column {column!r} only applies to .csv and .parquet files")
    elif suffix == ".npy":
        values = _read_npy(path, option)
    else:
        try:
            values = _read_text(path, option)
        except UnicodeDecodeError:
            raise ValueError(
                f"{option} {path.name} is neither UTF-8 text nor .npy/.csv/.parquet; write one "
                f"number per line or save a 1-D array with numpy.save (.npy)"
            ) from None
    if values.size == 0:
        raise ValueError(
            f"{describe(path, column, option)}: no sizes found; give one number per sample"
        )
    return values


def _read_npy(path: Path, option: str) -> np.ndarray:
    try:
        values = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(
            f"{option} {path.name} is not a readable .npy file ({exc}); save the sizes with "
            f"numpy.save"
        ) from None
    if not isinstance(values, np.ndarray) or values.ndim != 1:
        shape = getattr(values, "shape", None)
        raise ValueError(f"{option} {path.name} holds an array of shape {shape}; save a 1-D array")
    if not (
        values.dtype == np.bool_
        or np.issubdtype(values.dtype, np.integer)
        or np.issubdtype(values.dtype, np.floating)
    ):
        raise ValueError(
            f"{option} {path.name} holds {values.dtype} values; save a numeric 1-D array"
        )
    return values.astype(np.float64)


def _read_text(path: Path, option: str) -> np.ndarray:
    values: list[float] = []
    with path.open(encoding="utf-8") as f:
        # Lines are read with a bound, so a file that is not a sizes file (one endless line,
        # a sparse file of zero bytes) is refused at its first line instead of loaded whole.
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), ""), start=1):
            if len(line) > MAX_LINE or "\0" in line:
                raise ValueError(
                    f"{option} {path.name}:{number}: not a line of text (over {MAX_LINE} "
                    f"characters or NUL bytes); write one size per line"
                )
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                values.append(float(text))
            except ValueError:
                raise ValueError(
                    f"{option} {path.name}:{number}: {text!r} is not a number; write one size "
                    f"per line"
                ) from None
    return np.asarray(values, dtype=np.float64)


def _read_csv(path: Path, column: str, option: str) -> np.ndarray:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(
                f"{option} {path.name} is empty; write a header line naming the columns, then "
                f"one row per sample"
            )
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
                f"{option} {path.name} line {i + 2}, --column {column}: {cell!r} is not a "
                f"number; every row needs a size"
            ) from None
    return values


def _read_parquet(path: Path, column: str, option: str) -> np.ndarray:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ValueError(
            f"{option} {path.name}: reading Parquet needs pyarrow (pip install pyarrow), or "
            f"export the column to .csv or .npy"
        ) from None
    schema = pq.read_schema(path)
    if column not in schema.names:
        raise ValueError(f"--column {column!r} is not in {path.name}; its columns: {schema.names}")
    array = pq.read_table(path, columns=[column]).column(column)
    if array.null_count:
        raise ValueError(
            f"{option} {path.name} --column {column}: {array.null_count} empty cells; every "
            f"row needs a size"
        )
    return np.asarray(array.to_numpy(), dtype=np.float64)


def _columns_hint(path: Path) -> str:
    if path.suffix.lower() != ".csv":
        return ""
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), None)
    return f" (its columns: {[h.strip() for h in header]})" if header else ""
