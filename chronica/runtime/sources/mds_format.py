"""Mosaic Streaming's MDS format (index version 2), read and written without the package.

The layout, as ``mosaicml-streaming`` writes it (``MDSWriter``) and documents it:

- ``index.json`` in the dataset's folder: ``{"version": 2, "shards": [...]}``, one entry per
  shard with its ``column_names`` (sorted), ``column_encodings``, ``column_sizes`` (bytes
  of a fixed-size column, ``null`` for a variable one), ``samples``, ``raw_data``
  (``basename`` and ``bytes`` of the uncompressed file), ``compression`` and ``zip_data``
  (the compressed file, when the writer compressed);
- a shard file: ``uint32`` sample count ``n``, ``n + 1`` ``uint32`` offsets (absolute
  positions of each sample's bytes and of the end), the writer's configuration as JSON,
  then the samples back to back;
- a sample: one ``uint32`` size per variable-size column, in column order, then every
  column's bytes in column order.

This module decodes (and, for tests, documentation and benchmarks, encodes) the columns a
token stream uses: ``bytes``, ``str``, ``int``, numpy scalars (``uint8`` .. ``float64``),
``ndarray[:dtype[:shape]]``, ``str_int``, ``str_float``, ``str_decimal``, ``json`` and,
only when allowed, ``pkl``. Image encodings (``pil``, ``jpeg``, ``png`` and their lists)
are not decoded: leave such columns out of the read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np

__all__ = ["ColumnCodec", "codec", "decode_sample", "encode_sample", "shard_header"]

SCALARS = frozenset(
    ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16")
) | {"float32", "float64"}
# ndarray's value dtypes and shape dtypes, by the byte that names them in a sample.
ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32"}
ARRAY_DTYPES |= {33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
ARRAY_CODES = {name: code for code, name in ARRAY_DTYPES.items()}
SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
UNSAFE = ("pkl",)


class ColumnCodec:
    """How one MDS column's bytes become a value and back.

    Args:
        encoding: the column's encoding as ``index.json`` names it.
        size: bytes of every value (``None``: variable, stored per sample).
        decode: bytes (or a ``memoryview`` of them) to value; an array shares the
            buffer's memory, every other value is a copy.
        encode: value to bytes.
    """

    def __init__(
        self,
        encoding: str,
        size: int | None,
        decode: Callable[[bytes | memoryview], Any],
        encode: Callable[[Any], bytes],
    ) -> None:
        self.encoding = encoding
        self.size = size
        self.decode = decode
        self.encode = encode

    def __repr__(self) -> str:
        return f"ColumnCodec({self.encoding!r}, size={self.size})"


def codec(encoding: str) -> ColumnCodec:
    """The codec of an MDS column encoding; ``ValueError`` for one this reader does not
    decode: images, and ``pkl`` (unpickling runs code, which chronica never does).

    Args:
        encoding: the encoding as ``index.json`` names it (e.g. ``"ndarray:int32"``).

    Example::

        >>> column = codec("ndarray:int32")
        >>> column.decode(column.encode(np.arange(3, dtype=np.int32)))
        array([0, 1, 2], dtype=int32)
    """
    name, _, args = encoding.partition(":")
    if name == "bytes":
        return ColumnCodec(encoding, None, bytes, bytes)
    if name == "str":
        return ColumnCodec(encoding, None, lambda b: str(b, "utf-8"), lambda v: v.encode())
    if name == "int":
        return ColumnCodec(
            encoding, 8, lambda b: int(np.frombuffer(b, np.int64)[0]), _scalar_bytes(np.int64)
        )
    if name in SCALARS:
        dtype = np.dtype(name)
        return ColumnCodec(
            encoding, dtype.itemsize, lambda b: np.frombuffer(b, dtype)[0], _scalar_bytes(dtype)
        )
    if name == "ndarray":
        return _array_codec(encoding, args)
    if name in ("str_int", "str_float", "str_decimal"):
        parse: Callable[[str], Any] = {"str_int": int, "str_float": float}.get(name, Decimal)
        return ColumnCodec(
            encoding, None, lambda b: parse(str(b, "utf-8")), lambda v: str(v).encode()
        )
    if name == "json":
        return ColumnCodec(encoding, None, lambda b: json.loads(str(b, "utf-8")), _json_bytes)
    if name in UNSAFE:
        raise ValueError(
            f"a column is encoded as {encoding!r}: unpickling runs code, and chronica never "
            "unpickles; leave the column out with columns=[...], or write it as json, "
            "ndarray or bytes"
        )
    raise ValueError(
        f"MDS encoding {encoding!r} is not decoded here (images are not); leave the column "
        "out of the columns read"
    )


def _scalar_bytes(dtype: Any) -> Callable[[Any], bytes]:
    return lambda value: np.asarray(value, dtype=dtype).tobytes()


def _json_bytes(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value).encode("utf-8")


def _array_codec(encoding: str, args: str) -> ColumnCodec:
    dtype_text, _, shape_text = args.partition(":")
    dtype = dtype_text or None
    shape = tuple(int(d) for d in shape_text.split(",")) if shape_text else None
    if dtype is not None and dtype not in ARRAY_CODES:
        raise ValueError(f"MDS encoding {encoding!r} names dtype {dtype!r}, not one of MDS's")
    size = None
    if dtype is not None and shape is not None:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize

    def decode(data: bytes | memoryview) -> np.ndarray:
        at = 0
        value_dtype = dtype
        if value_dtype is None:
            value_dtype, at = ARRAY_DTYPES[data[0]], 1
        array_shape = shape
        if array_shape is None:
            ndim, width = data[at] >> 2, data[at] & 3
            dims = np.frombuffer(data, SHAPE_DTYPES[width], count=ndim, offset=at + 1)
            array_shape, at = tuple(int(d) for d in dims), at + 1 + ndim * 2**width
        return np.frombuffer(data, value_dtype, offset=at).reshape(array_shape)

    def encode(value: np.ndarray) -> bytes:
        parts = []
        if dtype is None:
            parts.append(bytes([ARRAY_CODES[value.dtype.name]]))
        if shape is None:
            dims = np.array(value.shape, np.int64)
            width = next(w for w, t in enumerate(SHAPE_DTYPES) if int(dims.max()) < 256 ** (2**w))
            parts.append(bytes([(value.ndim << 2) | width]))
            parts.append(dims.astype(SHAPE_DTYPES[width]).tobytes())
        parts.append(np.ascontiguousarray(value).tobytes())
        return b"".join(parts)

    return ColumnCodec(encoding, size, decode, encode)


def decode_sample(
    data: bytes | memoryview,
    codecs: list[ColumnCodec],
    names: list[str],
    wanted: frozenset[str],
) -> dict[str, Any]:
    """One sample's bytes as ``{column: value}`` for the columns in ``wanted``.

    Args:
        data: the sample's bytes (sizes of the variable columns, then the columns), or a
            ``memoryview`` of them (``ndarray`` columns are then views of that memory).
        codecs: every column's codec, in the shard's column order.
        names: every column's name, in the same order.
        wanted: the columns decoded (the others are skipped, not decoded).
    """
    variable = [c.size is None for c in codecs]
    count = sum(variable)
    sizes = iter(np.frombuffer(data, np.uint32, count=count).tolist())
    at = 4 * count
    sample = {}
    for name, column, is_variable in zip(names, codecs, variable, strict=True):
        size = next(sizes) if is_variable else column.size
        assert size is not None
        if name in wanted:
            sample[name] = column.decode(data[at : at + size])
        at += size
    return sample


def encode_sample(sample: dict[str, Any], codecs: list[ColumnCodec], names: list[str]) -> bytes:
    """One sample as MDS bytes (the inverse of ``decode_sample`` over every column).

    Args:
        sample: ``{column: value}`` holding every column.
        codecs: every column's codec, in column order.
        names: every column's name, in the same order.
    """
    missing = [name for name in names if name not in sample]
    if missing:
        raise ValueError(f"a record lacks columns {missing}; every record needs all {names}")
    data = [column.encode(sample[name]) for name, column in zip(names, codecs, strict=True)]
    sizes = [len(d) for d, c in zip(data, codecs, strict=True) if c.size is None]
    return np.array(sizes, np.uint32).tobytes() + b"".join(data)


def shard_header(count: int, config: bytes, sample_sizes: list[int]) -> bytes:
    """The bytes of a shard file before its samples: count, offsets, configuration.

    Args:
        count: the number of samples.
        config: the writer's configuration as JSON bytes.
        sample_sizes: every sample's size in bytes, in order.
    """
    start = 4 + 4 * (count + 1) + len(config)
    offsets = np.concatenate([[0], np.cumsum(sample_sizes, dtype=np.int64)]) + start
    return np.uint32(count).tobytes() + offsets.astype(np.uint32).tobytes() + config
