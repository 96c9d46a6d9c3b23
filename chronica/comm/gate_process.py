"""The gate process: the coordinator's public sockets, run apart from the trainer.

One job: the loop of the child process that ``chronica.comm.gate.Gate`` starts (as
``python -I gate_process.py``): it serves the ROUTER and PUB sockets on listening sockets
the parent bound, relays one-frame requests up and answers and plans down over the private
link, and bounds what peers cost (``GateLimits``; the design is in ``chronica.comm.gate``).
It also holds what both ends share: the limits, their defaults and ``readable``.

Which connections it keeps when it must choose (real ranks first) is
``chronica.comm.admission``. This module imports only the standard library and pyzmq (and
``auth.py`` and ``admission.py`` by their paths), so a gate starts in about 0.1 s instead of
loading numpy and numba.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import os
import resource
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = [
    "BUNDLE",
    "HARD_BYTES",
    "HELLO_SECONDS",
    "LINK_HWM",
    "MAX_CONNECTIONS",
    "PEER_BYTES",
    "PER_SOURCE",
    "PUBLISH_SIZE",
    "RESTARTS_PER_MINUTE",
    "SOFT_BYTES",
    "STRANGER_FIRST",
    "STRANGER_RATE",
    "SWEEP_GROWTH",
    "GateLimits",
    "readable",
]

# Bytes a connection may send at once, and per second after that: a rank sends about 100
# bytes per step, so this leaves room for a thousand steps a second.
PEER_BYTES = 1 << 20
# The gate measures connections when its memory grew this much since it last looked.
SWEEP_GROWTH = 8 << 20
# Resident memory beyond which the gate restarts (on top of about 20 MB of interpreter).
SOFT_BYTES = 192 << 20
# The gate's address space (RLIMIT_AS): libzmq aborts rather than pass it.
HARD_BYTES = 768 << 20
# Requests a second passed on from connections that have not said a valid hello (beyond
# each one's first request), and the requests each such connection may send at once (then
# four a second): a fresh connection's hello never waits behind other strangers' floods.
STRANGER_RATE = 256
STRANGER_FIRST = 16
# A ROUTER connection that has not said a valid hello this long after it was accepted is
# cut (libzmq's own handshake interval is 30 s): a rank says hello at once.
HELLO_SECONDS = 5.0
# Connections of one source address per socket that have not proved themselves; a newer
# one makes room by cutting that source's oldest.
PER_SOURCE = 1024
# Bundles of requests queued on each end of the link between the gate and the
# coordinator, of at most ``BUNDLE`` requests: 1024 requests (4.5 MB) in all.
LINK_HWM = 32
BUNDLE = 16
# A gate that died is replaced at once (ranks ride through in a fraction of a second), at
# most this many times in any minute; beyond, the next start waits and a warning says why:
# something kills it on purpose (a peer, or the kernel short of memory).
RESTARTS_PER_MINUTE = 120
# Open TCP connections per socket: a newcomer beyond it evicts the oldest connection that
# has not proved itself (``chronica.comm.admission``), never a rank that said hello.
MAX_CONNECTIONS = 4096
# The lengths of a window's topics and plans on the link (``struct`` code, native order:
# both ends run on one machine).
PUBLISH_SIZE: Final = "I"

_MAX_SUBSCRIPTION_BYTES = 1024  # a subscription, or a CURVE handshake command
_ROUTER_RCVHWM = 256
_TICK_MS = 5
_SWEEP_EVERY_S = 1.0
_REPORT_EVERY_S = 1.0
# Offset of tcpi_bytes_received (u64) in Linux's struct tcp_info (kernel >= 4.1).
_TCPI_BYTES_RECEIVED = 128
_TCP_INFO_SIZE = 136
_WATCH = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


@dataclass(frozen=True)
class GateLimits:
    """What the gate lets peers cost (the module's constants by default; tests and
    benchmarks may lower them).

    Args:
        peer_bytes: bytes a connection may send at once, and per second after that.
        sweep_growth: memory growth of the gate that makes it measure its connections.
        soft_bytes: resident memory past which the gate restarts.
        hard_bytes: the gate's address space (``RLIMIT_AS``).
        stranger_rate: requests a second passed on from connections without a hello
            (beyond each one's first).
        stranger_burst: the burst of those (``None``: ``2 * world + 64``).
        link_hwm: bundles of requests queued on each end of the link.
        max_connections: open connections per socket; a newcomer beyond evicts the oldest
            unproven one.
        hello_seconds: how long a ROUTER connection may stay without a valid hello.
        per_source: unproven connections per socket and source address.
        stranger_first: requests an unproven connection may send at once (then 4 a second).
        restarts_per_minute: gates started at once in any minute after one died.

    Example::

        >>> GateLimits(stranger_rate=16)  # a stricter gate, for a test
    """

    peer_bytes: int = PEER_BYTES
    sweep_growth: int = SWEEP_GROWTH
    soft_bytes: int = SOFT_BYTES
    hard_bytes: int = HARD_BYTES
    stranger_rate: int = STRANGER_RATE
    stranger_burst: int | None = None  # None: 2 * world + 64
    link_hwm: int = LINK_HWM
    max_connections: int = MAX_CONNECTIONS
    hello_seconds: float = HELLO_SECONDS
    per_source: int = PER_SOURCE
    stranger_first: int = STRANGER_FIRST
    restarts_per_minute: int = RESTARTS_PER_MINUTE


def readable(sock: zmq.Socket) -> bool:
    """Whether ``sock`` has a message to read: far cheaper than the exception a
    non-blocking read of an empty queue raises.

    Args:
        sock: a ZeroMQ socket.

    Example::

        >>> while readable(link):
        ...     handle(link.recv_multipart(zmq.NOBLOCK))
    """
    return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


class _Resident:
    """This process's resident memory in bytes, read from one open ``/proc/self/statm``."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = resource.getpagesize()

    def __call__(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page


def _socket(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of ``fd`` (``None``: closed, or not a socket)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None


def _received(fd: int) -> int | None:
    """Bytes the kernel received on connection ``fd`` so far (``None``: not a TCP socket)."""
    sock = _socket(fd)
    if sock is None:
        return None
    with sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        except OSError:
            return None
    if len(info) < _TCP_INFO_SIZE:
        return None
    return int(struct.unpack_from("<Q", info, _TCPI_BYTES_RECEIVED)[0])


def _source(fd: int) -> str:
    """The peer address of connection ``fd`` (``""`` when it is gone already)."""
    sock = _socket(fd)
    if sock is None:
        return ""
    with sock:
        try:
            return str(sock.getpeername()[0])
        except OSError:
            return ""


def _cut(fd: int) -> None:
    """Shut connection ``fd`` down: libzmq sees it end and frees what it buffered."""
    sock = _socket(fd)
    if sock is None:
        return
    with sock:
        try:
            # libzmq reads the end of input and closes the connection; lingering 0 makes
            # that close a reset, so no half-closed socket stays behind with the peer's data.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass  # already gone


class _Peer:
    """One accepted connection's byte budget (a token bucket over the kernel's count)."""

    __slots__ = ("allowance", "seen", "stamp")

    def __init__(self, seen: int, allowance: float, stamp: float) -> None:
        self.seen, self.allowance, self.stamp = seen, allowance, stamp


class _Serve:
    """The gate's loop (runs in the gate process only)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.limits = GateLimits(**config["limits"])
        self.context = zmq.Context()
        self.link = self.context.socket(zmq.PAIR)
        self.link.setsockopt(zmq.LINGER, 0)
        self.link.setsockopt(zmq.SNDHWM, self.limits.link_hwm)
        self.link.connect(config["link"])
        auth = _module("auth")
        self.describe = auth.describe_handshake_failure
        self.zap = None
        curve = None
        if config["curve"] is not None:
            curve = auth.CurveServer(
                secret=config["curve"]["secret"].encode(),
                allowed=[k.encode() for k in config["curve"]["allowed"]],
            )
            self.zap = auth.ZapGate(self.context, curve)
        self.router = self.context.socket(zmq.ROUTER)
        # XPUB: a rank's subscription (to its own topic) tells its connection apart.
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.monitors = []
        for sock, fd in zip((self.router, self.pub), config["fds"], strict=True):
            sock.setsockopt(zmq.LINGER, 0)
            if config["ipv6"]:
                sock.setsockopt(zmq.IPV6, 1)
            if curve is not None:
                curve.apply(sock)
            self.monitors.append(sock.get_monitor_socket(_WATCH))
            sock.setsockopt(zmq.USE_FD, fd)
        self.router.setsockopt(zmq.MAXMSGSIZE, 4096)
        self.router.setsockopt(zmq.RCVHWM, _ROUTER_RCVHWM)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.pub.setsockopt(zmq.MAXMSGSIZE, _MAX_SUBSCRIPTION_BYTES)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.router.bind(config["urls"][0])
        self.pub.bind(config["urls"][1])
        self.admitted: set[bytes] = set()
        # Which connection each routing id arrived on, and back (strangers' and ranks').
        self.fd_of: dict[bytes, int] = {}
        self.id_of: dict[int, bytes] = {}
        self.orders: dict[bytes, Any] = {  # the coordinator's orders (see ``_down``)
            b"s": self._relay,
            b"p": lambda frames: self._publish(frames[1], frames[2]),
            b"a": self._admit,
            b"d": self._drop,
        }
        self.world = int(config["world"])
        limits = self.limits
        burst = limits.stranger_burst
        self.table = _module("admission").Admission(
            limits.max_connections,
            limits.per_source,
            limits.hello_seconds,
            limits.stranger_first,
            limits.stranger_rate,
            float(min(2 * self.world + 64, 1 << 16) if burst is None else burst),
        )
        self.peers: dict[int, _Peer] = {}
        self.failures: dict[str, int] = {}  # failed handshakes not told yet, by cause
        self.counts = {
            "dropped": 0,
            "limited": 0,
            "cut": 0,
            "frames": 0,
            "evicted": 0,
            "late": 0,
        }
        # Give what a cut connection held back to the system, so the next one starts low.
        libc = ctypes.util.find_library("c")
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
        self.trim = (lambda: trim(0)) if trim is not None else (lambda: 0)
        self.reported = dict(self.counts)

    def run(self) -> int:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)
        poller.register(self.link, zmq.POLLIN)
        poller.register(sys.stdin.fileno(), zmq.POLLIN)
        for monitor in self.monitors:
            poller.register(monitor, zmq.POLLIN)
        self.link.send_multipart([b"ready"])
        _rss = _Resident()
        base = _rss()
        swept_at, swept_rss, reported_at = time.monotonic(), base, time.monotonic()
        while True:
            ready = dict(poller.poll(_TICK_MS))
            if sys.stdin.fileno() in ready:
                return 0  # the parent closed the pipe, or ended
            for kind, monitor in enumerate(self.monitors):
                if monitor in ready:
                    self._events(kind, monitor)
            if self.link in ready:
                self._down()
            if self.router in ready:
                self._up()
            if self.pub in ready:
                self._subscriptions()
            for fd in self.table.due(time.monotonic()):
                self.counts["late"] += 1
                self._close(fd)
            if self.zap is not None:
                for key in self.zap.take_refused():
                    self._note(b"k", key)
            now, rss = time.monotonic(), _rss()
            if rss - swept_rss > self.limits.sweep_growth or now - swept_at > _SWEEP_EVERY_S:
                self._sweep(now)
                swept_at, swept_rss = now, _rss()
            if rss > self.limits.soft_bytes:
                self._note(b"x", f"memory reached {rss >> 20} MiB; restarting".encode())
                return 3
            if now - reported_at > _REPORT_EVERY_S:
                reported_at = now
                for why, count in self.failures.items():
                    self._note(b"h", why.encode(), str(count).encode())
                self.failures.clear()
                if self.counts != self.reported:
                    self.reported = dict(self.counts)
                    self._note(b"n", json.dumps(self.counts).encode())

    def _note(self, kind: bytes, *frames: bytes) -> None:
        try:
            self.link.send_multipart([kind, *frames], zmq.NOBLOCK)
        except zmq.Again:
            pass  # the coordinator is busy; notes are best effort

    def _events(self, socket_kind: int, monitor: zmq.Socket) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, fd = event["event"], event["value"]
            if kind == zmq.EVENT_ACCEPTED:
                self._accepted(socket_kind, fd)
            elif kind in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._forget(fd)
            else:  # a failed handshake: ``fd`` is its error code
                # Told once a second with a count: a flood of failing handshakes must not
                # fill the link that carries the ranks' requests.
                why = self.describe(kind, fd)
                self.failures[why] = self.failures.get(why, 0) + 1

    def _accepted(self, socket_kind: int, fd: int) -> None:
        """A new connection: make room for it (``Admission.accept``) and budget its bytes."""
        self._forget(fd)  # a reused descriptor: the connection it was is gone
        now = time.monotonic()
        for old in self.table.accept(socket_kind, fd, _source(fd), now):
            if old == fd:
                self.counts["cut"] += 1  # every other connection is a vouched rank
                _cut(fd)
                return
            self.counts["evicted"] += 1
            self._close(old)
        # Counted from the connection's first byte, read before this event was.
        self.peers[fd] = _Peer(0, self.limits.peer_bytes, now)

    def _forget(self, fd: int) -> None:
        """Connection ``fd`` is gone: drop what the gate knew of it."""
        self.peers.pop(fd, None)
        self.table.forget(fd)
        identity = self.id_of.pop(fd, None)
        if identity is not None and self.fd_of.get(identity) == fd:
            del self.fd_of[identity]

    def _close(self, fd: int) -> None:
        """Cut connection ``fd`` and forget it."""
        self._forget(fd)
        _cut(fd)

    def _admit(self, frames: list[bytes]) -> None:
        """The coordinator welcomed a connection: its requests pass unthrottled and it is
        never evicted to make room."""
        self.admitted.add(frames[1])
        fd = self.fd_of.get(frames[1])
        if fd is not None:
            self.table.vouch(fd)

    def _drop(self, frames: list[bytes]) -> None:
        self.admitted.discard(frames[1])
        fd = self.fd_of.get(frames[1])
        if fd is not None:
            self.table.unvouch(fd, time.monotonic())

    def _subscriptions(self) -> None:
        """Subscriptions on the PUB socket: one to a rank's own topic vouches for the
        connection (it is never evicted to make room); the rest only queue up."""
        for _ in range(BUNDLE):
            if not readable(self.pub):
                return
            frame = self.pub.recv(zmq.NOBLOCK, copy=False)
            data = frame.bytes
            if _rank_topic(data[1:], self.world) and data[:1] == b"\x01":
                fd = frame.get(zmq.SRCFD)
                if fd not in self.table.connections:  # as in ``_up``
                    self._events(1, self.monitors[1])
                    if fd not in self.table.connections:
                        self._accepted(1, fd)
                self.table.vouch(fd)

    def _sweep(self, now: float) -> None:
        limit = self.limits.peer_bytes
        for fd, peer in list(self.peers.items()):
            seen = _received(fd)
            if seen is None:
                self._forget(fd)
                continue
            peer.allowance = min(limit, peer.allowance + (now - peer.stamp) * limit)
            peer.allowance -= max(seen - peer.seen, 0)
            peer.seen, peer.stamp = seen, now
            if peer.allowance < 0:
                self.counts["cut"] += 1
                self._close(fd)
                self._note(b"x", f"a peer sent more than {limit} bytes a second; cut".encode())
                self.trim()

    def _up(self) -> None:
        # Requests read together travel up together: one wake-up of the coordinator for
        # the reports that ranks in lock-step send at once.
        batch = [b"m"]
        for _ in range(BUNDLE):
            if not readable(self.router):
                break
            frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            identity = frames[0].bytes
            if len(frames) != 2:
                self.counts["frames"] += 1
                self._note(b"f", identity)
                continue
            if identity not in self.admitted:
                fd = frames[1].get(zmq.SRCFD)
                if fd not in self.table.connections:
                    # Its ACCEPTED event is still queued behind others (a flood): read it
                    # first, or a joining rank's hello would count as no connection's; an
                    # event the monitor dropped (its queue was full) is made up for here.
                    self._events(0, self.monitors[0])
                    if fd not in self.table.connections:
                        self._accepted(0, fd)
                if self.fd_of.get(identity) != fd:
                    self.fd_of[identity], self.id_of[fd] = fd, identity
                if not self.table.allow(fd, time.monotonic()):
                    self.counts["limited"] += 1
                    continue
            batch += (identity, frames[1].bytes)
        if len(batch) > 1:
            try:
                self.link.send_multipart(batch, zmq.NOBLOCK)
            except zmq.Again:
                self.counts["dropped"] += len(batch) // 2

    def _publish(self, sizes: bytes, parts: bytes) -> None:
        """Publish ``parts``, (topic, message) pairs laid end to end, of the lengths in
        ``sizes`` (``PUBLISH_SIZE`` values)."""
        view, at = memoryview(parts), 0
        lengths = memoryview(sizes).cast(PUBLISH_SIZE)
        for i in range(0, len(lengths) - 1, 2):
            middle, end = at + lengths[i], at + lengths[i] + lengths[i + 1]
            try:
                self.pub.send(view[at:middle], zmq.SNDMORE | zmq.NOBLOCK)
                self.pub.send(view[middle:end], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # PUB drops for a slow subscriber: it fetches what it missed
            at = end

    def _down(self) -> None:
        # What the coordinator asks, by the first frame: s(end) to a connection, p(ublish)
        # a window, a(dmit) or d(rop) a connection from the unthrottled set.
        for _ in range(4096):
            if not readable(self.link):
                return
            frames = self.link.recv_multipart(zmq.NOBLOCK)
            order = self.orders.get(frames[0])
            if order is not None:
                order(frames)

    def _relay(self, frames: list[bytes]) -> None:
        try:
            self.router.send_multipart(frames[1:], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or its queue is full: it times out and falls back


def _rank_topic(topic: bytes, world: int) -> bool:
    """Whether ``topic`` is one rank's PUB topic (``chronica.comm.protocol.topic``)."""
    head, digits, tail = topic[:9], topic[9:16], topic[16:]
    return head == b"chronica/" and tail == b"/" and digits.isdigit() and int(digits) < world


def _module(name: str) -> Any:
    """``chronica.comm.<name>`` loaded by its path: it needs only pyzmq, and importing the
    package would load numpy and numba for nothing."""
    spec = importlib.util.spec_from_file_location(
        f"_chronica_gate_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _main() -> int:
    config = json.loads(sys.stdin.buffer.readline())
    hard = config["limits"]["hard_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Room for both sockets' connections: with the common soft limit of 1024 descriptors a
    # thousand idle connections would leave a rank nothing to connect with.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * int(config["limits"]["max_connections"]) + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < wanted:  # fewer descriptors than the cap: the cap follows them
            config["limits"]["max_connections"] = max(16, (raised - 256) // 2)
    try:
        return _Serve(config).run()
    except MemoryError:
        return 3


if __name__ == "__main__":
    raise SystemExit(_main())
