"""The knobs of ``kind="dynamic"``, one options object for every adapter."""

from __future__ import annotations

from dataclasses import dataclass, field

from chronica.core.checks import check_int, check_seconds
from chronica.core.controller import ControllerOptions

__all__ = ["DynamicOptions"]


@dataclass(frozen=True)
class DynamicOptions:
    """How ``kind="dynamic"`` re-plans and reaches its coordinator (validated on construction).

    ``window``: steps planned at a time (the controller re-evaluates once per window);
    ``min_batch``/``max_batch``: per-rank bounds on local batch sizes with
    ``variable_batch=True`` (default 1 and the global batch); ``controller``: the feedback
    loop's tuning. These four shape the plans and are part of the configuration digest.
    ``host``/``port``: where rank 0's coordinator listens and the ranks connect (default
    ``MASTER_ADDR`` or loopback, and ``CHRONICA_PORT`` or 50051; port 0 picks a free one;
    the coordinator also uses the next port; ``CHRONICA_COORDINATOR=host:port`` names a
    standalone one instead); ``timeout``: the longest wait, in seconds, for a window's plan
    before the ranks fall back to the static plan together.
    """

    window: int = 16
    min_batch: int | None = None
    max_batch: int | None = None
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    host: str | None = None
    port: int | None = None
    timeout: float = 10.0

    def __post_init__(self) -> None:
        check_int("window", self.window, 1)
        for name in ("min_batch", "max_batch"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if self.port is not None:
            object.__setattr__(self, "port", check_int("port", self.port, 0, 65534))
        if self.host is not None and not (isinstance(self.host, str) and self.host.strip()):
            raise ValueError(f"host={self.host!r} must be a host name or address")
        object.__setattr__(self, "timeout", check_seconds("timeout", self.timeout))
        if not isinstance(self.controller, ControllerOptions):
            raise ValueError(
                f"controller={self.controller!r} must be a chronica.core.ControllerOptions"
            )
