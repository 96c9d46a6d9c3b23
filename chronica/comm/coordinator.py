"""The coordinator: rank 0's plan server for ``kind="dynamic"``.

It owns a ``DynamicPlanner`` and two ZeroMQ sockets, both driven by one background thread:

* a ROUTER socket answering ``hello`` (digest check), ``fetch`` (a window's plan: gap
  recovery and late joiners) and taking ``report`` messages (feedback);
* a PUB socket publishing every window as soon as it is planned, one message per rank
  under the rank's own topic, with a sequence number (the reliable pub-sub pattern: a
  subscriber that missed a message fetches it by ROUTER).

A window is planned when any rank asks for it, or early, when reports reach the middle of
the window before it, so ranks hold it before they need it. Malformed, oversized or
wrong-version messages are refused with an ``error`` answer and counted; the coordinator
keeps serving. ``close()`` stops the thread and closes both sockets; ``with`` does the same.

Exposure: it binds one address (``resolve_bind``: loopback unless told otherwise, every
interface only when asked for by name), caps every incoming frame (``zmq.MAXMSGSIZE``) and
optionally admits only CURVE-authenticated peers (``chronica.comm.auth``). SECURITY.md
states what that does and does not protect against.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from chronica.comm.auth import CurveServer
from chronica.comm.gate import PUBLISH_SIZE, Gate, GateLimits, readable
from chronica.comm.protocol import (
    MAX_GENERATION,
    MAX_WORLD,
    Micro,
    ProtocolError,
    decode,
    encode,
    plan_message,
    plan_messages,
    tcp_url,
)
from chronica.comm.protocol import topic as rank_topic
from chronica.core.checks import check_int
from chronica.core.dynamic import DynamicPlanner
from chronica.core.plan import WindowPlan
from chronica.core.scheduler import Scheduler

__all__ = [
    "DEFAULT_PORT",
    "ENV_BIND",
    "Coordinator",
    "CoordinatorStats",
    "resolve_bind",
    "resolve_endpoint",
    "resolve_port",
]

logger = logging.getLogger("chronica")

DEFAULT_PORT = 50051
ENV_BIND = "CHRONICA_BIND"
_POLL_MS = 50
_WILDCARDS = {"*": "0.0.0.0", "0.0.0.0": "0.0.0.0", "::": "::", "[::]": "::"}
# Planning runs at most this many steps (and at least 4 windows) ahead of the slowest rank:
# room for prefetching data loaders, never whole epochs that no rank needs yet.
_HORIZON_STEPS = 64
# An error answer quotes the refused input; keep it far below the ranks' string cap.
_MAX_ERROR_TEXT = 512


def _port(value: object, name: str) -> int:
    hint = " (0: any free port; the coordinator also uses the next port)"
    return check_int(name, value, 0, 65534, hint)


def resolve_port(port: int | None = None) -> int:
    """The coordinator's ROUTER port: ``port``, else ``CHRONICA_PORT``, else
    ``DEFAULT_PORT``; the PUB socket uses the next one."""
    if port is not None:
        return _port(port, "port")
    text = os.environ.get("CHRONICA_PORT")
    if not text:
        return DEFAULT_PORT
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"CHRONICA_PORT={text!r} must be a port number") from None
    return _port(value, "CHRONICA_PORT")


def resolve_endpoint(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where ranks connect: ``(host, port)`` from the arguments, else ``MASTER_ADDR`` /
    ``CHRONICA_PORT``, else loopback and ``DEFAULT_PORT``. The PUB socket uses ``port + 1``.
    A wildcard ``host`` (a bind-everywhere address) is not connectable: ``MASTER_ADDR`` or
    loopback stands for it."""
    if host is not None and (not isinstance(host, str) or not host.strip()):
        raise ValueError(f"host={host!r} must be a host name or address")
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    host = host or master
    if _everywhere(host):
        host = master if not _everywhere(master) else "127.0.0.1"
    return host, resolve_port(port)


def _everywhere(host: str) -> bool:
    """Whether ``host`` is a spelling of "all interfaces" (``*``, ``0.0.0.0``, ``0``,
    ``0.0``, ``::``, ``::0``...), which binds everywhere and connects nowhere."""
    literal = host.strip().removeprefix("[").removesuffix("]")
    if literal in _WILDCARDS:
        return True
    try:
        return ipaddress.ip_address(literal).is_unspecified
    except ValueError:
        pass
    try:
        return socket.inet_aton(literal) == bytes(4)  # the short IPv4 forms: "0", "0.0"
    except OSError:
        return False


def resolve_bind(host: str | None = None) -> tuple[str, str]:
    """The numeric address the coordinator binds, and the setting it came from.

    ``host`` if given, else ``CHRONICA_BIND``, else ``MASTER_ADDR``, else ``127.0.0.1``; a
    host name is resolved (ZeroMQ binds addresses, not names). Every interface (``*``,
    ``0.0.0.0``, ``::`` or any other spelling: ``0``, ``0.0``, ``::0``, a name resolving to
    one) is bound only when ``host`` or ``CHRONICA_BIND`` says so: a ``MASTER_ADDR`` that
    means every interface is an error, never a silent bind to every interface.
    """
    candidates = (
        ("host", host),
        (ENV_BIND, os.environ.get(ENV_BIND) or None),
        ("MASTER_ADDR", os.environ.get("MASTER_ADDR") or None),
    )
    for source, value in candidates:
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{source}={value!r} must be a host name or address")
        value = value.strip()
        address = _WILDCARDS.get(value) or _numeric(value, source)
        # Every spelling of "all interfaces", a name that resolves to one included.
        if _everywhere(address.split("%")[0]) and source == "MASTER_ADDR":
            raise ValueError(
                f"MASTER_ADDR={value!r} would make the coordinator listen on every "
                f"interface; set MASTER_ADDR to this node's address, or {ENV_BIND}=0.0.0.0 "
                f"to listen everywhere on purpose (then enable CURVE: see SECURITY.md)"
            )
        return address, source
        return address, source
    return "127.0.0.1", "default"


def _numeric(host: str, source: str) -> str:
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(literal))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(literal, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise ValueError(
            f"{source}={host!r} does not resolve ({exc}); give this node's IP address"
        ) from None
    addresses = [a for a in (info[4][0] for info in infos) if isinstance(a, str)]
    return next((a for a in addresses if ":" not in a), addresses[0])


@dataclass
class CoordinatorStats:
    """What the coordinator did: requests served, reports taken, messages refused.

    ``rejected`` counts every refused message; ``refused`` splits it by the code of the
    ``error`` answer (``protocol``, ``frames``, ``hello``, ``stale``, ``digest``, ``world``,
    ``internal``). ``handshake_failures`` counts connections that failed the ZeroMQ or CURVE
    handshake (they never reach the message count), ``refused_keys`` the CURVE keys the
    allow-list turned away, ``duplicate_hellos`` a rank saying hello on a second connection,
    ``prefetches_by_pub`` the prefetches left to the PUB copy of a window (see ``_fetch``),
    ``cpu_seconds`` the processor time of the serving thread (what it takes from the
    training process it runs in). ``gate_restarts`` counts gate processes replaced (see
    ``chronica.comm.gate``), ``gate`` what the gate turned away: ``cut`` connections past
    their byte budget, ``limited`` requests of strangers past their rate, ``dropped``
    requests past the link's queue, ``frames`` messages of more than one frame.
    """

    hellos: int = 0
    fetches: int = 0
    reports: int = 0
    windows: int = 0
    published_bytes: int = 0
    published_indices: int = 0
    rejected: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    handshake_failures: int = 0
    refused_keys: int = 0
    duplicate_hellos: int = 0
    prefetches_by_pub: int = 0
    cpu_seconds: float = 0.0
    gate_restarts: int = 0
    gate: dict[str, int] = field(default_factory=dict)


class _Throttle:
    """Warnings caused by peers: a burst in full, then at most ``rate`` per second, with a
    count of those left out, so a hostile peer cannot flood the log."""

    def __init__(self, burst: int = 10, rate: float = 0.2) -> None:
        self.burst, self.rate = burst, rate
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._suppressed = 0

    def warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens < 1:
            self._suppressed += 1
            return
        self._tokens -= 1
        if self._suppressed:
            message += " (%d similar warnings left out)"
            args = (*args, self._suppressed)
            self._suppressed = 0
        logger.warning(message, *args)


class Coordinator:
    """Serves ``kind="dynamic"`` plans of ``scheduler`` to its ranks.

    Binds ``resolve_bind(host)`` (loopback unless ``host``, ``CHRONICA_BIND`` or
    ``MASTER_ADDR`` names another address; every interface only when ``host`` or
    ``CHRONICA_BIND`` is ``*``/``0.0.0.0``/``::``) on ``port`` (ROUTER) and ``port + 1``
    (PUB); ``port=0`` picks free ports (see ``endpoint``). A port already in use is a
    ``RuntimeError`` that names it and the fix. ``curve`` (default: ``CurveServer.from_env()``,
    off when no ``CHRONICA_CURVE_*`` variable is set) admits only CURVE peers whose public
    key is on its allow-list. ``start()`` returns at once; the thread serves until
    ``close()``.

    The sockets live in a gate process (``chronica.comm.gate``, bounds in ``limits``), so
    nothing a peer sends reaches this process except single-frame requests of at most
    ``MAX_REQUEST_BYTES``, at a bounded rate; a gate that dies is replaced on the same ports.

    Guarantees: no input from a peer stops the thread or grows memory without bound
    (frames are capped, the peer table is bounded, plans are kept for two epochs); a window
    is planned at most once, so every rank that receives it receives the same plan, marked
    with this coordinator's ``generation`` (random, so a restarted coordinator's plans of the
    same window are told apart from the first one's).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        host: str | None = None,
        port: int | None = None,
        *,
        context: zmq.Context | None = None,
        curve: CurveServer | None = None,
        limits: GateLimits | None = None,
    ) -> None:
        if not isinstance(scheduler, Scheduler):
            raise ValueError(f"scheduler must be a chronica Scheduler, not {type(scheduler)}")
        world = scheduler.config.num_replicas
        if world > MAX_WORLD:
            raise ValueError(f"num_replicas={world} exceeds the protocol's {MAX_WORLD} ranks")
        if context is not None and not isinstance(context, zmq.Context):
            raise ValueError(f"context must be a zmq.Context, not {type(context)}")
        if curve is not None and not isinstance(curve, CurveServer):
            raise ValueError(f"curve must be a CurveServer, not {type(curve)}")
        if limits is not None and not isinstance(limits, GateLimits):
            raise ValueError(f"limits must be a chronica.comm.gate.GateLimits, not {type(limits)}")
        self.planner = DynamicPlanner(scheduler)
        self.scheduler = scheduler
        self.host, self.bind_source = resolve_bind(host)
        self._port = resolve_port(port)
        self.curve = curve if curve is not None else CurveServer.from_env()
        self.stats = CoordinatorStats()
        self._given_context = context
        self._context: zmq.Context | None = None
        self._limits = limits
        self._gate: Gate | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seq: dict[tuple[int, int], int] = {}
        # This coordinator's plans, told apart from those of one it replaces (a restart):
        # ranks use a window only if they all hold parts of the same planning of it.
        self.generation = secrets.randbelow(MAX_GENERATION) + 1
        # Where each connection last said it is, (epoch, step) of a fetch or report: the
        # job's progress is the slowest rank's, and planning stays within a horizon of it.
        self._pos: dict[bytes, tuple[int, int]] = {}
        # The newest window's parts regrouped by rank (``_by_rank``), for its messages.
        self._layout: tuple[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None
        self._layout = None
        self.horizon = max(4 * self.planner.window, _HORIZON_STEPS)
        # Which rank each connection (ROUTER routing id) said hello as, oldest first.
        self._peers: OrderedDict[bytes, int] = OrderedDict()
        self._holder: dict[int, bytes] = {}
        # Windows published before each connection's hello (their count then): a later one
        # reached its SUB socket, so a prefetch of it needs no second copy.
        self._joined: dict[bytes, int] = {}
        self._max_peers = 2 * world + 64
        self._throttle = _Throttle()
        self._traceback_logged = False
        self.endpoint: tuple[str, int, int] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Coordinator:
        """Bind both sockets and start serving in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the coordinator is already running")
        self._stop.clear()
        try:
            self._open()
        except BaseException:
            self._shut()
            raise
        assert self.endpoint is not None
        self._thread = threading.Thread(
            target=self._serve, name="chronica-coordinator", daemon=True
        )
        self._thread.start()
        if self.curve is None and self.host in ("0.0.0.0", "::"):
            logger.warning(
                "chronica: the coordinator listens on every interface without authentication; "
                "anyone who reaches ports %d-%d can talk to it (see SECURITY.md: CURVE)",
                self.endpoint[1],
                self.endpoint[2],
            )
        logger.info(
            "chronica: coordinator serving on %s:%d (pub %d), bind address from %s, %s",
            *self.endpoint,
            self.bind_source,
            f"CURVE on ({len(self.curve.allowed)} keys)" if self.curve else "no authentication",
        )
        return self

    def _open(self) -> None:
        self._context = self._given_context or zmq.Context.instance()
        world = self.scheduler.config.num_replicas
        ports = (self._port, 0 if self._port == 0 else self._port + 1)
        self._gate = gate = Gate(self._context, self.host, ports, world, self.curve, self._limits)
        try:
            gate.bind()
        except OSError as exc:
            port, role = gate.failed_port
            raise RuntimeError(self._bind_error(exc, port, role)) from exc
        gate.open()
        self.endpoint = (self.host, *gate.ports)

    def _bind_error(self, exc: OSError, port: int, role: str) -> str:
        where = f"{self.host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            what = "port" if role == "router" else f"port {port} (port + 1, for publishing) of"
            return (
                f"chronica coordinator cannot bind {where}: {what} {where} is already in use "
                f"(another job, or a coordinator still running); pass "
                f"DynamicOptions(port=...) (chronica coordinator --port) or set CHRONICA_PORT "
                f"to a free port P with P+1 free too, or port 0 for any free ports"
            )
        if exc.errno == errno.EADDRNOTAVAIL:
            return (
                f"chronica coordinator cannot bind {where}: {self.host} (from "
                f"{self.bind_source}) is not an address of this machine; set MASTER_ADDR or "
                f"{ENV_BIND} to one of its addresses (127.0.0.1 on a single node)"
            )
        if exc.errno == errno.EACCES:
            return f"chronica coordinator cannot bind {where}: ports below 1024 need privileges"
        return f"chronica coordinator cannot bind {where} ({exc})"

    @property
    def bound(self) -> tuple[str, str]:
        """The endpoints the ROUTER and PUB sockets are bound to, as ZeroMQ reports them."""
        if self._gate is None or self.endpoint is None:
            raise RuntimeError("the coordinator is not running")
        host, router, pub = self.endpoint
        return tcp_url(host, router), tcp_url(host, pub)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, close the sockets and stop the authenticator (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("chronica: coordinator thread did not stop in %.1f s", timeout)
            self._thread = None
        self._shut()

    def _shut(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        self._context = None

    def __enter__(self) -> Coordinator:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ------------------------------------------------------------------------

    def _serve(self) -> None:
        gate = self._gate
        assert gate is not None and gate.link is not None
        link = gate.link
        poller = zmq.Poller()  # one for the loop: a socket's own poll() builds one per call
        poller.register(link, zmq.POLLIN)
        started = time.thread_time()
        calm_since = time.monotonic()
        while not self._stop.is_set():
            self.stats.cpu_seconds = time.thread_time() - started
            try:
                ready = poller.poll(_POLL_MS)
            except zmq.ZMQError:
                break
            if not ready:
                if not gate.alive():
                    continue
                if gate.restarts != self.stats.gate_restarts:
                    self._forget_peers()  # every connection went with the old gate
                    self.stats.gate_restarts = gate.restarts
                    calm_since = time.monotonic()
                elif time.monotonic() - calm_since > 10.0:
                    gate.calm()
                continue
            for _ in range(1024):  # drain, but let the stop flag be seen now and then
                try:
                    self._from_gate(link.recv_multipart(zmq.NOBLOCK))
                    if not readable(link):
                        break
                except zmq.ZMQError:
                    return

    def _forget_peers(self) -> None:
        self._peers.clear()
        self._holder.clear()
        self._joined.clear()
        self._pos.clear()

    def _from_gate(self, frames: list[bytes]) -> None:
        kind = frames[0]
        if kind == b"m":  # requests: (identity, payload) pairs
            for i in range(1, len(frames) - 1, 2):
                self._handle(frames[i : i + 2])
        elif kind == b"f":
            self._refuse(frames[1], "frames", "expected one frame")
        elif kind == b"h":
            self.stats.handshake_failures += 1
            self._throttle.warn(
                "chronica: coordinator: a connection failed: %s", frames[1].decode(errors="replace")
            )
        elif kind == b"k":
            self.stats.refused_keys += 1
            self._throttle.warn(
                "chronica: coordinator refused CURVE client key %s (not on the allow-list)",
                frames[1].decode("ascii", "replace"),
            )
        elif kind == b"x":
            text = frames[1].decode(errors="replace")
            self._throttle.warn("chronica: coordinator gate: %s", text)
        elif kind == b"n":
            self.stats.gate = json.loads(frames[1])

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._refuse(frames[0] if frames else None, "frames", "expected one frame")
            return
        identity, payload = frames
        message: dict[str, Any] | None = None
        try:
            message = decode(payload)
            kind = message["t"]
            if kind == "hello":
                self._hello(identity, message)
            elif kind == "fetch":
                self._fetch(identity, message)
            elif kind == "report":
                self._report(identity, message)
            else:
                raise ProtocolError(f"a rank may not send {kind!r} messages")
        except ProtocolError as exc:
            self._refuse(identity, exc.code, str(exc), message)
        except Exception as exc:  # a bug must not take the coordinator down with it
            if not self._traceback_logged:
                # One traceback finds the bug; repeats (a peer can trigger them) are throttled.
                logger.exception("chronica: coordinator failed on a message")
                self._traceback_logged = True
            self._refuse(identity, "internal", f"{type(exc).__name__}: {exc}", message)

    def _refuse(
        self,
        identity: bytes | None,
        code: str,
        text: str,
        message: dict[str, Any] | None = None,
    ) -> None:
        self.stats.rejected += 1
        self.stats.refused[code] = self.stats.refused.get(code, 0) + 1
        if code not in ("hello", "stale"):  # ordinary after restarts: not worth a warning
            self._throttle.warn("chronica: coordinator refused a message (%s): %s", code, text)
        if identity is None:
            return
        fields: dict[str, Any] = {}
        if message is not None and message.get("t") == "fetch":
            # The rank falls back for this window at once instead of waiting for a plan.
            fields = {"epoch": message["epoch"], "first": message["first"]}
        self._reply(identity, "error", code=code, msg=text[:_MAX_ERROR_TEXT], **fields)

    def _reply(self, identity: bytes, kind: str, **fields: Any) -> None:
        self._send(identity, encode(kind, **fields))

    def _send(self, identity: bytes, payload: bytes) -> None:
        """To one connection, through the gate."""
        self._to_gate([b"s", identity, payload])

    def _to_gate(self, frames: list[bytes]) -> None:
        assert self._gate is not None and self._gate.link is not None
        try:
            self._gate.link.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            # No gate (one is being replaced): the message is lost, and the ranks fetch,
            # time out or say hello again, as for any message lost on the network.
            pass

    def _check_rank(self, rank: int) -> None:
        world = self.scheduler.config.num_replicas
        if rank >= world:
            raise ProtocolError(f"rank {rank} is outside this job's world of {world}")

    def _peer_rank(self, identity: bytes, rank: int) -> None:
        """Check that this connection said hello, as ``rank``."""
        known = self._peers.get(identity)
        if known is None:
            raise ProtocolError(
                "this connection has not said hello (a restarted coordinator, or a new "
                "connection): say hello first",
                code="hello",
            )
        if known != rank:
            raise ProtocolError(f"this connection said hello as rank {known}, not rank {rank}")
        self._peers.move_to_end(identity)

    def _hello(self, identity: bytes, message: dict[str, Any]) -> None:
        rank = message["rank"]
        self._check_rank(rank)
        world = self.scheduler.config.num_replicas
        if message["world"] != world:
            raise ProtocolError(
                f"rank {rank} says the world has {message['world']} ranks; the coordinator "
                f"plans for {world}",
                code="world",
            )
        if message["digest"] != self.scheduler.digest:
            raise ProtocolError(
                f"the sizes or sampler arguments of rank {rank} differ from the "
                f"coordinator's (digest {message['digest']} != {self.scheduler.digest}); "
                f"build the sampler with the same data set, sizes and arguments on every rank",
                code="digest",
            )
        known = self._peers.get(identity)
        if known is not None and known != rank:
            raise ProtocolError(
                f"this connection said hello as rank {known}; one connection speaks for one rank"
            )
        holder = self._holder.get(rank)
        if holder is not None and holder != identity and holder in self._peers:
            self.stats.duplicate_hellos += 1
            self._throttle.warn(
                "chronica: coordinator: rank %d said hello on a second connection (a restarted "
                "or reconnected rank, or two processes with the same RANK)",
                rank,
            )
        if identity not in self._peers:
            self._to_gate([b"a", identity])  # its requests now pass the gate unthrottled
        self._peers[identity] = rank
        self._peers.move_to_end(identity)
        self._holder[rank] = identity
        self._joined[identity] = self.stats.windows
        while len(self._peers) > self._max_peers:
            old, old_rank = self._peers.popitem(last=False)
            del self._joined[old]
            self._pos.pop(old, None)
            self._to_gate([b"d", old])
            if self._holder.get(old_rank) == old:
                del self._holder[old_rank]
        self.stats.hellos += 1
        self._reply(identity, "welcome", window=self.planner.window, steps=self._steps(None))

    def _fetch(self, identity: bytes, message: dict[str, Any]) -> None:
        rank, epoch, first = message["rank"], message["epoch"], message["first"]
        self._check_rank(rank)
        steps = self._steps(epoch)
        if first % self.planner.window or first >= steps:
            raise ProtocolError(f"first={first} is not a window start of an epoch of {steps} steps")
        self._peer_rank(identity, rank)
        self._pos[identity] = (epoch, first)
        plan = self._ensure(epoch, first)
        self.stats.fetches += 1
        seq = self._seq[(epoch, first)]
        if message.get("ahead") and seq >= self._joined[identity]:
            # Published since this rank's hello: its copy is on the way by PUB (if PUB lost
            # it, the rank fetches again when it needs the window, and is answered).
            self.stats.prefetches_by_pub += 1
        else:
            self._send(identity, self._part(plan, rank, seq))
        self._plan_ahead(epoch, first)

    def _report(self, identity: bytes, message: dict[str, Any]) -> None:
        rank, step = message["rank"], message["step"]
        self._check_rank(rank)
        steps = self._steps(message["epoch"])
        if step >= steps:
            raise ProtocolError(f"step={step} is outside an epoch of {steps} steps")
        self._peer_rank(identity, rank)
        self._pos[identity] = (message["epoch"], step)
        self.stats.reports += 1
        self.planner.observe(rank, step, message["load"], message["seconds"], message.get("work"))
        window = self.planner.window
        first = step - step % window
        if step - first >= window // 2:
            self._plan_ahead(message["epoch"], first)

    def _steps(self, epoch: int | None) -> int:
        """Steps of ``epoch`` (a packed token budget cuts every epoch anew; ``None``: the
        job's current one). A packed epoch outside the horizon is refused first, since
        counting its steps plans it."""
        if self.scheduler.config.packing is None:
            return self.scheduler.num_steps()
        if epoch is None:
            progress = self._progress()
            return self.scheduler.num_steps(0 if progress is None else progress[0])
        self._check_horizon(epoch, 0, counting=True)
        return self.scheduler.num_steps(epoch)

    def _progress(self) -> tuple[int, int] | None:
        """The job's progress: the earliest position of the ranks' current connections."""
        known = [self._pos[i] for i in self._holder.values() if i in self._pos]
        return min(known) if known else None

    def _check_horizon(self, epoch: int, first: int, counting: bool = False) -> None:
        """Refuse a window more than ``horizon`` steps after the job's progress (or in an
        epoch whose windows were dropped) before anything is planned for it."""
        if epoch < self.planner.forgotten:
            raise ProtocolError(
                f"epoch {epoch} was dropped (the job planned epoch {self.planner.forgotten + 1}"
                f"); the static plan serves it",
                code="stale",
            )
        progress = self._progress()
        if progress is None:
            return
        at, step = progress
        if epoch < at or (epoch == at and first <= step + self.horizon):
            return
        if epoch == at + 1:
            if counting:
                return  # the next epoch's step count is needed to place it
            ahead = self.scheduler.num_steps(at) - step + first
            if ahead <= self.horizon:
                return
        raise ProtocolError(
            f"epoch {epoch} step {first} is more than {self.horizon} steps ahead of the job "
            f"(its slowest rank is at epoch {at} step {step}); the static plan serves it",
            code="stale",
        )

    def _plan_ahead(self, epoch: int, first: int) -> None:
        """Plan (and publish) the window after ``(epoch, first)`` if not done yet; a window
        that cannot be planned now is left for a fetch to ask (and be told why)."""
        following = first + self.planner.window
        try:
            if following < self._steps(epoch):
                self._ensure(epoch, following)
            else:
                self._ensure(epoch + 1, 0)
        except ValueError:  # a refusal, or a planner failure: the fetch will hear of it
            pass

    def _ensure(self, epoch: int, first: int) -> WindowPlan:
        plan = self.planner.planned(epoch, first)
        if plan is not None:
            return plan
        # Re-planning a dropped window could hand a rank a split other ranks did not train
        # on, and planning far ahead of the slowest rank would spend memory and time on
        # windows nobody needs yet: both are refused (the rank uses the static plan).
        self._check_horizon(epoch, first)
        plan = self.planner.plan_window(epoch, first)
        seq = self.stats.windows
        self.stats.windows += 1
        self._seq[(epoch, first)] = seq
        for old in [k for k in self._seq if k[0] < self.planner.forgotten]:
            del self._seq[old]
        self._publish(plan, seq)
        return plan

    def _by_rank(self, plan: WindowPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The window's indices regrouped rank by rank (each rank's steps in order), where
        each rank's run starts, and every rank's step offsets (a column each): one gather
        per window instead of a slice per step and rank."""
        key = (plan.epoch, plan.first_step)
        if self._layout is not None and self._layout[0] == key:
            return self._layout[1]
        counts = plan.counts.T.ravel()  # rank by rank, step by step
        starts = plan.bounds[:, :-1].T.ravel()
        ends = np.cumsum(counts)
        total = int(ends[-1]) if ends.size else 0
        gather = np.repeat(starts - (ends - counts), counts) + np.arange(total)
        runs = np.concatenate([[0], np.cumsum(plan.counts.sum(axis=0))])
        offsets = np.vstack([np.zeros((1, plan.num_replicas), np.int64), np.cumsum(plan.counts, 0)])
        layout = (plan.indices[gather], runs, offsets)
        self._layout = (key, layout)
        return layout

    def _unpacked(self, plan: WindowPlan, seq: int, ranks: slice) -> list[bytes]:
        """The messages of ``ranks`` (a slice of whole ranks) of an unpacked window."""
        grouped, runs, offsets = self._by_rank(plan)
        at = runs[ranks.start : ranks.stop + 1]
        return plan_messages(
            seq,
            self.generation,
            plan.epoch,
            plan.first_step,
            grouped[at[0] : at[-1]],
            at - at[0],
            offsets[:, ranks],
            plan.loss_weights[:, ranks],
            plan.loads[:, ranks],
        )

    def _part(self, plan: WindowPlan, rank: int, seq: int) -> bytes:
        if plan.micro is None:
            return self._unpacked(plan, seq, slice(rank, rank + 1))[0]
        starts, ends = plan.bounds[:, rank], plan.bounds[:, rank + 1]
        spans = [slice(a, b) for a, b in zip(starts, ends, strict=True)]
        # A packed window sends piece numbers (documents and token ranges follow from them).
        layout = plan.micro
        indices = (
            np.concatenate([layout.pieces[span] for span in spans])
            if plan.num_steps
            else np.empty(0, np.int64)
        )
        offsets = np.concatenate([[0], np.cumsum(ends - starts)])
        counts = layout.num_micro
        first = layout.first[:-1] + rank * counts
        slots = np.concatenate([np.arange(a, a + m) for a, m in zip(first, counts, strict=True)])
        micro = Micro(
            rows=np.concatenate([layout.rows[span] for span in spans]),
            counts=counts,
            offsets=np.concatenate(
                [[0], np.cumsum(layout.bounds[slots + 1] - layout.bounds[slots])]
            ),
            weights=layout.weights[slots],
        )
        return plan_message(
            seq,
            self.generation,
            plan.epoch,
            plan.first_step,
            indices,
            offsets,
            plan.loss_weights[:, rank],
            plan.loads[:, rank],
            micro,
        )

    def _parts(self, plan: WindowPlan, seq: int) -> list[bytes]:
        """Every rank's ``_part`` of ``plan``, an unpacked window's in one batch."""
        if plan.micro is not None:
            return [self._part(plan, rank, seq) for rank in range(plan.num_replicas)]
        return self._unpacked(plan, seq, slice(0, plan.num_replicas))

    def _publish(self, plan: WindowPlan, seq: int) -> None:
        started = time.perf_counter()
        parts: list[bytes] = []
        for rank, payload in enumerate(self._parts(plan, seq)):
            parts += (rank_topic(rank), payload)
        sizes = np.fromiter(map(len, parts), PUBLISH_SIZE, len(parts))
        self.stats.published_bytes += int(sizes[1::2].sum())
        # Three frames, not two per rank: a frame costs both ends a few microseconds.
        self._to_gate([b"p", sizes.tobytes(), b"".join(parts)])  # the gate publishes each
        self.stats.published_indices += int(plan.indices.shape[0])
        logger.debug(
            "chronica: published epoch %d steps %d..%d (seq %d) in %.1f ms",
            plan.epoch,
            plan.first_step,
            plan.first_step + plan.num_steps - 1,
            seq,
            1e3 * (time.perf_counter() - started),
        )
