"""chronica.comm.protocol: encoding, and the decoder fed what an attacker (or a bug) could
send: every field replaced by anything, truncations, hostile headers, arbitrary arrays, and
reports at the edges of the measurement envelope (with the planner behind the decoder).

The field table below (``FIELDS``, ``INTS``) is written out independently of the
decoder's own, so a field the decoder stopped checking is caught."""

import math
import resource
import subprocess
import sys
import textwrap
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronica.comm.protocol import (
    MAX_GENERATION,
    MAX_REQUEST_BYTES,
    MAX_STEPS,
    MAX_WORLD,
    REPORT_LOAD,
    REPORT_SECONDS,
    VERSION,
    Micro,
    ProtocolError,
    decode,
    encode,
    plan_message,
    tcp_url,
    topic,
)
from chronica.core.dynamic import DynamicPlanner

PLAN_BYTES = 1 << 20


# -- encoding --------------------------------------------------------------------------


def test_plan_message_round_trip():
    payload = plan_message(
        7, 99, 2, 16, np.arange(10), np.array([0, 4, 10]), np.ones(2), np.array([3.0, 4.0])
    )
    plan = decode(payload, 1 << 20)["plan"]
    assert (plan.seq, plan.gen, plan.epoch, plan.first, plan.num_steps) == (7, 99, 2, 16, 2)
    np.testing.assert_array_equal(plan.local(17), np.arange(4, 10))


def test_a_packed_plan_round_trips_its_micro_batches():
    micro = Micro(
        rows=np.array([0, 0, 1, 2]),
        counts=np.array([2, 1]),
        offsets=np.array([0, 1, 3, 4]),
        weights=np.array([0.5, 0.25, 1.0]),
    )
    payload = plan_message(
        0, 1, 0, 8, np.arange(4), np.array([0, 3, 4]), np.ones(2), np.ones(2), micro
    )
    plan = decode(payload, 1 << 20)["plan"]
    (a, rows_a, wa), (b, rows_b, wb) = plan.micro_batches(8)
    assert (a.tolist(), rows_a.tolist(), wa) == ([0], [0], 0.5)
    assert (b.tolist(), rows_b.tolist(), wb) == ([1, 2], [0, 1], 0.25)
    ((c, rows_c, wc),) = plan.micro_batches(9)
    assert (c.tolist(), rows_c.tolist(), wc) == ([3], [2], 1.0)


def test_topics_are_fixed_width_so_none_prefixes_another():
    topics = [topic(rank) for rank in (0, 1, 10, 12, 123, MAX_WORLD - 1)]
    assert len({len(t) for t in topics}) == 1
    assert not any(a != b and b.startswith(a) for a in topics for b in topics)


@pytest.mark.parametrize(
    "host, url",
    [
        ("127.0.0.1", "tcp://127.0.0.1:5000"),
        ("::1", "tcp://[::1]:5000"),
        ("node", "tcp://node:5000"),
    ],
)
def test_tcp_urls_bracket_ipv6_literals(host, url):
    assert tcp_url(host, 5000) == url


def test_a_protocol_error_carries_its_code():
    assert ProtocolError("x").code == "protocol"
    error = ProtocolError("say hello first", code="hello")
    assert (
        isinstance(error, ValueError) and error.code == "hello" and str(error) == "say hello first"
    )


# -- the decoder -----------------------------------------------------------------------

_THREE_STEPS = dict(w=np.ones(3, "<f8").tobytes(), load=np.ones(3, "<f8").tobytes())
_FOUR_STEPS = dict(w=np.ones(4, "<f8").tobytes(), load=np.ones(4, "<f8").tobytes())


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(off=np.array([0, 5], "<i8").tobytes()), "offsets"),
        (dict(idx=b"\x00" * 7), "8-byte"),
        (dict(w=np.array([np.inf], "<f8").tobytes()), "finite"),
        (dict(load=np.array([np.nan], "<f8").tobytes()), "finite"),
        (dict(load=np.array([-np.inf], "<f8").tobytes()), "finite"),
        (dict(w=np.array([-1.0], "<f8").tobytes(), load=np.array([np.inf]).tobytes()), "finite"),
        (dict(w=np.array([-1e-300], "<f8").tobytes()), "weights and loads must be >= 0"),
        (dict(load=np.array([-2.0], "<f8").tobytes()), "weights and loads must be >= 0"),
        (dict(off=np.array([0, 3, 2, 4], "<i8").tobytes(), **_THREE_STEPS), "offsets must rise"),
        # every int64 difference of these, wrapped, is >= 0 (an earlier check passed them)
        (dict(off=np.array([0, 2**63 - 1, -(2**63), -1, 4]).tobytes(), **_FOUR_STEPS), "rise"),
        (dict(idx=np.array([-1, 0, 1, 2], "<i8").tobytes()), ">= 0"),
        (dict(gen=0), "'gen'"),
    ],
)
def test_malformed_plans_are_refused(fields, match):
    message = dict(
        seq=0,
        gen=1,
        epoch=0,
        first=0,
        idx=np.arange(4, dtype="<i8").tobytes(),
        off=np.array([0, 4], "<i8").tobytes(),
        w=np.ones(1, "<f8").tobytes(),
        load=np.ones(1, "<f8").tobytes(),
    )
    message.update(fields)
    with pytest.raises(ProtocolError, match=match):
        decode(encode("plan", **message), 1 << 20)


@given(st.binary(max_size=MAX_REQUEST_BYTES + 64))
def test_decoder_never_fails_other_than_with_protocol_error(blob):
    try:
        decode(blob)
    except ProtocolError:
        pass


def test_fetch_ahead_must_be_a_bool():
    assert decode(encode("fetch", rank=0, epoch=0, first=0, ahead=True))["ahead"] is True
    with pytest.raises(ProtocolError, match="'ahead'"):
        decode(encode("fetch", rank=0, epoch=0, first=0, ahead=1))


def _valid(kind):
    """One valid message of each kind, as fields."""
    plan = dict(
        seq=1,
        gen=12345,
        epoch=0,
        first=0,
        idx=np.arange(6, dtype="<i8").tobytes(),
        off=np.array([0, 2, 6], "<i8").tobytes(),
        w=np.ones(2, "<f8").tobytes(),
        load=np.ones(2, "<f8").tobytes(),
    )
    return {
        "hello": dict(rank=1, world=4, digest="ab" * 16),
        "fetch": dict(rank=1, epoch=0, first=4),
        "report": dict(rank=1, epoch=0, step=3, load=10.0, seconds=0.5),
        "welcome": dict(window=4, steps=31),
        "plan": plan,
        "error": dict(code="protocol", msg="no", epoch=0, first=4),
    }[kind]


FIELDS = {
    "hello": ("rank", "world", "digest"),
    "fetch": ("rank", "epoch", "first"),
    "report": ("rank", "epoch", "step", "load", "seconds"),
    "welcome": ("window", "steps"),
    "plan": ("seq", "gen", "epoch", "first", "idx", "off", "w", "load"),
    "error": ("code", "msg"),
}
INTS = {
    "rank": (0, MAX_WORLD - 1),
    "world": (1, MAX_WORLD),
    "epoch": (0, MAX_STEPS),
    "first": (0, MAX_STEPS),
    "step": (0, MAX_STEPS),
    "seq": (0, MAX_STEPS),
    "gen": (1, MAX_GENERATION),
    "window": (1, MAX_STEPS),
    "steps": (0, MAX_STEPS),
}


def _check_decoded(message):
    """What a successful decode guarantees, checked independently of the decoder."""
    assert type(message["v"]) is int and message["v"] == VERSION
    kind = message["t"]
    names = FIELDS[kind] + (("epoch", "first") if kind == "error" and "epoch" in message else ())
    for name in names:
        value = message[name]
        if name in INTS:
            low, high = INTS[name]
            assert type(value) is int and low <= value <= high, (name, value)
    if kind == "report":
        for name, (low, high) in (("load", REPORT_LOAD), ("seconds", REPORT_SECONDS)):
            value = message[name]
            assert math.isfinite(value) and (value == 0 or low <= value <= high)
    if kind == "hello":
        assert isinstance(message["digest"], str) and 0 < len(message["digest"]) <= 128
    if kind == "error":
        assert isinstance(message["code"], str) and isinstance(message["msg"], str)
    if kind == "plan":
        plan = message["plan"]
        assert plan.num_steps >= 1 and plan.offsets[0] == 0
        assert (np.diff(plan.offsets) >= 0).all() and plan.offsets[-1] == plan.indices.shape[0]
        assert (plan.indices >= 0).all()
        assert np.isfinite(plan.weights).all() and (plan.weights >= 0).all()
        assert np.isfinite(plan.loads).all() and (plan.loads >= 0).all()
        assert plan.weights.shape[0] == plan.loads.shape[0] == plan.num_steps


def _decode_or_refuse(frame, max_bytes=MAX_REQUEST_BYTES):
    try:
        message = decode(frame, max_bytes)
    except ProtocolError:
        return None
    _check_decoded(message)
    return message


hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([-1, 2**20, 2**40 + 1, 2**63 - 1, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7e308, -1.0, 1e-10]),
    st.text(max_size=40),
    st.binary(max_size=40),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=12,
)
kinds = st.sampled_from(["hello", "fetch", "report", "welcome", "plan", "error"])


@given(kinds, st.data())
def test_a_field_replaced_by_anything_is_decoded_validly_or_refused(kind, data):
    fields = _valid(kind)
    name = data.draw(st.sampled_from([*fields, "v", "t", "extra"]))
    message = {"v": VERSION, "t": kind, **fields}
    message[name] = data.draw(hostile_values)
    frame = msgpack.packb(message, use_bin_type=True)
    _decode_or_refuse(frame, PLAN_BYTES)


@given(hostile_values)
def test_any_msgpack_value_is_decoded_validly_or_refused(value):
    _decode_or_refuse(msgpack.packb(value, use_bin_type=True))


@pytest.mark.parametrize("kind", ["hello", "fetch", "report", "welcome", "plan", "error"])
def test_every_truncation_of_a_valid_message_is_refused(kind):
    frame = encode(kind, **_valid(kind))
    assert decode(frame, PLAN_BYTES)["t"] == kind
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode(frame[:cut], PLAN_BYTES)


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc6\xff\xff\xff\xff",  # bin32 declaring 4 GiB
        b"\xdb\xff\xff\xff\xff",  # str32 declaring 4 GiB
        b"\xdd\xff\xff\xff\xff",  # array32 of 4 G items
        b"\xdf\xff\xff\xff\xff",  # map32 of 4 G pairs
        b"\xc9\xff\xff\xff\xff\x01",  # ext32 (no ext types are accepted)
        b"\x91" * 4000,  # arrays nested 4000 deep
        b"\x81\xa1a" * 1300,  # maps nested 1300 deep
        b"\x82\xa1v\x01\xa1t\x92" + b"\x90" * 2,  # a list as the type
        b"\x82\xa1v\xc3\xa1t\xa5hello",  # version True
        b"\x82\xa1v\xcb?\xf0\x00\x00\x00\x00\x00\x00\xa1t\xa5fetch",  # version 1.0
        msgpack.packb({"v": VERSION, "t": {"nested": "map"}}),
        msgpack.packb({b"v": VERSION, b"t": "hello"}),  # bytes keys are not field names
        msgpack.packb({1: VERSION}, strict_types=False),  # an int key
    ],
)
def test_hostile_headers_are_refused_without_allocating(frame):
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            decode(frame[:MAX_REQUEST_BYTES])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # bounded by the frame, not by any declared length


@pytest.mark.parametrize("frame", ["hello", 42, None, [b"x"], {"v": 1}])
def test_non_bytes_are_refused(frame):
    with pytest.raises(ProtocolError, match="bytes"):
        decode(frame)


def test_oversized_frames_are_refused_before_unpacking():
    big = encode("hello", rank=0, world=1, digest="x" * 100) + b"\x00" * MAX_REQUEST_BYTES
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(big)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(memoryview(np.zeros(MAX_REQUEST_BYTES, np.int64)))  # len() counts 8-byte items


@given(
    st.sampled_from(["idx", "off", "w", "load"]),
    st.integers(min_value=1, max_value=7),
)
def test_plan_arrays_not_of_whole_8_byte_values_are_refused(name, extra):
    fields = _valid("plan")
    fields[name] = fields[name] + b"\x00" * extra
    with pytest.raises(ProtocolError, match="8-byte"):
        decode(encode("plan", **fields), PLAN_BYTES)


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=0, max_size=8),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=0, max_size=4),
)
def test_plans_with_arbitrary_arrays_are_decoded_validly_or_refused(idx, off, w):
    frame = plan_message(3, 1, 0, 0, np.array(idx, np.int64), np.array(off, np.int64), w, w)
    _decode_or_refuse(frame, PLAN_BYTES)


@pytest.mark.parametrize(
    "field, value",
    [
        ("load", math.nan),
        ("load", math.inf),
        ("load", -1.0),
        ("load", 1e61),
        ("load", 1e-13),
        ("seconds", -0.5),
        ("seconds", math.inf),
        ("seconds", 1.7e308),  # once stalled the planner in an endless loop
        ("seconds", 1e-300),  # once made it fail on every later window
        ("seconds", 5e-324),
        ("step", -1),
        ("step", 2**40 + 1),
        ("epoch", 2**64 - 1),
        ("rank", MAX_WORLD),
        ("rank", True),
    ],
)
def test_reports_outside_the_measurement_envelope_are_refused(field, value):
    fields = _valid("report")
    fields[field] = value
    with pytest.raises(ProtocolError, match=field):
        decode(encode("report", **fields))


# -- the planner behind the decoder ----------------------------------------------------

reports = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.just(0.0), st.floats(*REPORT_LOAD)),
        st.one_of(st.just(0.0), st.floats(*REPORT_SECONDS)),
    ),
    max_size=40,
)


# Found by this test: a rank whose fit gets an extreme speed ratio made the balancing
# kernel's rounding miss the step's total (fixed in chronica.core.controller.water_fill).
POISON = [(1, 0.0, 1.0), (0, 1.0, 1.0), (1, 7.398790413875484e17, 1.0)]


@pytest.mark.timeout(120)
@settings(max_examples=40)
@example(POISON)
@given(reports)
def test_reports_the_decoder_admits_never_give_a_wrong_plan(scheduler, feedback):
    """What a malicious rank with valid keys can do: send any reports within the protocol's
    envelope. Planning still ends (no endless loop), and a window it plans holds exactly
    each step's samples, with counts within bounds; at worst it refuses to plan."""
    planner = DynamicPlanner(scheduler)
    static = scheduler.plan_epoch(0)
    low, high = scheduler.config.batch_bounds()
    for step, (rank, load, seconds) in enumerate(feedback):
        planner.observe(rank, step, load, seconds)
    for first in (0, 4):
        try:
            window = planner.plan_window(0, first)
        except ValueError:
            continue  # refused: the coordinator answers "internal", the static plan serves
        for i in range(window.num_steps):
            step = first + i
            got = np.sort(window.indices[window.bounds[i, 0] : window.bounds[i, -1]])
            expect = np.sort(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
            np.testing.assert_array_equal(got, expect)
            counts = np.diff(window.bounds[i])
            assert counts.min() >= low and counts.max() <= high
        assert np.isfinite(window.loads).all() and np.isfinite(window.loss_weights).all()
        np.testing.assert_allclose(window.loss_weights.sum(axis=1), 4.0)


# -- atheris (coverage-guided), when it is installed -----------------------------------

HARNESS = textwrap.dedent(
    """
    import sys
    import atheris

    with atheris.instrument_imports(include=["chronica.comm.protocol"]):
        from chronica.comm.protocol import ProtocolError, decode

    def one(data):
        try:
            decode(data[1:], 1 << 16 if data[:1] == b"p" else 4096)
        except ProtocolError:
            pass

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
    """
)


@pytest.mark.timeout(120)
def test_atheris_finds_no_decoder_crash(tmp_path):
    """Coverage-guided fuzzing of the decoder from valid seeds (skipped without atheris)."""
    pytest.importorskip("atheris")
    harness = tmp_path / "fuzz_decode.py"
    harness.write_text(HARNESS)
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for kind in ("hello", "fetch", "report", "welcome", "plan", "error"):
        (seeds / kind).write_bytes(b"p" + encode(kind, **_valid(kind)))
    # Linux carries a process's peak resident size across fork and exec, so the harness
    # starts with this test process's peak (over 2 GiB late in a full run, with torch, TF
    # and JAX loaded); libFuzzer's memory limit must sit that far above it to mean 2 GiB.
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    run = subprocess.run(
        [
            sys.executable,
            str(harness),
            "-runs=100000",
            "-seed=1",
            "-max_len=2048",
            f"-rss_limit_mb={inherited_mb + 2048}",
            str(seeds),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stderr[-3000:]
