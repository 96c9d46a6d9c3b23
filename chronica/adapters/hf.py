"""Sample sizes from Hugging Face ``datasets`` and Apache Arrow columns, without a Python loop.

``arrow_sizes(dataset, sizes)`` turns what a user naturally has at hand into one number per
sample for ``chronica.core.resolve_sizes``:

* a column name (``sizes="length"``) of a ``datasets.Dataset`` given as the data set;
* a column of one (``ds["length"]``, a lazy ``datasets`` ``Column`` whose ``numpy.asarray``
  would read a million rows one Python object at a time);
* a ``pyarrow`` ``Array`` or ``ChunkedArray`` (``ds.data.column("length")``).

A numeric column gives its values; a list column (token ids) or a string column gives each
row's length. A data set with an indices mapping (after ``select``, ``shuffle``, ``filter``)
gives its rows' values in its own order. Anything else is handed back unchanged.

Neither ``datasets`` nor ``pyarrow`` is imported unless the argument is one of theirs: a
``datasets.Dataset`` is recognised only when ``datasets`` was already imported (an object of
it cannot exist otherwise), an Arrow array only when ``pyarrow`` was.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["arrow_sizes", "hf_dataset", "size_columns"]


def hf_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is a Hugging Face ``datasets.Dataset`` (map-style, Arrow-backed)."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(dataset, module.Dataset)


def _arrow_array(value: Any) -> bool:
    module = sys.modules.get("pyarrow")
    return module is not None and isinstance(value, (module.Array, module.ChunkedArray))


def arrow_sizes(dataset: Any, sizes: Any) -> Any:
    """``sizes`` as one number per sample when it is a column name of the Hugging Face
    ``dataset``, a ``datasets`` column, or an Arrow array (see the module's docstring);
    otherwise ``sizes`` unchanged. Raises ``ValueError`` naming the column and the fix for a
    name without such a data set, an unknown column, a column with missing values or of a
    type that has no size."""
    if isinstance(sizes, str):
        if not hf_dataset(dataset):
            raise ValueError(
                f"sizes={sizes!r} names a column, which needs a Hugging Face datasets.Dataset "
                f"as the data set (got {type(dataset).__name__}); pass one number per sample "
                "instead"
            )
        return _column_sizes(dataset, sizes)
    source = getattr(sizes, "source", None)
    name = getattr(sizes, "column_name", None)
    if isinstance(name, str) and hf_dataset(source):
        return _column_sizes(source, name)  # ``ds["length"]``: read through Arrow instead
    if _arrow_array(sizes):
        return _values(sizes, "the Arrow column")
    return sizes


def size_columns(dataset: Any) -> list[str]:
    """Columns of a Hugging Face ``dataset`` that can give sizes (numbers, lists, strings),
    for messages; ``[]`` for any other data set."""
    if not hf_dataset(dataset):
        return []
    import pyarrow as pa

    schema = dataset.data.schema
    return [
        field.name
        for field in schema
        if pa.types.is_integer(field.type)
        or pa.types.is_floating(field.type)
        or _lengths_of(field.type) is not None
    ]


def _column_sizes(dataset: Any, name: str) -> np.ndarray:
    table = dataset.data  # the Arrow table behind the data set, before any indices mapping
    if name not in table.column_names:
        raise ValueError(
            f"sizes={name!r} is not a column of the data set; its columns are {table.column_names}"
        )
    column = table.column(name)
    # ``select``/``shuffle``/``filter`` keep the table and add an indices mapping (a private
    # attribute of datasets; the public ways to apply it take seconds per million rows).
    indices = getattr(dataset, "_indices", None)
    if indices is not None:
        import pyarrow.compute as pc

        column = pc.take(column, indices.column(0))
    return _values(column, f"column {name!r}")


def _lengths_of(arrow_type: Any) -> Any:
    """The Arrow compute function giving the lengths of a column of ``arrow_type`` (lists,
    strings, binaries), or ``None`` for a type without lengths."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pc.list_value_length
    if pa.types.is_fixed_size_list(arrow_type):
        return pc.list_value_length
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pc.utf8_length
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return pc.binary_length
    return None


def _values(column: Any, what: str) -> np.ndarray:
    import pyarrow as pa

    if column.null_count:
        raise ValueError(
            f"{what} has {column.null_count} missing values; fill them (every sample needs a "
            "size) or pass sizes= as an array"
        )
    lengths = _lengths_of(column.type)
    if lengths is not None:
        column = lengths(column)
    elif not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ValueError(
            f"{what} has type {column.type}, which has no size; give a numeric column, or a "
            "list or string column (its lengths are the sizes)"
        )
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return np.asarray(column.to_numpy(zero_copy_only=False))
