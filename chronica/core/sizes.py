"""Sample sizes: where they come from and the checks they pass once per run.

A *size* is the relative amount of work one sample costs (tokens, frames, seconds of
audio). chronica reads sizes once, validates them once and never scans the data set again.
"""

from __future__ import annotations

import hashlib
from types import FunctionType
from typing import Any

import numpy as np

__all__ = ["MAX_SIZE", "defines_sizeof", "resolve_sizes", "sizes_digest", "validate_sizes"]

# The largest size accepted: 2**53, the largest float64 below which every whole number is
# exact (token counts stay whole; packing turns them into int64). With costs bounded too
# (``chronica.core.cost.MAX_COST``), no step or epoch total can overflow a kernel.
MAX_SIZE = 2.0**53


def validate_sizes(
    sizes: Any, *, expected_len: int | None = None, name: str = "sizes"
) -> np.ndarray:
    """Return ``sizes`` as a read-only contiguous float64 vector.

    Guarantees: the result is one-dimensional, has ``expected_len`` entries when that is
    given, and every entry is finite, non-negative and at most ``MAX_SIZE`` (2**53). Integer
    and floating inputs are accepted; booleans, complex numbers, strings, dates and objects
    raise ``TypeError``, a wrong shape, length or entry ``ValueError``, each naming ``name``
    (and the entry's position).

    Args:
        sizes: one number per sample (array-like).
        expected_len: the number of samples, or ``None`` not to check it.
        name: how the message calls the sizes (e.g. ``"MyData.sizes"``).

    Example::

        >>> validate_sizes([3, 1, 2]).tolist()
        [3.0, 1.0, 2.0]
        >>> validate_sizes([1, -2])
        Traceback (most recent call last):
        ValueError: sizes[1] is -2; sizes must be non-negative
    """
    try:
        raw = np.asarray(sizes)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(
            f"{name} must be a 1-D array of numbers; could not convert: {exc}"
        ) from exc
    if raw.dtype == object and raw.ndim == 1:
        raw = _whole_numbers(raw, name)
    if raw.dtype == np.bool_ or not (
        np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)
    ):
        raise TypeError(
            f"{name} must hold integers or floats, got dtype {raw.dtype}; "
            f"pass one number per sample, e.g. token counts"
        )
    if raw.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one size per sample), got shape {raw.shape}")
    if expected_len is not None and raw.shape[0] != expected_len:
        raise ValueError(
            f"{name} has {raw.shape[0]} entries but the data set has {expected_len} samples; "
            f"give exactly one size per sample"
        )
    out = np.ascontiguousarray(raw, dtype=np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}[{first}] is {raw[first].item()!r}; sizes must be finite (no NaN or inf)"
        )
    neg = out < 0
    if neg.any():
        first = int(np.flatnonzero(neg)[0])
        raise ValueError(f"{name}[{first}] is {raw[first].item()!r}; sizes must be non-negative")
    huge = out > MAX_SIZE
    if huge.any():
        first = int(np.flatnonzero(huge)[0])
        raise ValueError(
            f"{name}[{first}] is {raw[first].item()!r}; sizes must be at most 2**53 "
            f"({MAX_SIZE:.0f}) so that no cost total overflows; give sizes in a larger "
            f"unit (e.g. thousands of tokens)"
        )
    out.setflags(write=False)
    return out


def _whole_numbers(raw: np.ndarray, name: str) -> np.ndarray:
    """Python integers too large for int64 make numpy fall back to objects: those are sizes
    too (then refused as too large, not as the wrong type), anything else stays objects."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return raw
    out = np.empty(raw.shape[0], dtype=np.float64)
    for i, value in enumerate(raw):
        try:
            out[i] = float(value)
        except OverflowError:
            raise ValueError(
                f"{name}[{i}] is an integer of {int(value).bit_length()} bits; sizes must be "
                f"at most 2**53 ({MAX_SIZE:.0f}); give sizes in a larger unit"
            ) from None
    return out


def defines_sizeof(dataset: Any) -> bool:
    """True when the data set's class defines ``__sizeof__(self, index)`` in Python.

    Built-in and C-extension types (``list``, ``numpy.ndarray``) have their own memory-size
    ``__sizeof__``; those are not sizes. A base class may mark its default as "no sizes here".

    Args:
        dataset: any object.

    Example::

        >>> class Docs(list):
        ...     def __sizeof__(self, index):
        ...         return len(self[index])
        >>> defines_sizeof(Docs(["ab"])), defines_sizeof(["ab"])
        (True, False)
    """
    for klass in type(dataset).__mro__:
        method = vars(klass).get("__sizeof__")
        if method is not None:
            return isinstance(method, FunctionType) and not getattr(
                method, "__chronica_default__", False
            )
    return False


def resolve_sizes(dataset: Any = None, sizes: Any = None, missing: str | None = None) -> np.ndarray:
    """Find the per-sample sizes for ``dataset`` and validate them (see ``validate_sizes``).

    Sources, first match wins:

    1. the explicit ``sizes`` argument (array-like, one number per sample);
    2. a ``sizes`` attribute of the data set, or a ``sizes()`` method returning one;
    3. a ``__sizeof__(self, index)`` override on the data set's class (the upstream
       Chronica convention), called once per index;
    4. otherwise every sample has size 1, or, when ``missing`` says why sizes are needed,
       ``ValueError`` with that reason and the three ways to give them.

    The data set is only asked for ``len()`` when ``sizes`` is given; otherwise its own
    sizes are read once here, never again.

    Args:
        dataset: the data set (``len()`` and, for sources 2 and 3, its sizes), or ``None``
            when ``sizes`` is given alone.
        sizes: explicit sizes, one per sample, or ``None``.
        missing: why sizes are needed (then a data set without sizes is refused instead of
            weighing every sample 1), or ``None``.

    Example::

        >>> resolve_sizes(["ab", "c"], sizes=[2, 1]).tolist()
        [2.0, 1.0]
        >>> resolve_sizes(["ab", "c"]).tolist()
        [1.0, 1.0]
    """
    if sizes is not None:
        expected = _length(dataset) if dataset is not None else None
        return validate_sizes(sizes, expected_len=expected, name="sizes")
    if dataset is None:
        raise ValueError("give either a dataset or sizes= (one number per sample)")
    n = _length(dataset)
    attr = getattr(dataset, "sizes", None)
    if attr is not None:
        values = attr() if callable(attr) else attr
        return validate_sizes(values, expected_len=n, name=f"{type(dataset).__name__}.sizes")
    if defines_sizeof(dataset):
        values = _sizes_from_sizeof(dataset, n)
        return validate_sizes(values, expected_len=n, name=f"{type(dataset).__name__}.__sizeof__")
    if missing is not None:
        raise ValueError(
            f"{missing}: pass sizes= (one per sample), give the data set a sizes attribute, "
            "or define __sizeof__(self, index)"
        )
    return validate_sizes(np.ones(n, dtype=np.float64), expected_len=n)


def _length(dataset: Any) -> int:
    try:
        n = len(dataset)
    except TypeError as exc:
        raise ValueError(
            f"dataset of type {type(dataset).__name__} has no len(); chronica needs a "
            f"map-style (random-access) data set of known length"
        ) from exc
    return int(n)


def _sizes_from_sizeof(dataset: Any, n: int) -> np.ndarray:
    values = np.empty(n, dtype=np.float64)
    for i in range(n):
        try:
            values[i] = dataset.__sizeof__(i)
        except TypeError as exc:
            raise ValueError(
                f"{type(dataset).__name__}.__sizeof__ must take an index and return a number "
                f"(e.g. `def __sizeof__(self, index): return len(self.items[index])`): {exc}"
            ) from exc
    return values


def sizes_digest(sizes: np.ndarray) -> str:
    """A short hex digest of the validated sizes: equal digests mean equal sizes, bit for bit.

    Args:
        sizes: validated sizes (``validate_sizes``).

    Example::

        >>> sizes_digest(validate_sizes([1, 2])) == sizes_digest(validate_sizes([1.0, 2.0]))
        True
    """
    data = np.ascontiguousarray(sizes, dtype="<f8")
    # The buffer itself, not a bytes copy of it: a copy would double the sizes' memory.
    return hashlib.blake2b(data.data.cast("B"), digest_size=16).hexdigest()
