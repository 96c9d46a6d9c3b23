"""``DynamicOptions``: how the ranks of ``kind="dynamic"`` reach rank 0's coordinator.

Only the transport lives here: where the coordinator listens and how long a rank waits for
it. What shapes the plans (``window``, ``min_batch``, ``max_batch``, ``controller``) is part
of the plan request, ``chronica.ScheduleConfig``, and every face takes it as a keyword; the
two objects are passed side by side (``config=..., dynamic=...``). The coordinator's CURVE
keys are read from the environment (``chronica.comm.auth``), never passed in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chronica.core.checks import check_int, check_seconds

__all__ = ["DynamicOptions"]

# Fields this object held before they moved into the plan request.
_PLAN_FIELDS = ("window", "min_batch", "max_batch", "controller")


@dataclass(frozen=True, init=False)
class DynamicOptions:
    """Where rank 0's coordinator listens and how long ranks wait for it (validated on
    construction).

    Args:
        host: the address the coordinator binds and the ranks connect to (default
            ``MASTER_ADDR``, else loopback; ``CHRONICA_COORDINATOR=host:port`` names a
            standalone coordinator instead).
        port: its port (default ``CHRONICA_PORT`` or 50051; 0 lets the OS pick one); the
            coordinator also uses the next port.
        timeout: the longest wait, in seconds, for a window's plan before the ranks fall
            back to the static plan together.

    Example::

        >>> from chronica.runtime import DynamicOptions
        >>> DynamicOptions(port=0, timeout=30)
        DynamicOptions(host=None, port=0, timeout=30.0)
    """

    host: str | None
    port: int | None
    timeout: float

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        timeout: float = 10.0,
        **moved: Any,
    ) -> None:
        for name in moved:
            if name in _PLAN_FIELDS:
                raise TypeError(
                    f"DynamicOptions({name}=...) moved: {name} shapes the plan, so it is an "
                    f"option of the plan request; pass {name}= to the sampler, schedule or "
                    f"iterator (or to chronica.ScheduleConfig) instead"
                )
            raise TypeError(
                f"DynamicOptions got an unexpected keyword argument {name!r}; it takes "
                "host, port and timeout"
            )
        if port is not None:
            port = check_int("port", port, 0, 65534)
        if host is not None:
            if not isinstance(host, str):
                raise TypeError(f"host={host!r} must be a host name or address (a str)")
            if not host.strip():
                raise ValueError(f"host={host!r} must be a host name or address")
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "timeout", check_seconds("timeout", timeout))
