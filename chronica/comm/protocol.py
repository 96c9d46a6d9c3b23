"""The wire protocol between ranks and the coordinator: versioned, size-capped msgpack.

Every message is a msgpack map with ``v`` (protocol version) and ``t`` (type). Index arrays
travel as msgpack ``bin`` of little-endian int64, floats as little-endian float64; arrival
is ``numpy.frombuffer``, never a Python list. Nothing is unpickled or evaluated. Decoding
checks size, version, type and every field (type, range, array lengths) before anything
uses the message, and raises ``ProtocolError`` naming what is wrong.

Ranks send on a DEALER socket to the coordinator's ROUTER:

``hello``   rank, world, digest (sizes + configuration)    -> ``welcome`` or ``error``
``fetch``   rank, epoch, first (a window's first step)      -> ``plan`` or ``error``
            [ahead: a prefetch; if the window is published after this connection's hello,
            the PUB copy answers it]
``report``  rank, epoch, step, load, seconds                (an ``error`` only if refused)
            [work: a packed step's pieces, tokens and squared tokens, three float64]

A connection must say ``hello`` before it fetches or reports. An ``error`` carries a
``code`` (see ``ProtocolError``) and a message; one that answers a ``fetch`` also carries
that fetch's ``epoch`` and ``first``, so the rank falls back for that window at once.

The coordinator publishes every planned window on its PUB socket as one ``plan`` per rank,
under the topic ``topic(rank)``, with a sequence number that grows by one per window. A
packed window's plan also carries ``row`` (each piece's row), ``nm`` (micro-batches per
step), ``mo`` (micro-batch offsets into the rank's pieces) and ``mw`` (their loss
weights); its ``idx`` are then piece numbers (``chronica.core.packing.Pieces``). A rank
receives only its own part: its bytes per step do not grow with the world. Whether the
ranks' parts together partition each step, the ranks establish among themselves over
their framework's channel (``chronica.runtime.window``), never over this protocol.

Limits (what a peer can make the decoder allocate or the planner compute with): a request
is at most ``MAX_REQUEST_BYTES``; a message is one flat map (``chronica.comm.flatmap``:
at most 32 entries, no array or nested map, checked on the raw bytes first); msgpack
containers are capped (``max_map_len``, ``max_array_len``, ``max_str_len``,
``max_bin_len``, no ext types) before anything is allocated; ranks and worlds are below
``MAX_WORLD``; epochs and steps at most ``MAX_STEPS``; a report's ``seconds`` and ``load``
are 0 or within ``REPORT_SECONDS`` / ``REPORT_LOAD``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from chronica.comm.flatmap import flat_map_problem

__all__ = [
    "MAX_GENERATION",
    "MAX_REQUEST_BYTES",
    "MAX_STEPS",
    "MAX_WORLD",
    "REPORT_LOAD",
    "REPORT_SECONDS",
    "VERSION",
    "Micro",
    "Plan",
    "ProtocolError",
    "decode",
    "encode",
    "plan_message",
    "plan_messages",
    "tcp_url",
    "topic",
]

# 2: plans carry ``gen``, the planning that made them (ranks agree on it before use).
# 3: no ``window`` message (ranks check a window by a keyed multiset hash among themselves).
VERSION = 3
# Requests (hello, fetch, report) are tiny; anything bigger is refused before unpacking.
MAX_REQUEST_BYTES = 4096
MAX_WORLD = 1 << 20
MAX_STEPS = 1 << 40
# Plan generations are positive 31-bit ints, so every framework can all-reduce them.
MAX_GENERATION = (1 << 31) - 1
# A report is a measurement: nanosecond clocks, steps shorter than eleven days, loads of any
# cost unit the planner accepts (a step of samples costing up to ``core.cost.MAX_COST``,
# 2**128, each). Outside these ranges (0 aside) the time fit's arithmetic under- or
# overflows and a single report could stall the planner, so such reports are refused.
REPORT_SECONDS = (1e-9, 1e6)
REPORT_LOAD = (1e-12, 1e60)


class ProtocolError(ValueError):
    """A message that is not a valid chronica message, or a request the coordinator
    refuses; the text says why.

    ``code`` travels in the ``error`` answer: ``"protocol"`` (malformed or out of range),
    ``"hello"`` (the connection has not said hello: the rank says it again), ``"stale"``
    (the window is too far behind or ahead of the job to be planned consistently).

    Args:
        message: what is wrong, for the log and the ``error`` answer.
        code: the error code.

    Example::

        >>> raise ProtocolError("say hello first", code="hello")
    """

    def __init__(self, message: str, code: str = "protocol") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Micro:
    """A packed window's micro-batches of one rank: step ``i`` has ``counts[i]``
    micro-batches, micro-batch ``j`` (counted over the window) holds the rank's pieces
    ``offsets[j] .. offsets[j + 1]`` of the window (each in row ``rows[k]``) and weighs
    ``weights[j]``.

    Args:
        rows: each piece's row.
        counts: micro-batches per step.
        offsets: where each micro-batch starts in the rank's pieces (one more than them).
        weights: each micro-batch's loss weight.

    Example::

        >>> Micro(rows=np.array([0, 1]), counts=np.array([1]), offsets=np.array([0, 2]),
        ...       weights=np.array([1.0]))
    """

    rows: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray


@dataclass(frozen=True)
class Plan:
    """One rank's part of one window: ``indices[offsets[i]:offsets[i+1]]`` at step
    ``first + i``, with its loss weight and predicted load (a packed window: piece numbers,
    and ``micro``). ``gen`` names the planning that made it: every rank's part of a window
    planned once carries the same ``gen``, and a restarted coordinator plans under a new
    one, so ranks holding parts of two different plans of one window can tell before using
    them.

    Args:
        seq: the window's sequence number (one more per window the coordinator plans).
        gen: the planning that made it.
        epoch: the window's epoch.
        first: its first step.
        indices: the rank's samples (packed: piece numbers), step after step.
        offsets: where each step starts in ``indices`` (one more than the steps).
        weights: each step's loss weight.
        loads: each step's predicted load.
        micro: a packed window's micro-batches.

    Example::

        >>> plan = decode(payload, 1 << 20)["plan"]
        >>> plan.local(plan.first)  # this rank's samples of the window's first step
    """

    seq: int
    gen: int
    epoch: int
    first: int
    indices: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray
    loads: np.ndarray
    micro: Micro | None = None

    @property
    def num_steps(self) -> int:
        """The steps of the window."""
        return int(self.offsets.shape[0] - 1)

    def local(self, step: int) -> np.ndarray:
        """The rank's samples (packed: piece numbers) of ``step``.

        Args:
            step: a step of the window (``first <= step < first + num_steps``).
        """
        i = step - self.first
        return self.indices[self.offsets[i] : self.offsets[i + 1]]

    def micro_batches(self, step: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """A packed window's micro-batches of ``step``: ``(pieces, rows, loss_weight)``.

        Args:
            step: a step of the window.
        """
        assert self.micro is not None
        i = step - self.first
        micro = self.micro
        first = int(micro.counts[:i].sum())
        out = []
        for j in range(first, first + int(micro.counts[i])):
            a, b = micro.offsets[j], micro.offsets[j + 1]
            out.append((self.indices[a:b], micro.rows[a:b], float(micro.weights[j])))
        return out


def tcp_url(host: str, port: int | str) -> str:
    """The ZeroMQ TCP endpoint of ``host:port``; IPv6 literals are bracketed.

    Args:
        host: a host name or address.
        port: the port.

    Example::

        >>> tcp_url("::1", 5000)
        'tcp://[::1]:5000'
    """
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def topic(rank: int) -> bytes:
    """The PUB topic of ``rank``; fixed width so that no rank's topic prefixes another's.

    Args:
        rank: the rank.

    Example::

        >>> topic(3)
        b'chronica/0000003/'
    """
    return b"chronica/%07d/" % rank


def encode(kind: str, **fields: Any) -> bytes:
    """A message of type ``kind``; numpy arrays must already be ``bytes``.

    Args:
        kind: the message type (``hello``, ``fetch``, ``report``, ``welcome``, ...).
        fields: its fields (see the module docstring).

    Example::

        >>> decode(encode("fetch", rank=0, epoch=0, first=16))["first"]
        16
    """
    return msgpack.packb({"v": VERSION, "t": kind, **fields}, use_bin_type=True)


def plan_message(
    seq: int,
    gen: int,
    epoch: int,
    first: int,
    indices: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray,
    loads: np.ndarray,
    micro: Micro | None = None,
) -> bytes:
    """Encode one rank's part of a window (with ``micro`` for a packed one).

    Args:
        seq: the window's sequence number.
        gen: the planning (coordinator generation) that made it.
        epoch: the window's epoch.
        first: its first step.
        indices: the rank's samples (a packed window: piece numbers), step after step.
        offsets: where each step starts in ``indices`` (one more than the steps).
        weights: each step's loss weight.
        loads: each step's predicted load.
        micro: a packed window's micro-batches of the rank.

    Example::

        >>> payload = plan_message(0, 1, 0, 0, np.arange(4), np.array([0, 2, 4]),
        ...                        np.ones(2), np.ones(2))
        >>> decode(payload, 1 << 20)["plan"].local(1)
        array([2, 3])
    """
    packed = {}
    if micro is not None:
        packed = {
            "row": np.ascontiguousarray(micro.rows, "<i8").tobytes(),
            "nm": np.ascontiguousarray(micro.counts, "<i8").tobytes(),
            "mo": np.ascontiguousarray(micro.offsets, "<i8").tobytes(),
            "mw": np.ascontiguousarray(micro.weights, "<f8").tobytes(),
        }
    return encode(
        "plan",
        seq=int(seq),
        gen=int(gen),
        epoch=int(epoch),
        first=int(first),
        idx=np.ascontiguousarray(indices, "<i8").tobytes(),
        off=np.ascontiguousarray(offsets, "<i8").tobytes(),
        w=np.ascontiguousarray(weights, "<f8").tobytes(),
        load=np.ascontiguousarray(loads, "<f8").tobytes(),
        **packed,
    )


def _bin_header(size: int) -> bytes:
    """msgpack's header of a ``bin`` of ``size`` bytes (the smallest form, as ``packb``)."""
    if size < 1 << 8:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _bin_field(name: str, size: int) -> np.ndarray:
    """A map entry's key and the header of its ``bin`` value, as bytes in a numpy row."""
    return np.frombuffer(msgpack.packb(name) + _bin_header(size), np.uint8)


def plan_messages(
    seq: int,
    gen: int,
    epoch: int,
    first: int,
    indices: np.ndarray,
    runs: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray,
    loads: np.ndarray,
) -> list[bytes]:
    """Every rank's part of an unpacked window at once: message ``r`` is exactly
    ``plan_message(seq, gen, epoch, first, indices[runs[r]:runs[r + 1]], offsets[:, r],
    weights[:, r], loads[:, r])`` (``offsets`` has one row more than the window has steps).

    The map's header and scalars are packed once per window and the columns converted in
    one pass each, so a rank costs one join of ready bytes instead of a msgpack map.

    Args:
        seq: the window's sequence number.
        gen: the planning (coordinator generation) that made it.
        epoch: the window's epoch.
        first: its first step.
        indices: every rank's samples, rank after rank (each rank's steps in order).
        runs: where each rank's samples start in ``indices`` (one more than the ranks).
        offsets: each rank's step offsets, a column per rank.
        weights: each step's loss weight, a column per rank.
        loads: each step's predicted load, a column per rank.

    Example::

        >>> messages = plan_messages(0, 1, 0, 0, indices, runs, offsets, weights, loads)
        >>> len(messages) == offsets.shape[1]
        True
    """
    steps = weights.shape[0]
    head = bytearray(
        msgpack.packb(
            {"v": VERSION, "t": "plan", "seq": int(seq), "gen": int(gen)}
            | {"epoch": int(epoch), "first": int(first)}
        )
    )
    head[0] += 4  # a fixmap's count is in its first byte: the four arrays follow
    head += msgpack.packb("idx")
    # The fixed-size rest of every rank's message, one row per rank, built column-wise.
    columns = [
        (_bin_field("off", 8 * (steps + 1)), np.ascontiguousarray(offsets.T, "<i8")),
        (_bin_field("w", 8 * steps), np.ascontiguousarray(weights.T, "<f8")),
        (_bin_field("load", 8 * steps), np.ascontiguousarray(loads.T, "<f8")),
    ]
    world = offsets.shape[1]
    tail = np.concatenate(
        [
            part
            for field, values in columns
            for part in (np.broadcast_to(field, (world, field.shape[0])), values.view(np.uint8))
        ],
        axis=1,
    )
    width = tail.shape[1]
    rest = tail.tobytes()
    data = np.ascontiguousarray(indices, "<i8").tobytes()
    bounds = (8 * np.asarray(runs, np.int64)).tolist()
    prefix = bytes(head)
    return [
        b"".join((prefix, _bin_header(b - a), data[a:b], rest[r * width : (r + 1) * width]))
        for r, (a, b) in enumerate(itertools.pairwise(bounds))
    ]


def _int(message: dict[str, Any], name: str, low: int, high: int) -> int:
    value = message.get(name)
    # msgpack decodes integers to Python ints only (no numpy), so isinstance is exact here
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"field {name!r}={value!r} must be an int in [{low}, {high}]")
    return value


def _float(message: dict[str, Any], name: str, bounds: tuple[float, float]) -> float:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"field {name!r}={value!r} must be a number")
    low, high = bounds
    if not (value == 0 or (math.isfinite(value) and low <= value <= high)):
        raise ProtocolError(f"field {name!r}={value!r} must be 0 or in [{low:g}, {high:g}]")
    return float(value)


def _array(message: dict[str, Any], name: str, dtype: str) -> np.ndarray:
    blob = message.get(name)
    if not isinstance(blob, bytes) or len(blob) % 8:
        raise ProtocolError(f"field {name!r} must be bytes of 8-byte {dtype} values")
    return np.frombuffer(blob, dtype=dtype)


_FIELDS = {
    "hello": ("rank", "world", "digest"),
    "fetch": ("rank", "epoch", "first"),
    "report": ("rank", "epoch", "step", "load", "seconds"),
    "welcome": ("window", "steps"),
    "plan": ("seq", "gen", "epoch", "first", "idx", "off", "w", "load"),
    "error": ("code", "msg"),
}


def decode(frame: bytes, max_bytes: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    """Validate and decode one message; plans come back with a ``Plan`` under ``"plan"``.

    Anything but a valid message of at most ``max_bytes`` is a ``ProtocolError`` naming
    what is wrong (never another exception, whatever the bytes).

    Args:
        frame: the message's bytes.
        max_bytes: the largest message accepted (requests: ``MAX_REQUEST_BYTES``).

    Example::

        >>> decode(encode("hello", rank=0, world=2, digest="ab"))["world"]
        2
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError("a message must be bytes")
    # len() of a memoryview counts items, which need not be bytes.
    size = frame.nbytes if isinstance(frame, memoryview) else len(frame)
    if size > max_bytes:
        raise ProtocolError(f"message of {size} bytes exceeds the limit of {max_bytes}")
    # No message nests containers: refused at their first byte, before msgpack works.
    problem = flat_map_problem(frame)
    if problem is not None:
        raise ProtocolError(problem)
    try:
        message = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=4096,
            max_array_len=64,
            max_map_len=32,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types for malformed input
        raise ProtocolError(f"not a msgpack message ({type(exc).__name__}: {exc})") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a msgpack map")
    version = message.get("v")
    if type(version) is not int or version != VERSION:  # True == 1 and 1.0 == 1 are no version
        raise ProtocolError(f"protocol version {version!r} is not {VERSION}")
    kind = message.get("t")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise ProtocolError(f"message type {kind!r} is not one of {sorted(_FIELDS)}")
    missing = [name for name in _FIELDS[kind] if name not in message]
    if missing:
        raise ProtocolError(f"{kind} message lacks {missing}")
    _VALIDATE[kind](message)
    return message


def _rank(message: dict[str, Any]) -> None:
    _int(message, "rank", 0, MAX_WORLD - 1)


def _hello(message: dict[str, Any]) -> None:
    _rank(message)
    _int(message, "world", 1, MAX_WORLD)
    digest = message["digest"]
    if not isinstance(digest, str) or not 0 < len(digest) <= 128:
        raise ProtocolError("field 'digest' must be a non-empty string")


def _fetch(message: dict[str, Any]) -> None:
    _rank(message)
    _int(message, "epoch", 0, MAX_STEPS)
    _int(message, "first", 0, MAX_STEPS)
    if type(message.get("ahead", False)) is not bool:
        raise ProtocolError(f"field 'ahead'={message['ahead']!r} must be a bool")


def _report(message: dict[str, Any]) -> None:
    _rank(message)
    _int(message, "epoch", 0, MAX_STEPS)
    _int(message, "step", 0, MAX_STEPS)
    _float(message, "load", REPORT_LOAD)
    _float(message, "seconds", REPORT_SECONDS)
    if "work" in message:
        work = _array(message, "work", "<f8")
        if work.shape != (3,) or not np.isfinite(work).all() or (work < 0).any():
            raise ProtocolError("field 'work' must be 3 finite float64 values >= 0")
        if work.max() > REPORT_LOAD[1]:
            raise ProtocolError(f"field 'work' values must be at most {REPORT_LOAD[1]:g}")
        message["work"] = work


def _welcome(message: dict[str, Any]) -> None:
    _int(message, "window", 1, MAX_STEPS)
    _int(message, "steps", 0, MAX_STEPS)


def _error(message: dict[str, Any]) -> None:
    if not isinstance(message["code"], str) or not isinstance(message["msg"], str):
        raise ProtocolError("error message fields must be strings")
    if "epoch" in message or "first" in message:
        _int(message, "epoch", 0, MAX_STEPS)
        _int(message, "first", 0, MAX_STEPS)


def _plan_fields(message: dict[str, Any]) -> None:
    message["plan"] = _plan(message)


# Each message type's checks, beyond the presence of its ``_FIELDS``.
_VALIDATE = {
    "hello": _hello,
    "fetch": _fetch,
    "report": _report,
    "welcome": _welcome,
    "error": _error,
    "plan": _plan_fields,
}


def _plan(message: dict[str, Any]) -> Plan:
    indices = _array(message, "idx", "<i8")
    offsets = _array(message, "off", "<i8")
    weights = _array(message, "w", "<f8")
    loads = _array(message, "load", "<f8")
    steps = offsets.shape[0] - 1
    if steps < 1 or weights.shape[0] != steps or loads.shape[0] != steps:
        raise ProtocolError("plan arrays disagree on the number of steps")
    if offsets[0] != 0 or offsets[-1] != indices.shape[0] or (offsets[1:] < offsets[:-1]).any():
        raise ProtocolError("plan offsets must rise from 0 to the number of indices")
    if indices.shape[0] and indices.min() < 0:
        raise ProtocolError("plan indices must be >= 0")
    values = np.concatenate((weights, loads))
    # Two reductions pass every valid plan (NaN fails both comparisons); what fails them is
    # told apart in order. Every numpy call costs a plan's decoding microseconds.
    if not (values.min() >= 0 and values.max() < np.inf):
        if not np.isfinite(values).all():
            raise ProtocolError("plan weights and loads must be finite")
        raise ProtocolError("plan weights and loads must be >= 0")
    micro = _micro(message, indices.shape[0], steps) if "nm" in message else None
    return Plan(
        micro=micro,
        seq=_int(message, "seq", 0, MAX_STEPS),
        gen=_int(message, "gen", 1, MAX_GENERATION),
        epoch=_int(message, "epoch", 0, MAX_STEPS),
        first=_int(message, "first", 0, MAX_STEPS),
        indices=indices,
        offsets=offsets,
        weights=weights,
        loads=loads,
    )


def _micro(message: dict[str, Any], pieces: int, steps: int) -> Micro:
    """A packed plan's micro-batches, checked against its ``pieces`` and ``steps``."""
    missing = [name for name in ("row", "nm", "mo", "mw") if name not in message]
    if missing:
        raise ProtocolError(f"packed plan lacks {missing}")
    rows = _array(message, "row", "<i8")
    counts = _array(message, "nm", "<i8")
    offsets = _array(message, "mo", "<i8")
    weights = _array(message, "mw", "<f8")
    if rows.shape[0] != pieces or counts.shape[0] != steps or (counts < 1).any():
        raise ProtocolError("packed plan rows or micro-batch counts disagree with the plan")
    total = int(counts.sum())
    if offsets.shape[0] != total + 1 or weights.shape[0] != total:
        raise ProtocolError("packed plan micro-batch offsets or weights have the wrong length")
    if offsets[0] != 0 or offsets[-1] != pieces or (np.diff(offsets) < 0).any():
        raise ProtocolError("packed plan micro-batch offsets must rise from 0 to the pieces")
    if (rows < 0).any() or not np.isfinite(weights).all() or (weights < 0).any():
        raise ProtocolError("packed plan rows and weights must be >= 0 and finite")
    return Micro(rows, counts, offsets, weights)
