"""chronica.comm.flatmap: the flat-map check on raw bytes admits every message chronica
sends and refuses nesting, arrays, ext values, odd keys and trailing or missing bytes at
their first byte, whatever follows."""

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.comm.flatmap import MAX_ENTRIES, flat_map_problem
from chronica.comm.protocol import Micro, encode, plan_message, plan_messages

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=300),
    st.binary(max_size=70_000),
)


def test_every_message_chronica_sends_is_a_flat_map():
    ones = np.ones(2)
    frames = [
        encode("hello", rank=0, world=2, digest="ab"),
        encode("fetch", rank=1, epoch=0, first=16, ahead=True),
        encode("report", rank=1, epoch=0, step=3, load=1.5, seconds=0.25),
        encode("welcome", window=16, steps=64),
        encode("error", code="stale", msg="x" * 600, epoch=0, first=0),
        plan_message(0, 1, 0, 0, np.arange(4), np.array([0, 2, 4]), ones, ones),
        plan_message(
            0,
            1,
            0,
            0,
            np.arange(2),
            np.array([0, 2]),
            ones[:1],
            ones[:1],
            Micro(np.zeros(2, int), np.array([1]), np.array([0, 2]), np.ones(1)),
        ),
        *plan_messages(
            3,
            1,
            0,
            0,
            np.arange(8),
            np.array([0, 4, 8]),
            np.array([[0, 0], [2, 2], [4, 4]]),
            np.ones((2, 2)),
            np.ones((2, 2)),
        ),
    ]
    for frame in frames:
        assert flat_map_problem(frame) is None


@given(st.dictionaries(st.text(max_size=80), SCALARS, max_size=MAX_ENTRIES))
def test_any_flat_map_of_scalars_passes(message):
    assert flat_map_problem(msgpack.packb(message, use_bin_type=True)) is None


@pytest.mark.parametrize(
    "frame,problem",
    [
        (b"", "an empty message"),
        (msgpack.packb([1]), "must be a msgpack map"),
        (msgpack.packb({"v": [1]}), "field 'v' holds an array"),
        (msgpack.packb({"v": {"a": 1}}), "field 'v' holds a map"),
        (b"\x81\xa1v" + b"\x91" * 400_000 + b"\x90", "field 'v' holds an array"),
        (msgpack.packb({"v": msgpack.ExtType(1, b"x")}), "field 'v' holds an ext value"),
        (msgpack.packb({1: 2}), "map keys must be strings"),
        (b"\x81\x91\x01\x02", "a key holds an array"),
        (msgpack.packb({str(i): i for i in range(MAX_ENTRIES + 1)}), "a map of 33 entries"),
        (msgpack.packb({"v": 3}) + b"\x00", "1 bytes follow"),
        (msgpack.packb({"v": b"x" * 300})[:-1], "ends inside a value"),
        (msgpack.packb({"v": 3, "t": "x"})[:-2], "ends inside"),
        (b"\x81\xa1v\xc5\x01", "ends inside a header"),
        (b"\x81\xa1v\xc1", "the unused byte 0xc1"),
    ],
)
def test_what_no_message_holds_is_named(frame, problem):
    found = flat_map_problem(frame)
    assert found is not None and problem in found, found


@given(st.binary(max_size=200))
def test_any_bytes_give_an_answer_never_an_exception(frame):
    problem = flat_map_problem(frame)
    if problem is None:  # then msgpack reads one flat map of scalars
        message = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        assert isinstance(message, dict)
        assert not any(isinstance(v, (list, dict)) for v in message.values())
