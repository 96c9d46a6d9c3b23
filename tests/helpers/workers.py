"""Helpers for tests that start real worker processes talking over 127.0.0.1.

Two rules keep these tests green on a busy machine. Time-outs scale with the load
(``scaled``): a limit that suits a quiet machine is multiplied by the load per core when
the wait starts. And no port is guessed where the OS can pick it: a torch job meets at a
``TCPStore`` this process binds to port 0 and holds (``torch_rendezvous``, as torchrun's
agent does); only servers whose peers must know the port before it is bound (TF's gRPC
servers, JAX's and chronica's coordinators) take one from ``free_port`` (``chronica.comm.ports``),
which draws outside the range the kernel hands out to outgoing connections.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from chronica.comm.ports import free_port

__all__ = [
    "HELPERS",
    "ROOT",
    "base_env",
    "free_port",
    "free_ports",
    "run_workers",
    "scaled",
    "start_workers",
    "torch_rendezvous",
    "wait_workers",
]


# The repository root, and this folder (the worker scripts).
ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def scaled(seconds: float) -> float:
    """``seconds`` for a machine as busy as this one is now: times the load per core (at
    least 1) and ``CHRONICA_TEST_TIME_SCALE`` (default 1), so a limit meant for a quiet
    machine still only catches hangs on a loaded one."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(1.0, load) * float(os.environ.get("CHRONICA_TEST_TIME_SCALE", "1"))


@contextmanager
def torch_rendezvous(world: int) -> Iterator[dict[str, str]]:
    """The environment that makes ``init_process_group(init_method="env://")`` in ``world``
    worker processes meet at a ``TCPStore`` this process hosts on a port the OS picked, for
    as long as the ``with`` block lasts (torchrun's agent store: every rank is a client)."""
    from torch.distributed import TCPStore

    store = TCPStore(
        "127.0.0.1",
        0,
        world,
        is_master=True,
        timeout=timedelta(seconds=scaled(300)),
        wait_for_workers=False,
    )
    try:
        yield {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    finally:
        del store


def free_ports(count: int) -> list[int]:
    """``count`` consecutive TCP ports on 127.0.0.1 that were free a moment ago (the
    coordinator listens on a port and publishes on the next)."""
    base = free_port(count)
    return list(range(base, base + count))


def start_workers(
    commands: Sequence[Sequence[str]], env: Mapping[str, str] | Sequence[Mapping[str, str]]
) -> list[subprocess.Popen]:
    """Start every command at once, output captured; ``env`` is one environment for all or
    one per command."""
    envs = [env] * len(commands) if isinstance(env, Mapping) else list(env)
    return [
        subprocess.Popen(
            list(cmd),
            env=dict(e),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd, e in zip(commands, envs, strict=True)
    ]


def wait_workers(procs: Sequence[subprocess.Popen], timeout: float) -> list[str]:
    """Wait for every worker; returns their outputs. Fails the test with the tail of a
    worker's output when it exits non-zero; kills whatever still runs when time is up
    (``scaled(timeout)`` from now), so no worker outlives the test."""
    deadline = time.monotonic() + scaled(timeout)
    try:
        logs = [p.communicate(timeout=max(0.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    return logs


def run_workers(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | Sequence[Mapping[str, str]],
    timeout: float,
) -> list[str]:
    """Start every command at once and wait for all (``start_workers``, ``wait_workers``)."""
    return wait_workers(start_workers(commands, env), timeout)


def base_env(root: os.PathLike[str] | str, **extra: str) -> dict[str, str]:
    """This process's environment with ``root`` importable and ``extra`` set."""
    return {**os.environ, "PYTHONPATH": str(root), **extra}
