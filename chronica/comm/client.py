"""A rank's side of the coordinator: plans in, feedback out, never blocking training long.

``PlanClient`` subscribes to its rank's topic on the coordinator's PUB socket (its own
part of each window, nothing else): plans arrive ahead of use, so a step normally finds its
plan already here. It talks to the ROUTER
socket through a DEALER: ``hello`` once, ``fetch`` for a window it does not hold (a gap or
a late start), ``report`` after each step, sent without waiting.

Everything has a time-out. If the coordinator does not answer, ``plan()`` returns ``None``
(the caller uses the static plan, which holds the same samples at every step), a warning is
logged once, and the client offers ``hello`` again at most 4 times a second, whenever it is
called, so it re-attaches (and reports and prefetches again) as soon as the coordinator
answers: a coordinator that was only slow, or one restarted on the same port. A
coordinator that does not know this connection (it was restarted while the rank was not
looking) is greeted again and the pending fetches re-sent. A fetch the coordinator
refuses falls back at once, without waiting for the time-out. A coordinator that refuses
the rank (sizes, arguments or world size differ) is not asked again: every window falls
back at once and an error says why (``refused``); training goes on, since the answer may
come from anyone on an unauthenticated network. A failed handshake (CURVE keys that do
not match) falls back and says why.

No thread: incoming messages queue in ZeroMQ's I/O thread and are read whenever the client
is called (once per step). What a coordinator (or whoever answers in its place) sends costs
a rank a bounded amount, whatever it sends:

* time: one call reads at most ``DRAIN_FRAMES`` frames per socket and checks its deadline
  (``plan()``: the time-out; the other calls: ``DRAIN_SECONDS``) before reading and
  decoding each, and the decoder refuses a frame that is no flat map at its first nested
  byte, so a flood of garbage, of plans or of nested-container bombs cannot hold the
  training loop past its time-out by more than one decode;
* memory: ZeroMQ queues at most ``QUEUED_MESSAGES`` messages per socket of at most
  ``max_plan_bytes`` each (``zmq.RCVHWM``, ``zmq.MAXMSGSIZE``); the client holds at most
  ``HELD_PLANS`` plans, for the window it asked for last and those after it up to the end
  of the next epoch (the farthest ahead goes first, never the one it waits for), and
  remembers only refusals of fetches it sent;
  frames beyond a message's expected count are read one by one and dropped;
* log: refused messages are counted (``stats.rejected``) and warned about on the 1st, 10th,
  100th... of them; a coordinator's error codes are warned about once each, for at most
  ``ERROR_CODES`` codes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from chronica.comm.auth import CurveClient, HandshakeMonitor
from chronica.comm.protocol import (
    MAX_WORLD,
    Plan,
    ProtocolError,
    decode,
    encode,
    tcp_url,
    topic,
)
from chronica.core.checks import check_int, check_seconds

__all__ = [
    "DRAIN_FRAMES",
    "DRAIN_SECONDS",
    "ERROR_CODES",
    "HELD_PLANS",
    "QUEUED_MESSAGES",
    "ClientStats",
    "PlanClient",
]

logger = logging.getLogger("chronica")

# Retry hello at most this often while detached (a send to no peer fails at once).
_RETRY_SECONDS = 0.25
# While connecting, hello is repeated this often: the first may precede the TCP connection.
_CONNECT_RETRY_SECONDS = 0.1
# While waiting for a plan, its fetch is sent again this often: a fetch lost with a gate
# that was replaced (or a reconnection) is answered by the next one.
_REFETCH_SECONDS = 0.3
# A connection that drops (a coordinator's gate replaced) is waited for this long before
# the rank falls back: reconnecting takes ZeroMQ a tenth of a second.
_RECONNECT_GRACE_SECONDS = 2.0
# Waits poll in slices this long, so retries and deadlines are honoured.
_POLL_SLICE_MS = 50
# Beyond this a plan message is no plan (a window of 2 GiB of indices) but a mistake; below
# the other, the coordinator's error answers (at most ~600 bytes) would not fit.
_PLAN_BYTES = (1024, 1 << 31)
# Bounds on what the coordinator's side can make a rank spend (module docstring). A
# coordinator publishes a window or two ahead of the ranks, so 8 plans and 16 queued
# messages leave ample room; a flood beyond them is dropped, and a plan dropped this way is
# fetched when needed, like one PUB lost.
HELD_PLANS = 8
QUEUED_MESSAGES = 16
DRAIN_FRAMES = 256
DRAIN_SECONDS = 0.05
ERROR_CODES = 16


@dataclass
class ClientStats:
    """Plans received by PUB and by fetch, sequence gaps seen, windows that fell back,
    messages refused by the decoder (or with the wrong number of frames), fetches the
    coordinator refused, plans dropped unused (outside the epochs next to the rank's, or
    beyond ``HELD_PLANS``), the most plans held at once."""

    published: int = 0
    fetched: int = 0
    gaps: int = 0
    fallbacks: int = 0
    rejected: int = 0
    refused_fetches: int = 0
    dropped: int = 0
    held_most: int = 0


class _Inbox:
    """The messages of ``frames`` frames arriving on ``sock``, read frame by frame (so a
    message of many frames is never held whole); a message with another number of frames
    is dropped and counted in ``malformed``. A read may stop inside a message and the next
    one finishes it."""

    def __init__(self, sock: zmq.Socket, frames: int) -> None:
        self.sock, self.frames = sock, frames
        self.malformed = 0
        self._parts: list[bytes] = []
        self._bad = False

    def read(self, budget: int, until: float) -> Iterator[list[bytes]]:
        """Complete messages among the next ``budget`` frames, one at a time: none is read
        once ``until`` has passed, so the caller's work on each (decoding) counts against
        the deadline too."""
        for _ in range(budget):
            if time.monotonic() > until:
                return
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(self._parts) < self.frames:
                self._parts.append(frame)
            else:
                self._bad = True
            if not self.sock.getsockopt(zmq.RCVMORE):
                parts, bad = self._parts, self._bad
                self._parts, self._bad = [], False
                if bad or len(parts) != self.frames:
                    self.malformed += 1
                else:
                    yield parts


class PlanClient:
    """Rank ``rank``'s connection to the coordinator at ``host:port`` (PUB on ``port + 1``).

    ``max_plan_bytes`` caps every incoming message (ZeroMQ drops the connection of a peer
    that sends more; msgpack never allocates beyond it). Every argument is checked here: a
    wrong type is a ``TypeError``, a bad value a ``ValueError``, each naming the argument.

    Args:
        rank: this rank, in ``[0, world)``.
        world: the number of ranks, as the coordinator plans for them.
        digest: the scheduler's digest (``Scheduler.digest``): the coordinator refuses a
            rank whose sizes or sampler arguments differ.
        host: the coordinator's host name or address.
        port: its ROUTER port.
        pub_port: its PUB port (default ``port + 1``).
        timeout: seconds to wait for an answer before falling back to the static plan.
        max_plan_bytes: the largest message accepted, in bytes.
        context: the ZeroMQ context of the sockets (default: the shared one).
        curve: the ``CurveClient`` keys of both sockets (default:
            ``CurveClient.from_env()``, none when no ``CHRONICA_CURVE_*`` variable is set).

    Example::

        >>> client = PlanClient(rank, world, scheduler.digest, "127.0.0.1", 50051)
        >>> if client.connect():
        ...     plan = client.plan(epoch=0, first=0)  # None: use the static plan
        >>> client.close()
    """

    def __init__(
        self,
        rank: int,
        world: int,
        digest: str,
        host: str,
        port: int,
        *,
        pub_port: int | None = None,
        timeout: float = 10.0,
        max_plan_bytes: int = 64 << 20,
        context: zmq.Context | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        world = check_int("world", world, 1, MAX_WORLD)
        rank = check_int("rank", rank, 0, world - 1, f" (world={world})")
        if not isinstance(digest, str):
            raise TypeError(f"digest must be the scheduler's digest (a str), not {type(digest)}")
        if not 0 < len(digest) <= 128:
            raise ValueError("digest must be the scheduler's digest (a string of 1-128 chars)")
        if not isinstance(host, str):
            raise TypeError(f"host={host!r} must be the coordinator's host name or address")
        if not host.strip():
            raise ValueError(f"host={host!r} must be the coordinator's host name or address")
        port = check_int("port", port, 1, 65535)
        pub_port = check_int("pub_port", port + 1 if pub_port is None else pub_port, 1, 65535)
        check_seconds("timeout", timeout)
        self.max_plan_bytes = check_int("max_plan_bytes", max_plan_bytes, *_PLAN_BYTES)
        if context is not None and not isinstance(context, zmq.Context):
            raise TypeError(f"context must be a zmq.Context or None, not {type(context)}")
        if curve is not None and not isinstance(curve, CurveClient):
            raise TypeError(
                f"curve must be a chronica.comm.auth.CurveClient or None, not {type(curve)}"
            )
        self.host, self.port, self.pub_port = host, port, pub_port
        self.rank, self.world, self.digest = rank, world, digest
        self.timeout = float(timeout)
        self.curve = curve if curve is not None else CurveClient.from_env()
        self.stats = ClientStats()
        self.window: int | None = None
        self._plans: dict[tuple[int, int], Plan] = {}
        self._asking: tuple[int, int] | None = None  # the window ``plan()`` waits for
        self._pending: set[tuple[int, int]] = set()  # fetched, not answered yet
        self._failed: set[tuple[int, int]] = set()  # fetches the coordinator refused
        self._last_seq = -1
        self._generation = 0  # of the last published plan: sequence numbers restart with it
        self._attached = False
        self._rejoining = False  # said hello again after the coordinator forgot us
        self._warned = False
        self._warned_codes: set[str] = set()
        self._handshake: str | None = None
        self._last_hello = -float("inf")
        self._dropped_at: float | None = None  # since when sends find no connection
        # Why the coordinator refused this rank (sizes, arguments or world differ), if it did.
        self.refused: str | None = None
        context = context or zmq.Context.instance()
        self._dealer = context.socket(zmq.DEALER)
        self._sub = context.socket(zmq.SUB)
        for sock in (self._dealer, self._sub):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_plan_bytes)
            sock.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            if self.curve is not None:
                self.curve.apply(sock)
        # Requests are not queued for a coordinator that is not connected: they fail at once.
        self._dealer.setsockopt(zmq.IMMEDIATE, 1)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic(rank))
        # Watches the handshake until the first welcome, to say why a connection fails
        # (CURVE keys that do not match); then it goes: it costs two sockets per client.
        self._monitor: HandshakeMonitor | None = HandshakeMonitor(self._dealer)
        self._dealer.connect(tcp_url(host, port))
        self._sub.connect(tcp_url(host, pub_port))
        self._inboxes = (_Inbox(self._dealer, 1), _Inbox(self._sub, 2))
        # What the client does with each message type it may receive.
        self._answers: dict[str, Callable[[dict[str, Any], bool], None]] = {
            "welcome": self._welcomed,
            "error": self._refused,
            "plan": self._planned,
        }
        self._poller = zmq.Poller()
        for sock in (self._dealer, self._sub, self._monitor.socket):
            self._poller.register(sock, zmq.POLLIN)

    def __repr__(self) -> str:
        return (
            f"PlanClient(rank={self.rank}, world={self.world}, host={self.host!r}, "
            f"port={self.port}, pub_port={self.pub_port}, window={self.window}, "
            f"timeout={self.timeout}, max_plan_bytes={self.max_plan_bytes}, "
            f"curve={'on' if self.curve is not None else 'off'}, attached={self._attached})"
        )

    @property
    def attached(self) -> bool:
        """Whether the coordinator has welcomed this rank (and not been lost since)."""
        return self._attached

    def connect(self, timeout: float | None = None) -> bool:
        """Say hello and wait up to ``timeout`` for the welcome; ``False`` means fall back
        (at once if the handshake fails: wrong or missing CURVE keys).

        Args:
            timeout: seconds to wait (default: the client's ``timeout``).
        """
        self._hello()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while (
            not self._attached
            and self._handshake is None
            and self.refused is None
            and self._wait(deadline)
        ):
            if not self._attached and time.monotonic() - self._last_hello > _CONNECT_RETRY_SECONDS:
                self._hello()
        if not self._attached and self.refused is None:
            if self._handshake is not None:
                self._lost(f"cannot be used ({self._handshake})")
            else:
                self._lost("did not answer hello")
        return self._attached

    def plan(self, epoch: int, first: int, timeout: float | None = None) -> Plan | None:
        """This rank's part of the window starting at ``first``, or ``None`` to fall back.

        Args:
            epoch: the window's epoch.
            first: the window's first step (a multiple of the coordinator's window).
            timeout: seconds to wait for it (default: the client's ``timeout``).
        """
        key = (epoch, first)
        self._asking = key
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._drain(deadline)
        plan = self._plans.get(key)
        if plan is None:
            if not (self._attached or self._rejoining):
                self.stats.fallbacks += 1
                return None
            self._failed.discard(key)
            self._fetch(key)
            sent = time.monotonic()
            while (
                (plan := self._plans.get(key)) is None
                and key not in self._failed
                and (self._attached or self._rejoining)
                and self._wait(deadline)
            ):
                if time.monotonic() - sent > _REFETCH_SECONDS:
                    self._fetch(key)  # the first may have gone with a replaced gate
                    sent = time.monotonic()
            if plan is None:
                if key not in self._failed and (self._attached or self._rejoining):
                    self._lost(f"sent no plan for epoch {epoch} step {first}")
                self.stats.fallbacks += 1
                return None
        # Windows are asked for in order: the ones before this are done with (a rewind
        # fetches again).
        for old in [k for k in self._plans if k < key]:
            del self._plans[old]
        for keys in (self._pending, self._failed):
            keys.difference_update([k for k in keys if k[0] < epoch - 1])
        return plan

    def prefetch(self, epoch: int, first: int) -> None:
        """Ask for a window without waiting (the answer is read on a later call).

        Args:
            epoch: the window's epoch.
            first: the window's first step.
        """
        self._drain()
        if self._attached and (epoch, first) not in self._plans:
            self._fetch((epoch, first), ahead=True)

    def report(
        self,
        epoch: int,
        step: int,
        load: float,
        seconds: float,
        work: np.ndarray | None = None,
    ) -> None:
        """Send this rank's compute ``seconds`` for ``step``; never waits.

        Args:
            epoch: the step's epoch.
            step: the step.
            load: the step's predicted load on this rank (the plan's ``loads``).
            seconds: the compute time measured for it.
            work: a packed step's pieces, tokens and squared tokens (three numbers).
        """
        self._drain()
        if self._attached:
            extra = {} if work is None else {"work": np.asarray(work, "<f8").tobytes()}
            self._send(
                encode(
                    "report",
                    rank=self.rank,
                    epoch=epoch,
                    step=step,
                    load=float(load),
                    seconds=float(seconds),
                    **extra,
                )
            )

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        if self._monitor is not None:
            self._monitor.close()
        for sock in (self._dealer, self._sub):
            sock.close(0)

    # -- internals -----------------------------------------------------------------------

    def _hello(self) -> None:
        if self.refused is not None:
            return  # it said no: asking again only repeats the refusal
        self._last_hello = time.monotonic()
        self._send(encode("hello", rank=self.rank, world=self.world, digest=self.digest))

    def _fetch(self, key: tuple[int, int], ahead: bool = False) -> None:
        self._pending.add(key)
        fields = {"ahead": True} if ahead else {}
        self._send(encode("fetch", rank=self.rank, epoch=key[0], first=key[1], **fields))

    def _maybe_reattach(self) -> None:
        if time.monotonic() - self._last_hello > _RETRY_SECONDS:
            self._hello()

    def _send(self, payload: bytes) -> None:
        try:
            self._dealer.send(payload, zmq.NOBLOCK)
            self._dropped_at = None
        except zmq.Again:
            # Not connected: a replaced gate reconnects within a fraction of a second, so an
            # attached rank waits a little (fetches are sent again) before falling back.
            now = time.monotonic()
            if self._dropped_at is None:
                self._dropped_at = now
            if self._attached and now - self._dropped_at > _RECONNECT_GRACE_SECONDS:
                self._lost("is not connected")
        except zmq.ZMQError as exc:
            self._lost(f"cannot be reached ({exc})")

    def _lost(self, why: str) -> None:
        self._attached = self._rejoining = False
        if not self._warned:
            self._warned = True
            logger.warning(
                "chronica: rank %d: the coordinator %s; using the static plan (same samples "
                "per step, balanced by predicted cost) until it is back",
                self.rank,
                why,
            )

    def _wait(self, deadline: float) -> bool:
        """Read what arrives until ``deadline``; ``False`` once it has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if self._poller.poll(max(1, min(_POLL_SLICE_MS, int(left * 1000)))):
            self._drain(deadline)
        return True

    def _drain(self, deadline: float | None = None) -> None:
        """Read what has arrived: at most ``DRAIN_FRAMES`` frames per socket, until
        ``deadline`` (default: ``DRAIN_SECONDS`` from now)."""
        if self._monitor is not None:
            for why in self._monitor.failures():
                self._handshake = why
        if not (self._attached or self._rejoining):
            self._maybe_reattach()
        until = time.monotonic() + DRAIN_SECONDS if deadline is None else deadline
        for inbox in self._inboxes:
            before = inbox.malformed
            for frames in inbox.read(DRAIN_FRAMES, until):
                self._accept(frames[-1], fetched=inbox.frames == 1)
            for _ in range(inbox.malformed - before):
                self._reject("a message with another number of frames")

    def _reject(self, why: object) -> None:
        self.stats.rejected += 1
        n = self.stats.rejected
        if n == 10 ** (len(str(n)) - 1):  # 1, 10, 100...: a flood is told, not logged whole
            logger.warning("chronica: rank %d refused a message (%d so far): %s", self.rank, n, why)

    def _accept(self, payload: bytes, fetched: bool) -> None:
        try:
            message = decode(payload, self.max_plan_bytes)
        except ProtocolError as exc:
            self._reject(exc)
            return
        answer = self._answers.get(message["t"])
        if answer is not None:  # a rank's own message types, echoed back, are ignored
            answer(message, fetched)

    def _welcomed(self, message: dict[str, Any], fetched: bool) -> None:
        self.window = message["window"]
        self._handshake = None
        if not self._attached and self._warned:
            logger.warning("chronica: rank %d: coordinator is back", self.rank)
            self._warned = False
        self._attached = True
        if self._monitor is not None:
            self._poller.unregister(self._monitor.socket)
            self._monitor.close()
            self._monitor = None
        if self._rejoining:
            self._rejoining = False
            for key in sorted(self._pending):
                self._fetch(key)

    def _planned(self, message: dict[str, Any], fetched: bool) -> None:
        plan: Plan = message["plan"]
        if not fetched:
            self.stats.published += 1
            if plan.gen != self._generation:
                self._generation, self._last_seq = plan.gen, -1
            if plan.seq > self._last_seq + 1 and self._last_seq >= 0:
                self.stats.gaps += plan.seq - self._last_seq - 1
            self._last_seq = max(self._last_seq, plan.seq)
        else:
            self.stats.fetched += 1
        key = (plan.epoch, plan.first)
        self._pending.discard(key)
        self._hold(key, plan)

    def _hold(self, key: tuple[int, int], plan: Plan) -> None:
        """Keep ``plan`` if it is for the window asked for last or one after it, in the
        same epoch or the next, dropping the one farthest ahead (not the one asked for)
        beyond ``HELD_PLANS``."""
        asking = self._asking
        if asking is not None and (key < asking or key[0] > asking[0] + 1):
            self.stats.dropped += 1
            return
        held = self._plans
        held[key] = plan
        if len(held) > HELD_PLANS:
            del held[max(k for k in held if k != asking)]
            self.stats.dropped += 1
        self.stats.held_most = max(self.stats.held_most, len(held))

    def _refused(self, message: dict[str, Any], fetched: bool = False) -> None:
        code, text = message["code"], message["msg"]
        if code in ("digest", "world"):
            if self.refused is None:
                self.refused = text
                logger.error(
                    "chronica: rank %d: the coordinator refused this rank (%s); every window "
                    "uses the static plan. If the ranks were really built with other sizes or "
                    "arguments, their static plans differ as well: build them alike",
                    self.rank,
                    text,
                )
            self._attached = self._rejoining = False
            return
        if code == "hello":
            # The coordinator does not know this connection (it restarted, or the socket
            # reconnected): greet it again; pending fetches are re-sent on the welcome.
            if self._attached:
                self._attached, self._rejoining = False, True
                self._hello()
            return
        if "epoch" in message and (message["epoch"], message["first"]) in self._pending:
            key = (message["epoch"], message["first"])
            self._pending.discard(key)
            self._failed.add(key)
            self.stats.refused_fetches += 1
        if code not in self._warned_codes and len(self._warned_codes) < ERROR_CODES:
            self._warned_codes.add(code)
            logger.warning(
                "chronica: rank %d: the coordinator refused a request (%s): %s; the static "
                "plan serves the windows it cannot",
                self.rank,
                code,
                text,
            )
