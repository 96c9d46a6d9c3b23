"""Helpers for tests that start real worker processes talking over 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "HELPERS",
    "ROOT",
    "base_env",
    "free_port",
    "free_ports",
    "run_workers",
    "start_workers",
    "wait_workers",
]


# The repository root, and this folder (the worker scripts).
ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` consecutive TCP ports on 127.0.0.1 that were free a moment ago (the
    coordinator listens on a port and publishes on the next)."""
    for _ in range(100):
        base = free_port()
        if base + count > 65536:
            continue
        socks = []
        try:
            for offset in range(1, count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + offset))
            return [base + offset for offset in range(count)]
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


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
    worker's output when it exits non-zero; kills whatever still runs when time is up, so
    no worker outlives the test."""
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
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
