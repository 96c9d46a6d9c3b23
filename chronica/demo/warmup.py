"""The demo's first run in an environment: numba compiles chronica's balancing kernels
once and caches them next to chronica's sources; the demo announces it and compiles them in
the launching process before the ranks start, so no rank sits silently at its first plan and
the ranks' estimate covers training only (no torch here)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import chronica
from chronica.demo.config import DemoConfig, cost_model_for

__all__ = ["kernels_cached", "warm_up"]


def kernels_cached() -> bool:
    """Whether numba's cache of chronica's kernels exists (a previous run compiled them)."""
    package = Path(chronica.__file__).resolve().parent
    return any(package.rglob("__pycache__/*.nbi"))


def warm_up(config: DemoConfig) -> float:
    """Plan a small epoch as the ranks will (the same kind, cost model and world), which
    compiles and caches every kernel they use; returns the seconds it took.

    Args:
        config: the demo's configuration.

    Example::

        seconds = warm_up(config)   # ~100 s the first time on 2 cores, then well under 1 s
    """
    from chronica.core import ScheduleConfig, Scheduler

    started = time.perf_counter()
    sizes = np.asarray(config.lengths[: 8 * config.batch_size], dtype=np.int64)
    schedule = ScheduleConfig(
        num_replicas=config.world_size,
        batch_size=config.batch_size,
        kind=config.kind,
        cost=cost_model_for(config.cost, config.dim, config.hidden),
    )
    scheduler = Scheduler(sizes, schedule)
    scheduler.plan_stats(scheduler.plan_epoch(0))
    return time.perf_counter() - started
