"""One rank's side of a chronica job, framework-neutral (imports ``core`` and ``comm`` only).

``RankStream`` is the per-rank object the adapters under ``chronica.adapters`` are thin
faces of: scheduler, epoch and position, the dynamic session with its all-ranks agreement
and fallback, elastic resume, loss weights, diagnostics and one state format.
``DynamicOptions`` is the transport of ``kind="dynamic"`` for every adapter; the faces build
their plan request with ``chronica.runtime.request``.
"""

from chronica.runtime.agreement import NO_PLAN, Agreement, KeyValueAgreement, Token
from chronica.runtime.micro import MicroBatch
from chronica.runtime.options import DynamicOptions
from chronica.runtime.stream import STATE_VERSION, LocalBatch, RankStream

__all__ = [
    "NO_PLAN",
    "STATE_VERSION",
    "Agreement",
    "DynamicOptions",
    "KeyValueAgreement",
    "LocalBatch",
    "MicroBatch",
    "RankStream",
    "Token",
]
