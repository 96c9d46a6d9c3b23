"""MDS column codecs: every decoded encoding round-trips; refused encodings say why."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from chronica.runtime.sources.mds_format import codec, decode_sample, encode_sample, shard_header


@pytest.mark.parametrize(
    ("encoding", "value"),
    [
        ("bytes", b"\x00ab"),
        ("str", "héllo"),
        ("int", -(2**40)),
        ("uint8", np.uint8(200)),
        ("float64", np.float64(0.25)),
        ("ndarray", np.arange(6, dtype=np.uint16).reshape(2, 3)),
        ("ndarray", np.ones(70000, dtype=np.int8)),  # a uint32 shape
        ("ndarray:int64", np.arange(3)),
        ("ndarray:float32:2,2", np.eye(2, dtype=np.float32)),
        ("str_int", 10**30),
        ("str_float", 1.5),
        ("str_decimal", Decimal("1.25")),
        ("json", {"a": [1, 2], "b": None}),
    ],
)
def test_every_encoding_round_trips(encoding, value):
    column = codec(encoding)
    data = column.encode(value)
    assert column.size is None or len(data) == column.size
    assert np.array_equal(column.decode(data), value)


def test_a_fixed_size_array_has_its_size_in_bytes():
    assert codec("ndarray:float32:2,3").size == 24
    assert codec("ndarray:float32").size is None


def test_refused_encodings_say_why():
    with pytest.raises(ValueError, match="images are not"):
        codec("jpeg")
    with pytest.raises(ValueError, match="chronica never unpickles"):
        codec("pkl")
    with pytest.raises(ValueError, match="names dtype 'bool'"):
        codec("ndarray:bool")


def test_a_sample_decodes_only_the_columns_wanted():
    names = ["a", "b", "c"]
    codecs = [codec("str"), codec("int"), codec("bytes")]
    data = encode_sample({"a": "xy", "b": 7, "c": b"z"}, codecs, names)
    assert decode_sample(data, codecs, names, frozenset(names)) == {"a": "xy", "b": 7, "c": b"z"}
    assert decode_sample(data, codecs, names, frozenset({"c"})) == {"c": b"z"}


def test_the_shard_header_points_at_every_sample():
    header = shard_header(2, b"{}", [3, 5])
    offsets = np.frombuffer(header, np.uint32, count=3, offset=4).tolist()
    assert np.frombuffer(header, np.uint32, count=1)[0] == 2
    assert offsets == [len(header), len(header) + 3, len(header) + 8]
