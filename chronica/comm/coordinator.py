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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from chronica.comm.protocol import MAX_REQUEST_BYTES, ProtocolError, decode, encode, plan_message
from chronica.comm.protocol import topic as rank_topic
from chronica.core.dynamic import DynamicPlanner
from chronica.core.plan import WindowPlan
from chronica.core.scheduler import Scheduler

__all__ = ["DEFAULT_PORT", "Coordinator", "CoordinatorStats", "resolve_endpoint"]

logger = logging.getLogger("chronica")

DEFAULT_PORT = 50051
_POLL_MS = 50


def resolve_endpoint(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """``(host, port)`` from the arguments, else ``MASTER_ADDR`` / ``CHRONICA_PORT``, else
    loopback and ``DEFAULT_PORT``. The PUB socket uses ``port + 1``."""
    host = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if port is None:
        text = os.environ.get("CHRONICA_PORT")
        try:
            port = int(text) if text else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"CHRONICA_PORT={text!r} must be a port number") from None
    if not isinstance(port, int) or not 0 <= port <= 65534:
        raise ValueError(f"port={port!r} must be an int in [0, 65534] (0: any free port)")
    return host, port


@dataclass
class CoordinatorStats:
    """What the coordinator did: requests served, reports taken, messages refused."""

    hellos: int = 0
    fetches: int = 0
    reports: int = 0
    windows: int = 0
    published_bytes: int = 0
    published_indices: int = 0
    rejected: int = 0


class Coordinator:
    """Serves ``kind="dynamic"`` plans of ``scheduler`` to its ranks.

    Binds to ``host`` (default ``MASTER_ADDR`` or loopback; never every interface unless
    ``host="0.0.0.0"`` is asked for) on ``port`` (ROUTER) and ``port + 1`` (PUB); ``port=0``
    picks free ports (see ``endpoint``). A port already in use is a ``RuntimeError`` that
    names it. ``start()`` returns at once; the thread serves until ``close()``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        host: str | None = None,
        port: int | None = None,
        *,
        context: zmq.Context | None = None,
    ) -> None:
        self.planner = DynamicPlanner(scheduler)
        self.scheduler = scheduler
        self.host, self._port = resolve_endpoint(host, port)
        self.stats = CoordinatorStats()
        self._context = context or zmq.Context.instance()
        self._router: zmq.Socket | None = None
        self._pub: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seq: dict[tuple[int, int], int] = {}
        self.endpoint: tuple[str, int, int] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Coordinator:
        """Bind both sockets and start serving in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the coordinator is already running")
        router = self._context.socket(zmq.ROUTER)
        pub = self._context.socket(zmq.PUB)
        for sock in (router, pub):
            sock.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        try:
            ports = self._bind(router, pub)
        except BaseException:
            router.close(0)
            pub.close(0)
            raise
        self._router, self._pub = router, pub
        self.endpoint = (self.host, *ports)
        self._thread = threading.Thread(
            target=self._serve, name="chronica-coordinator", daemon=True
        )
        self._thread.start()
        logger.info("chronica: coordinator serving on %s:%d (pub %d)", self.host, *ports)
        return self

    def _bind(self, router: zmq.Socket, pub: zmq.Socket) -> tuple[int, int]:
        base = f"tcp://{self.host}"
        try:
            if self._port == 0:
                return router.bind_to_random_port(base), pub.bind_to_random_port(base)
            router.bind(f"{base}:{self._port}")
            pub.bind(f"{base}:{self._port + 1}")
            return self._port, self._port + 1
        except zmq.ZMQError as exc:
            raise RuntimeError(
                f"chronica coordinator cannot bind {self.host}:{self._port}/{self._port + 1} "
                f"({exc}); another job may be using it: pass port= or set CHRONICA_PORT to "
                f"a free port (the next one is used for publishing)"
            ) from exc

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and close the sockets (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("chronica: coordinator thread did not stop in %.1f s", timeout)
            self._thread = None
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(0)
        self._router = self._pub = None

    def __enter__(self) -> Coordinator:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ------------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._router is not None
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError:
                break
            if self._router not in ready:
                continue
            for _ in range(1024):  # drain, but let the stop flag be seen now and then
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    return
                self._handle(frames)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self.stats.rejected += 1
            if frames:
                self._reply(frames[0], "error", code="frames", msg="expected one frame")
            return
        identity, payload = frames
        try:
            message = decode(payload)
            kind = message["t"]
            if kind == "hello":
                self._hello(identity, message)
            elif kind == "fetch":
                self._fetch(identity, message)
            elif kind == "report":
                self._report(message)
            else:
                raise ProtocolError(f"a rank may not send {kind!r} messages")
        except ProtocolError as exc:
            self.stats.rejected += 1
            logger.warning("chronica: coordinator refused a message: %s", exc)
            self._reply(identity, "error", code="protocol", msg=str(exc))
        except Exception as exc:  # a bug must not take the coordinator down with it
            self.stats.rejected += 1
            logger.exception("chronica: coordinator failed on a message")
            self._reply(identity, "error", code="internal", msg=f"{type(exc).__name__}: {exc}")

    def _reply(self, identity: bytes, kind: str, **fields: Any) -> None:
        assert self._router is not None
        try:
            self._router.send_multipart([identity, encode(kind, **fields)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or its queue is full; it will time out and fall back

    def _check_rank(self, rank: int) -> None:
        world = self.scheduler.config.num_replicas
        if rank >= world:
            raise ProtocolError(f"rank {rank} is outside this job's world of {world}")

    def _hello(self, identity: bytes, message: dict[str, Any]) -> None:
        self._check_rank(message["rank"])
        world = self.scheduler.config.num_replicas
        if message["world"] != world:
            self._reply(
                identity,
                "error",
                code="world",
                msg=f"rank {message['rank']} says the world has {message['world']} ranks; "
                f"the coordinator plans for {world}",
            )
            return
        if message["digest"] != self.scheduler.digest:
            self._reply(
                identity,
                "error",
                code="digest",
                msg=f"the sizes or sampler arguments of rank {message['rank']} differ from "
                f"the coordinator's (digest {message['digest']} != {self.scheduler.digest}); "
                f"build the sampler with the same data set, sizes and arguments on every rank",
            )
            return
        self.stats.hellos += 1
        self._reply(
            identity, "welcome", window=self.planner.window, steps=self.scheduler.num_steps()
        )

    def _fetch(self, identity: bytes, message: dict[str, Any]) -> None:
        rank = message["rank"]
        self._check_rank(rank)
        epoch, first = message["epoch"], message["first"]
        steps = self.scheduler.num_steps()
        if first % self.planner.window or first >= steps:
            raise ProtocolError(f"first={first} is not a window start of an epoch of {steps} steps")
        plan = self._ensure(epoch, first)
        self.stats.fetches += 1
        assert self._router is not None
        try:
            self._router.send_multipart(
                [identity, self._part(plan, rank, self._seq[(epoch, first)])], zmq.NOBLOCK
            )
        except zmq.ZMQError:
            pass
        self._ensure_next(epoch, first)

    def _report(self, message: dict[str, Any]) -> None:
        rank = message["rank"]
        self._check_rank(rank)
        self.stats.reports += 1
        self.planner.observe(rank, message["step"], message["load"], message["seconds"])
        window = self.planner.window
        first = message["step"] - message["step"] % window
        if message["step"] - first >= window // 2:
            self._ensure_next(message["epoch"], first)

    def _ensure_next(self, epoch: int, first: int) -> None:
        """Plan (and publish) the window after ``(epoch, first)`` if not done yet."""
        following = first + self.planner.window
        if following < self.scheduler.num_steps():
            self._ensure(epoch, following)
        else:
            self._ensure(epoch + 1, 0)

    def _ensure(self, epoch: int, first: int) -> WindowPlan:
        plan = self.planner.planned(epoch, first)
        if plan is not None:
            return plan
        plan = self.planner.plan_window(epoch, first)
        seq = self.stats.windows
        self.stats.windows += 1
        self._seq[(epoch, first)] = seq
        for old in [k for k in self._seq if k[0] < epoch - 1]:
            del self._seq[old]
        self._publish(plan, seq)
        return plan

    def _part(self, plan: WindowPlan, rank: int, seq: int) -> bytes:
        starts, ends = plan.bounds[:, rank], plan.bounds[:, rank + 1]
        indices = (
            np.concatenate([plan.indices[a:b] for a, b in zip(starts, ends, strict=True)])
            if plan.num_steps
            else np.empty(0, np.int64)
        )
        offsets = np.concatenate([[0], np.cumsum(ends - starts)])
        return plan_message(
            seq,
            plan.epoch,
            plan.first_step,
            indices,
            offsets,
            plan.loss_weights[:, rank],
            plan.loads[:, rank],
        )

    def _publish(self, plan: WindowPlan, seq: int) -> None:
        assert self._pub is not None
        started = time.perf_counter()
        for rank in range(plan.num_replicas):
            payload = self._part(plan, rank, seq)
            self.stats.published_bytes += len(payload)
            try:
                self._pub.send_multipart([rank_topic(rank), payload], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a slow subscriber: it fetches what it missed
        self.stats.published_indices += int(plan.indices.shape[0])
        logger.debug(
            "chronica: published epoch %d steps %d..%d (seq %d) in %.1f ms",
            plan.epoch,
            plan.first_step,
            plan.first_step + plan.num_steps - 1,
            seq,
            1e3 * (time.perf_counter() - started),
        )
