"""A Chrome-trace timeline of one rank's gradient communication (``CHRONICA_TIMELINE``).

Framework-free; written by ``chronica.runtime.dispatcher`` and the adapters' gradient shims.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

__all__ = ["Timeline", "timeline_path"]


def timeline_path(path: str, rank: int, world: int) -> str:
    """The per-rank file name for a timeline ``path`` (see ``SchedulingOptions``)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world <= 1:
        return path
    root, dot, ext = path.rpartition(".")
    return f"{root}.rank{rank}.{ext}" if dot and "/" not in ext else f"{path}.rank{rank}"


class Timeline:
    """A Chrome-trace (JSON array format) file of complete ("X") events, loadable by
    chrome://tracing and Perfetto. Complete JSON once ``close`` ran; until then it is the
    array format's accepted unterminated form. Thread-safe."""

    def __init__(self, path: str, pid: int = 0) -> None:
        self._file = open(path, "w")
        self._pid = pid
        self._lock = threading.Lock()
        self._first = True
        self._t0 = time.perf_counter()
        self._wall0_us = time.time() * 1e6
        self._file.write("[\n")
        meta = {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid}"}}
        self._write(meta)

    def _write(self, event: dict) -> None:
        text = json.dumps(event, separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return
            self._file.write(text if self._first else ",\n" + text)
            self._first = False

    def span(self, name: str, tid: str, start: float, end: float, **args: Any) -> None:
        """One span from ``start`` to ``end`` (``time.perf_counter`` seconds) on row ``tid``."""
        ts = self._wall0_us + (start - self._t0) * 1e6
        self._write(
            {
                "name": name,
                "ph": "X",
                "pid": self._pid,
                "tid": tid,
                "ts": round(ts, 3),
                "dur": round(max(0.0, end - start) * 1e6, 3),
                "args": args,
            }
        )

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write("\n]\n")
                self._file.close()
