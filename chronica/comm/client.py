"""A rank's side of the coordinator: plans in, feedback out, never blocking training long.

``PlanClient`` subscribes to its rank's topic on the coordinator's PUB socket (plans arrive
ahead of use, so a step normally finds its plan already here) and talks to the ROUTER
socket through a DEALER: ``hello`` once, ``fetch`` for a window it does not hold (a gap or
a late start), ``report`` after each step, sent without waiting.

Everything has a time-out. If the coordinator does not answer, ``plan()`` returns ``None``
(the caller uses the static plan, which holds the same samples at every step), a warning is
logged once, and the client keeps offering ``hello`` in the background so it re-attaches
when the coordinator is back. A coordinator that refuses the rank (sizes or configuration
differ) raises ``CoordinatorRefused`` at once: that is a bug in the job, not a fault.

No thread: incoming messages queue in ZeroMQ's I/O thread and are read whenever the client
is called (once per step).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import zmq

from chronica.comm.protocol import Plan, ProtocolError, decode, encode, topic

__all__ = ["ClientStats", "CoordinatorRefused", "PlanClient"]

logger = logging.getLogger("chronica")

# Retry hello at most this often while the coordinator is unreachable.
_RETRY_SECONDS = 1.0
# While connecting, hello is repeated this often: the first may precede the TCP connection.
_CONNECT_RETRY_SECONDS = 0.1
# Waits poll in slices this long, so retries and deadlines are honoured.
_POLL_SLICE_MS = 50


class CoordinatorRefused(RuntimeError):
    """The coordinator refused this rank: its sizes, arguments or world size differ."""


@dataclass
class ClientStats:
    """Plans received by PUB and by fetch, sequence gaps seen, windows that fell back."""

    published: int = 0
    fetched: int = 0
    gaps: int = 0
    fallbacks: int = 0
    rejected: int = 0


class PlanClient:
    """Rank ``rank``'s connection to the coordinator at ``host:port`` (PUB on ``port + 1``).

    ``max_plan_bytes`` caps every incoming message (ZeroMQ drops the connection of a peer
    that sends more; msgpack never allocates beyond it).
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
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be > 0 seconds")
        self.rank, self.world, self.digest = rank, world, digest
        self.timeout = float(timeout)
        self.max_plan_bytes = int(max_plan_bytes)
        self.stats = ClientStats()
        self.window: int | None = None
        self._plans: dict[tuple[int, int], Plan] = {}
        self._last_seq = -1
        self._attached = False
        self._warned = False
        self._last_hello = -float("inf")
        context = context or zmq.Context.instance()
        self._dealer = context.socket(zmq.DEALER)
        self._sub = context.socket(zmq.SUB)
        for sock in (self._dealer, self._sub):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_plan_bytes)
        # Requests are not queued for a coordinator that is not connected: they fail at once.
        self._dealer.setsockopt(zmq.IMMEDIATE, 1)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic(rank))
        self._dealer.connect(f"tcp://{host}:{port}")
        self._sub.connect(f"tcp://{host}:{pub_port if pub_port is not None else port + 1}")
        self._poller = zmq.Poller()
        self._poller.register(self._dealer, zmq.POLLIN)
        self._poller.register(self._sub, zmq.POLLIN)

    @property
    def attached(self) -> bool:
        """Whether the coordinator has welcomed this rank (and not been lost since)."""
        return self._attached

    def connect(self, timeout: float | None = None) -> bool:
        """Say hello and wait up to ``timeout`` for the welcome; ``False`` means fall back."""
        self._hello()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._attached and self._wait(deadline):
            if not self._attached and time.monotonic() - self._last_hello > _CONNECT_RETRY_SECONDS:
                self._hello()
        if not self._attached:
            self._lost("did not answer hello")
        return self._attached

    def plan(self, epoch: int, first: int, timeout: float | None = None) -> Plan | None:
        """This rank's part of the window starting at ``first``, or ``None`` to fall back."""
        key = (epoch, first)
        self._drain()
        if key not in self._plans:
            if not self._attached:
                self._maybe_reattach()
                self.stats.fallbacks += 1
                return None
            self._send(encode("fetch", rank=self.rank, epoch=epoch, first=first))
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            while key not in self._plans and self._attached and self._wait(deadline):
                pass
            if key not in self._plans:
                if self._attached:
                    self._lost(f"sent no plan for epoch {epoch} step {first}")
                self.stats.fallbacks += 1
                return None
        for old in [k for k in self._plans if k[0] < epoch - 1]:
            del self._plans[old]
        return self._plans[key]

    def prefetch(self, epoch: int, first: int) -> None:
        """Ask for a window without waiting (the answer is read on a later call)."""
        self._drain()
        if self._attached and (epoch, first) not in self._plans:
            self._send(encode("fetch", rank=self.rank, epoch=epoch, first=first))

    def report(self, epoch: int, step: int, load: float, seconds: float) -> None:
        """Send this rank's compute ``seconds`` for ``step``; never waits."""
        if self._attached:
            self._send(
                encode(
                    "report",
                    rank=self.rank,
                    epoch=epoch,
                    step=step,
                    load=float(load),
                    seconds=float(seconds),
                )
            )

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        for sock in (self._dealer, self._sub):
            sock.close(0)

    # -- internals -----------------------------------------------------------------------

    def _hello(self) -> None:
        self._last_hello = time.monotonic()
        self._send(encode("hello", rank=self.rank, world=self.world, digest=self.digest))

    def _maybe_reattach(self) -> None:
        if time.monotonic() - self._last_hello > _RETRY_SECONDS:
            self._hello()

    def _send(self, payload: bytes) -> None:
        try:
            self._dealer.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            if self._attached:
                self._lost("is not connected")
        except zmq.ZMQError as exc:
            self._lost(f"cannot be reached ({exc})")

    def _lost(self, why: str) -> None:
        self._attached = False
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
            self._drain()
        return True

    def _drain(self) -> None:
        while True:
            try:
                payload = self._dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._accept(payload, fetched=True)
        while True:
            try:
                _, payload = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:  # not two frames
                self.stats.rejected += 1
                continue
            self._accept(payload, fetched=False)

    def _accept(self, payload: bytes, fetched: bool) -> None:
        try:
            message = decode(payload, self.max_plan_bytes)
        except ProtocolError as exc:
            self.stats.rejected += 1
            logger.warning("chronica: rank %d refused a message: %s", self.rank, exc)
            return
        kind = message["t"]
        if kind == "welcome":
            self.window = message["window"]
            if not self._attached and self._warned:
                logger.warning("chronica: rank %d: coordinator is back", self.rank)
                self._warned = False
            self._attached = True
        elif kind == "error":
            if message["code"] in ("digest", "world"):
                raise CoordinatorRefused(message["msg"])
            logger.warning("chronica: rank %d: coordinator error: %s", self.rank, message["msg"])
        elif kind == "plan":
            plan: Plan = message["plan"]
            if not fetched:
                self.stats.published += 1
                if plan.seq > self._last_seq + 1 and self._last_seq >= 0:
                    self.stats.gaps += plan.seq - self._last_seq - 1
                self._last_seq = max(self._last_seq, plan.seq)
            else:
                self.stats.fetched += 1
            self._plans[(plan.epoch, plan.first)] = plan
