"""The coordinator's public sockets, in a child process that cannot take the trainer down.

libzmq reads a multipart message whole before it hands over its first frame, and its
limits count messages and cap each frame's size, not the number of frames: one message of
empty frames grows the receiving process by about 32 bytes of memory per byte on the wire
(4 MB sent: 125 MB), and the process aborts when memory runs out. No socket option bounds
that, so the sockets anyone can reach live in a *gate* process of their own:

* the parent (the coordinator: a thread of rank 0, or ``chronica coordinator``) binds the
  TCP listening sockets itself and hands them to the gate (``ZMQ_USE_FD``), so the ports
  stay held while a gate is replaced;
* the gate runs the ROUTER and PUB sockets (CURVE and its authenticator too, when on) and
  relays over a private IPC link (a folder only this user can open): requests of exactly
  one frame and at most ``MAX_REQUEST_BYTES`` up, answers and plans down;
* the gate bounds what peers cost: every connection may send ``PEER_BYTES`` bytes at
  once and ``PEER_BYTES`` per second (measured by the kernel's per-connection byte count,
  ``TCP_INFO``, whenever the gate's memory grows by ``SWEEP_GROWTH`` and at least once a
  second); a connection beyond it is cut, which frees whatever libzmq buffered for it.
  Connections are admitted so that real ranks win (``chronica.comm.admission``): a full
  socket evicts its oldest unproven connection instead of refusing the newcomer, one
  source address holds at most ``PER_SOURCE`` unproven ones, and a ROUTER connection
  without a valid ``hello`` goes after ``HELLO_SECONDS``. Requests from connections that
  have not said a valid ``hello`` pass at most ``STRANGER_FIRST`` at once per connection
  and, beyond each one's first, ``STRANGER_RATE`` per second in all (a burst of
  ``2 · world + 64``); the link holds at most
  ``2 · LINK_HWM`` bundles of ``BUNDLE`` requests. Past ``SOFT_BYTES`` of resident memory
  the gate exits, and its address space is capped at ``HARD_BYTES`` (``RLIMIT_AS``): the
  parent starts a new one on the same ports and the ranks say ``hello`` again. Nothing a
  peer sends ever reaches the parent except requests that fit in one small frame, at a
  bounded rate.

This module is the parent's end (``Gate``); the gate's loop, the limits and their defaults
are in ``chronica.comm.gate_process``, which imports only the standard library and pyzmq
(and ``auth.py`` by its path), so a gate starts in about 0.1 s instead of loading numpy and
numba.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import zmq

from chronica.comm.gate_process import GateLimits

__all__ = ["Gate"]

logger = logging.getLogger("chronica")

# How long a new gate may take to say it is ready.
_READY_SECONDS = 30.0
# The gate's program: run as a script, in isolated mode.
_PROGRAM = str(Path(__file__).with_name("gate_process.py"))


def _listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``OSError`` as ``bind`` raises it)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST | socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


class Gate:
    """The parent's end: binds ``host`` on ``ports`` (``0``: any free port), runs a gate
    process on them and relays through ``link``, a PAIR socket of ``context``.

    ``OSError`` from ``bind`` is a bind failure (port in use, address not local;
    ``failed_port`` says which); ``RuntimeError`` from ``open`` a gate that did not start.

    Args:
        context: the ZeroMQ context of the link.
        host: the numeric address to bind (``chronica.comm.address.resolve_bind``).
        ports: the ROUTER and PUB ports.
        world: the job's ranks (sizes the burst of strangers' requests).
        curve: the ``CurveServer`` whose keys the gate's sockets use (``None``: none).
        limits: what the gate lets peers cost (default ``GateLimits()``).

    Example::

        >>> gate = Gate(zmq.Context.instance(), "127.0.0.1", (0, 0), world=4)
        >>> router_port, pub_port = gate.bind()
        >>> gate.open()  # requests arrive on gate.link as [b"m", identity, payload, ...]
        >>> gate.close()
    """

    def __repr__(self) -> str:
        return f"Gate(host={self.host!r}, ports={self.ports}, pid={self.pid()})"

    def __init__(
        self,
        context: zmq.Context,
        host: str,
        ports: tuple[int, int],
        world: int,
        curve: Any = None,
        limits: GateLimits | None = None,
    ) -> None:
        self.host = host
        self.limits = limits or GateLimits()
        self._context = context
        self._world = world
        self._curve = curve
        self._listeners: list[socket.socket] = []
        self.ports = ports
        self.failed_port = (ports[0], "router")  # the port ``bind`` failed on, and its role
        self._folder: str | None = None
        self.link: zmq.Socket | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        # When the gates of the last minute ended (at most ``restarts_per_minute``).
        self._ended: deque[float] = deque(maxlen=self.limits.restarts_per_minute)
        self._retry_at = 0.0

    def bind(self) -> tuple[int, int]:
        """Bind the two listening sockets and return their ports; on ``OSError``,
        ``failed_port`` says which one failed."""
        for port, role in zip(self.ports, ("router", "pub"), strict=True):
            self.failed_port = (port, role)
            self._listeners.append(_listener(self.host, port))
        self.ports = (self._listeners[0].getsockname()[1], self._listeners[1].getsockname()[1])
        return self.ports

    def open(self) -> None:
        """Open the link and start the first gate; ``RuntimeError`` if it does not start."""
        self._folder = tempfile.mkdtemp(prefix="chronica-gate-")  # mode 700: this user only
        self.link = self._context.socket(zmq.PAIR)
        self.link.setsockopt(zmq.LINGER, 0)
        self.link.setsockopt(zmq.RCVHWM, self.limits.link_hwm)
        self.link.setsockopt(zmq.SNDHWM, 0)
        self.link.bind(f"ipc://{self._folder}/link")
        self._spawn()
        if not self._ready():
            raise RuntimeError(
                "chronica coordinator: its gate process did not start "
                f"(exit status {self._child.poll() if self._child else None}); see its stderr"
            )

    def _spawn(self) -> None:
        assert self._folder is not None
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # fewer 64 MB arenas against RLIMIT_AS
        child = subprocess.Popen(
            [sys.executable, "-I", _PROGRAM],
            stdin=subprocess.PIPE,
            pass_fds=[s.fileno() for s in self._listeners],
            env=env,
        )
        config = {
            "link": f"ipc://{self._folder}/link",
            "fds": [s.fileno() for s in self._listeners],
            "urls": [_url(self.host, port) for port in self.ports],
            "ipv6": ":" in self.host,
            "world": self._world,
            "limits": self.limits.__dict__,
            "curve": None
            if self._curve is None
            else {
                "secret": self._curve.secret.decode(),
                "allowed": sorted(k.decode() for k in self._curve.allowed),
            },
        }
        assert child.stdin is not None
        child.stdin.write(json.dumps(config).encode() + b"\n")
        child.stdin.flush()  # stays open: the gate exits when it closes (this process ended)
        self._child = child

    def _ready(self) -> bool:
        assert self.link is not None and self._child is not None
        deadline = time.monotonic() + _READY_SECONDS
        while time.monotonic() < deadline:
            if self.link.poll(50):
                if self.link.recv_multipart()[0] == b"ready":
                    return True
            elif self._child.poll() is not None:
                return False
        return False

    def alive(self) -> bool:
        """Whether a gate serves; a gate that died is replaced at once, at most
        ``GateLimits.restarts_per_minute`` times in any minute (beyond, the next start waits until a
        minute has passed since the oldest of them, and a warning says so), and ``False``
        is returned until the new one is ready."""
        child = self._child
        if child is not None and child.poll() is None:
            return True
        now = time.monotonic()
        if child is not None:
            self._reap(child)
            self._child = None
            self.restarts += 1
            if len(str(self.restarts)) != len(str(self.restarts - 1)) or self.restarts == 2:
                # 1st, 2nd, 10th, 100th...: a kill a second must not flood the log.
                logger.warning(
                    "chronica: coordinator: its gate process ended (status %s, %d restarts "
                    "so far); starting another on the same ports",
                    child.returncode,
                    self.restarts,
                )
            if len(self._ended) == self._ended.maxlen and now - self._ended[0] < 60.0:
                self._retry_at = self._ended[0] + 60.0
                logger.warning(
                    "chronica: coordinator: its gate process ended %d times in the last "
                    "minute, the most it is restarted at once; the next starts in %.1f s "
                    "(until then the ranks use the static plan). Something kills it on "
                    "purpose: a peer (see SECURITY.md) or the kernel, short of memory",
                    len(self._ended),
                    self._retry_at - now,
                )
            self._ended.append(now)
        if now < self._retry_at:
            return False
        self._spawn()
        return self._ready()

    def pid(self) -> int | None:
        """The running gate's process id."""
        return None if self._child is None else self._child.pid

    @staticmethod
    def _reap(child: subprocess.Popen[bytes]) -> None:
        if child.stdin is not None:
            try:
                child.stdin.close()
            except OSError:
                pass  # the gate is gone: its end of the pipe too
        try:
            child.wait(2.0)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def close(self) -> None:
        """Stop the gate, close the link and the listening sockets (idempotent)."""
        if self._child is not None:
            self._reap(self._child)
            self._child = None
        if self.link is not None:
            self.link.close(0)
            self.link = None
        for sock in self._listeners:
            sock.close()
        self._listeners = []
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
