"""Ports for servers whose peers must know the port before it is bound.

A server that binds port 0 and reports what it got is the safe way to listen; a job whose
processes must all be told one address before any of them starts (``TF_CONFIG``'s cluster,
``jax.distributed``'s coordinator, chronica's coordinator at ``CHRONICA_PORT``) cannot do
that. The usual work-around, binding port 0, closing the socket and handing its number on,
draws from the kernel's ephemeral range, the range every outgoing connection on the machine
also takes its source port from: one of them can take the port in the seconds before the
server binds it, and the server fails to start. ``free_port`` draws below that range
instead.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

# Linux's default ephemeral range starts here, and other systems' (49152) above it.
_EPHEMERAL_LOW = 32768
_LOWEST = 10_000
_TRIES = 1000
_draw = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW
    return low if low > _LOWEST + 1000 else _EPHEMERAL_LOW


def free_port(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive TCP ports on ``host`` that were all free a moment
    ago, drawn at random below the kernel's ephemeral range.

    No outgoing connection takes such a port as its source port in the meantime, and two
    jobs starting at once rarely draw the same one; a process that binds it in between
    still can (the port is free, not reserved), so bind it soon.

    Args:
        count: how many consecutive ports, e.g. 2 for chronica's coordinator, which listens
            on its port and publishes on the next.
        host: the address the ports are checked on.

    Raises:
        TypeError: ``count`` is not an int.
        ValueError: ``count`` is below 1.
        OSError: no such run of free ports was found.

    Example::

        >>> port = free_port(2)            # e.g. os.environ["CHRONICA_PORT"] = str(port)
        >>> 10_000 <= port < 65_535
        True
    """
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"count={count!r} must be an int, e.g. 2 for a coordinator")
    if count < 1:
        raise ValueError(f"count={count} must be at least 1")
    low = _ephemeral_low()
    high = low - count + 1  # the run's last port stays below ``low``
    for _ in range(_TRIES):
        port = _draw.randrange(_LOWEST, high)
        try:
            for offset in range(count):
                with socket.socket() as s:
                    s.bind((host, port + offset))
        except OSError:
            continue
        return port
    raise OSError(
        f"no {count} consecutive free TCP ports on {host} between {_LOWEST} and {low - 1}"
    )
