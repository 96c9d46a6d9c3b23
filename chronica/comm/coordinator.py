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

Exposure: it binds one address (``chronica.comm.address.resolve_bind``: loopback unless
told otherwise, every interface only when asked for by name), caps every incoming frame
(``zmq.MAXMSGSIZE``) and optionally admits only CURVE-authenticated peers
(``chronica.comm.auth``). SECURITY.md states what that does and does not protect against.

Its helpers each do one job: ``address`` (where to bind), ``gate`` (the sockets, in a child
process), ``peers`` (which connection speaks for which rank), ``horizon`` (how far ahead it
plans), ``parts`` (each rank's message of a window), ``protocol`` (the bytes on the wire).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from chronica.comm.address import (
    bind_error,
    listens_everywhere,
    resolve_bind,
    resolve_port,
)
from chronica.comm.auth import CurveServer
from chronica.comm.gate import Gate
from chronica.comm.gate_process import PUBLISH_SIZE, GateLimits, readable
from chronica.comm.horizon import Horizon
from chronica.comm.parts import PlanParts
from chronica.comm.peers import Peers
from chronica.comm.protocol import MAX_GENERATION, MAX_WORLD, ProtocolError, decode, encode, tcp_url
from chronica.comm.protocol import topic as rank_topic
from chronica.core.dynamic import DynamicPlanner
from chronica.core.plan import WindowPlan
from chronica.core.scheduler import Scheduler

__all__ = ["Coordinator", "CoordinatorStats"]

logger = logging.getLogger("chronica")

_POLL_MS = 50
# An error answer quotes the refused input; keep it far below the ranks' string cap.
_MAX_ERROR_TEXT = 512


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
    ``RuntimeError`` that names it and the fix. ``start()`` returns at once; the thread
    serves until ``close()``.

    The sockets live in a gate process (``chronica.comm.gate``, bounds in ``limits``), so
    nothing a peer sends reaches this process except single-frame requests of at most
    ``MAX_REQUEST_BYTES``, at a bounded rate; a gate that dies is replaced on the same ports.

    Guarantees: no input from a peer stops the thread or grows memory without bound
    (frames are capped, the peer table is bounded, plans are kept for two epochs); a window
    is planned at most once, so every rank that receives it receives the same plan, marked
    with this coordinator's ``generation`` (random, so a restarted coordinator's plans of the
    same window are told apart from the first one's).

    Args:
        scheduler: the job's ``Scheduler``, of a config with ``kind="dynamic"``.
        host: the address to bind (``None``: ``CHRONICA_BIND``, ``MASTER_ADDR``, loopback).
        port: the ROUTER port, ``port + 1`` the PUB one (``None``: ``CHRONICA_PORT`` or
            50051; ``0``: any free ports).
        context: the ZeroMQ context of the link to the gate (default: the shared one).
        curve: the ``CurveServer`` that admits only listed CURVE peers (default:
            ``CurveServer.from_env()``, off when no ``CHRONICA_CURVE_*`` variable is set).
        limits: what the gate lets peers cost (default: ``GateLimits()``).

    An argument of the wrong type is a ``TypeError``, a bad value a ``ValueError``, each
    naming the argument and the fix.

    Example::

        >>> with Coordinator(scheduler, "127.0.0.1", port=0) as coordinator:
        ...     host, port, pub_port = coordinator.endpoint  # ranks' PlanClient connect here
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
            raise TypeError(
                f"scheduler must be a chronica Scheduler, not {type(scheduler)}; build one "
                f"with chronica.core.Scheduler(sizes, ScheduleConfig(..., kind='dynamic'))"
            )
        world = scheduler.config.num_replicas
        if world > MAX_WORLD:
            raise ValueError(f"num_replicas={world} exceeds the protocol's {MAX_WORLD} ranks")
        if context is not None and not isinstance(context, zmq.Context):
            raise TypeError(f"context must be a zmq.Context or None, not {type(context)}")
        if curve is not None and not isinstance(curve, CurveServer):
            raise TypeError(
                f"curve must be a chronica.comm.auth.CurveServer or None, not {type(curve)}"
            )
        if limits is not None and not isinstance(limits, GateLimits):
            raise TypeError(
                "limits must be a chronica.comm.gate_process.GateLimits or None, "
                f"not {type(limits)}"
            )
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
        self._encoder = PlanParts(self.generation)
        self._peers = Peers(2 * world + 64)
        self._horizon = Horizon(self.planner, self._peers)
        self.horizon = self._horizon.steps  # steps planned ahead of the slowest rank at most
        self._throttle = _Throttle()
        self._traceback_logged = False
        self.endpoint: tuple[str, int, int] | None = None
        self._requests: dict[str, Callable[[bytes, dict[str, Any]], None]] = {
            "hello": self._hello,
            "fetch": self._fetch,
            "report": self._report,
        }
        self._notes: dict[bytes, Callable[[list[bytes]], None]] = {
            b"m": self._bundle,
            b"f": self._frames_refused,
            b"h": self._handshake_failed,
            b"k": self._key_refused,
            b"x": self._gate_said,
            b"n": self._gate_counts,
        }

    def __repr__(self) -> str:
        where = (
            f"endpoint={self.endpoint}"
            if self.endpoint is not None
            else f"host={self.host!r}, port={self._port}"
        )
        curve = f"{len(self.curve.allowed)} keys" if self.curve is not None else "off"
        return (
            f"Coordinator(world={self.scheduler.config.num_replicas}, {where}, "
            f"bind_source={self.bind_source!r}, window={self.planner.window}, "
            f"horizon={self.horizon}, curve={curve}, generation={self.generation})"
        )

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Coordinator:
        """Bind both sockets and start serving in a daemon thread; returns ``self``."""
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
        if self.curve is None and listens_everywhere(self.host):
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
            raise RuntimeError(bind_error(exc, self.host, port, role, self.bind_source)) from exc
        gate.open()
        self.endpoint = (self.host, *gate.ports)

    @property
    def bound(self) -> tuple[str, str]:
        """The endpoints the ROUTER and PUB sockets are bound to, as ZeroMQ reports them."""
        if self._gate is None or self.endpoint is None:
            raise RuntimeError("the coordinator is not running")
        host, router, pub = self.endpoint
        return tcp_url(host, router), tcp_url(host, pub)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, close the sockets and stop the authenticator (idempotent).

        Args:
            timeout: seconds to wait for the serving thread to stop.
        """
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
                    self._peers.clear()  # every connection went with the old gate
                    self.stats.gate_restarts = gate.restarts
                continue
            for _ in range(1024):  # drain, but let the stop flag be seen now and then
                try:
                    self._from_gate(link.recv_multipart(zmq.NOBLOCK))
                    if not readable(link):
                        break
                except zmq.ZMQError:
                    return

    def _from_gate(self, frames: list[bytes]) -> None:
        """One message of the gate, by its first frame (see ``_notes``)."""
        note = self._notes.get(frames[0])
        if note is not None:
            note(frames)

    def _bundle(self, frames: list[bytes]) -> None:
        """Requests: (identity, payload) pairs after the tag."""
        for i in range(1, len(frames) - 1, 2):
            self._handle(frames[i : i + 2])

    def _frames_refused(self, frames: list[bytes]) -> None:
        self._refuse(frames[1], "frames", "expected one frame")

    def _handshake_failed(self, frames: list[bytes]) -> None:
        # The gate tells each cause once a second, with how many handshakes it failed.
        count = int(frames[2]) if len(frames) > 2 and frames[2].isdigit() else 1
        self.stats.handshake_failures += count
        self._throttle.warn(
            "chronica: coordinator: %d connection(s) failed: %s",
            count,
            frames[1].decode(errors="replace"),
        )

    def _key_refused(self, frames: list[bytes]) -> None:
        self.stats.refused_keys += 1
        self._throttle.warn(
            "chronica: coordinator refused CURVE client key %s (not on the allow-list)",
            frames[1].decode("ascii", "replace"),
        )

    def _gate_said(self, frames: list[bytes]) -> None:
        text = frames[1].decode(errors="replace")
        self._throttle.warn("chronica: coordinator gate: %s", text)

    def _gate_counts(self, frames: list[bytes]) -> None:
        self.stats.gate = json.loads(frames[1])

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._refuse(frames[0] if frames else None, "frames", "expected one frame")
            return
        identity, payload = frames
        message: dict[str, Any] | None = None
        try:
            message = decode(payload)
            request = self._requests.get(message["t"])
            if request is None:
                raise ProtocolError(f"a rank may not send {message['t']!r} messages")
            request(identity, message)
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

    def _reply(self, identity: bytes, message_type: str, **fields: Any) -> None:
        self._send(identity, encode(message_type, **fields))

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
        greeting = self._peers.greet(identity, rank, self.stats.windows)
        if greeting.duplicate:
            self.stats.duplicate_hellos += 1
            self._throttle.warn(
                "chronica: coordinator: rank %d said hello on a second connection (a restarted "
                "or reconnected rank, or two processes with the same RANK)",
                rank,
            )
        if greeting.new:
            self._to_gate([b"a", identity])  # its requests now pass the gate unthrottled
        for old in greeting.forgotten:
            self._to_gate([b"d", old])
        self.stats.hellos += 1
        self._reply(
            identity, "welcome", window=self.planner.window, steps=self._horizon.epoch_steps(None)
        )

    def _fetch(self, identity: bytes, message: dict[str, Any]) -> None:
        rank, epoch, first = message["rank"], message["epoch"], message["first"]
        self._check_rank(rank)
        steps = self._horizon.epoch_steps(epoch)
        if first % self.planner.window or first >= steps:
            raise ProtocolError(f"first={first} is not a window start of an epoch of {steps} steps")
        self._peers.check(identity, rank)
        self._peers.moved(identity, epoch, first)
        plan = self._ensure(epoch, first)
        self.stats.fetches += 1
        seq = self._seq[(epoch, first)]
        if message.get("ahead") and seq >= self._peers.joined(identity):
            # Published since this rank's hello: its copy is on the way by PUB (if PUB lost
            # it, the rank fetches again when it needs the window, and is answered).
            self.stats.prefetches_by_pub += 1
        else:
            self._send(identity, self._part(plan, rank, seq))
        self._plan_ahead(epoch, first)

    def _report(self, identity: bytes, message: dict[str, Any]) -> None:
        rank, step = message["rank"], message["step"]
        self._check_rank(rank)
        steps = self._horizon.epoch_steps(message["epoch"])
        if step >= steps:
            raise ProtocolError(f"step={step} is outside an epoch of {steps} steps")
        self._peers.check(identity, rank)
        self._peers.moved(identity, message["epoch"], step)
        self.stats.reports += 1
        self.planner.observe(rank, step, message["load"], message["seconds"], message.get("work"))
        window = self.planner.window
        first = step - step % window
        if step - first >= window // 2:
            self._plan_ahead(message["epoch"], first)

    # -- planning -------------------------------------------------------------------------

    def _plan_ahead(self, epoch: int, first: int) -> None:
        """Plan (and publish) the window after ``(epoch, first)`` if not done yet; a window
        that cannot be planned now is left for a fetch to ask (and be told why)."""
        following = first + self.planner.window
        try:
            if following < self._horizon.epoch_steps(epoch):
                self._ensure(epoch, following)
            else:
                self._ensure(epoch + 1, 0)
        except ValueError:  # a refusal, or a planner failure: the fetch will hear of it
            pass

    def _ensure(self, epoch: int, first: int) -> WindowPlan:
        plan = self.planner.planned(epoch, first)
        if plan is not None:
            return plan
        # A dropped window, or one far ahead of the slowest rank, is refused (``Horizon``).
        self._horizon.check(epoch, first)
        plan = self.planner.plan_window(epoch, first)
        seq = self.stats.windows
        self.stats.windows += 1
        self._seq[(epoch, first)] = seq
        for old in [k for k in self._seq if k[0] < self.planner.forgotten]:
            del self._seq[old]
        self._publish(plan, seq)
        return plan

    # -- publishing -----------------------------------------------------------------------

    def _part(self, plan: WindowPlan, rank: int, seq: int) -> bytes:
        """Rank ``rank``'s message of ``plan`` (the one place every part passes: tests and
        benchmarks replace it to tamper with or measure what ranks receive)."""
        return self._encoder.part(plan, rank, seq)

    def _parts(self, plan: WindowPlan, seq: int) -> list[bytes]:
        """Every rank's ``_part`` of ``plan``, an unpacked window's in one batch."""
        if plan.micro is not None:
            return [self._part(plan, rank, seq) for rank in range(plan.num_replicas)]
        return self._encoder.parts(plan, seq)

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
