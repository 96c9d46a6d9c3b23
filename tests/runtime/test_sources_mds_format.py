"""MDS column codecs: every decoded encoding round-trips; refused encodings say why."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from chronica.runtime.sources.mds_format import (
    SampleDecoder,
    codec,
    decode_sample,
    encode_sample,
    length_column,
    shard_header,
)


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


def test_one_decoder_reads_every_sample_of_a_layout_as_decode_sample_does():
    names = ["a", "f", "n", "t"]
    codecs = [codec("ndarray"), codec("float32"), codec("int"), codec("ndarray:int16")]
    samples = [
        {"a": np.arange(i * 5, dtype=np.uint16).reshape(i, 5), "f": np.float32(i), "n": i}
        | {"t": np.arange(i, dtype=np.int16)}
        for i in range(4)
    ]
    for wanted in (frozenset(names), frozenset({"t", "f"}), frozenset()):
        decode = SampleDecoder(codecs, names, wanted)
        for sample in samples:
            data = memoryview(encode_sample(sample, codecs, names))
            got, expected = decode(data), decode_sample(data, codecs, names, wanted)
            assert got.keys() == expected.keys() == wanted
            for k in got:
                assert type(got[k]) is type(sample[k]) and np.array_equal(got[k], sample[k])
                assert np.asarray(got[k]).dtype == np.asarray(sample[k]).dtype
                assert np.shape(got[k]) == np.shape(sample[k])
    assert repr(SampleDecoder(codecs, names, frozenset({"t"}))) == (
        "SampleDecoder(names=['a', 'f', 'n', 't'], wanted=['t'])"
    )


def test_the_shard_header_points_at_every_sample():
    header = shard_header(2, b"{}", [3, 5])
    offsets = np.frombuffer(header, np.uint32, count=3, offset=4).tolist()
    assert np.frombuffer(header, np.uint32, count=1)[0] == 2
    assert offsets == [len(header), len(header) + 3, len(header) + 8]


@pytest.mark.parametrize(
    ("encoding", "layout"),
    [("ndarray:int32", "shape"), ("ndarray", "shape"), ("ndarray:uint8:4,2", "fixed"),
     ("int", "int"), ("bytes", "size"), ("str", None), ("json", None), ("float32", None)],
)  # fmt: skip
def test_a_length_column_is_read_from_the_bytes_where_its_encoding_allows(encoding, layout):
    names = ["a", "n", "z"]
    codecs = [codec("str"), codec(encoding), codec("int")]
    column = length_column(codecs, names, "n")
    assert (column is None) == (layout is None) and length_column(codecs, names, len) is None
    if column is None:
        return
    assert column.layout == layout and repr(column).startswith("LengthColumn(")
    values = {
        "shape": [
            np.zeros((n, 2), np.int32) if encoding == "ndarray" else np.arange(n, dtype=np.int32)
            for n in (0, 3, 300, 70000)
        ],
        "fixed": [np.zeros((4, 2), np.uint8)] * 3,
        "int": [0, 5, 2**40],
        "size": [b"", b"xyz", bytes(300)],
    }[layout]
    samples = [
        encode_sample({"a": "é" * i, "n": v, "z": i}, codecs, names) for i, v in enumerate(values)
    ]
    data = shard_header(len(samples), b"{}", [len(b) for b in samples]) + b"".join(samples)
    raw = np.frombuffer(data, np.uint8)
    offsets = np.frombuffer(data, np.uint32, count=len(samples) + 1, offset=4)
    want = [int(v) if isinstance(v, int) else len(v) for v in values]
    assert column.lengths(raw, offsets).tolist() == want
    assert column.lengths(raw, offsets[1:]).tolist() == want[1:]


def test_a_zero_dimensional_array_leaves_its_length_to_the_decoded_record():
    codecs = [codec("ndarray:int64")]
    # A 0-d array: its size, a shape byte of no dimension, its value (encode_sample writes
    # none, other writers may).
    scalar = np.uint32(9).tobytes() + bytes([0]) + np.int64(7).tobytes()
    assert decode_sample(scalar, codecs, ["n"], frozenset(["n"]))["n"].ndim == 0
    samples = [encode_sample({"n": np.arange(3)}, codecs, ["n"]), scalar]
    data = shard_header(2, b"{}", [len(b) for b in samples]) + b"".join(samples)
    offsets = np.frombuffer(data, np.uint32, count=3, offset=4)
    column = length_column(codecs, ["n"], "n")
    assert column is not None
    assert column.lengths(np.frombuffer(data, np.uint8), offsets) is None
    assert column.lengths(np.frombuffer(data, np.uint8), offsets[:2]).tolist() == [3]
