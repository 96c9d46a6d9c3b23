"""Measure each rank's own compute time on a DDP model and feed it to the dynamic scheduler.

In synchronous training every rank's *step* time is the same (they all wait for the
gradient all-reduce), so it says nothing about which rank is slow. ``ComputeTimer`` times
from the start of the model's forward to the moment DDP hands the step's last gradient
bucket to the all-reduce: this rank's forward and backward, and nothing of the waiting.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at runtime
# and refuses string ones.

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = ["ComputeTimer"]


class ComputeTimer:
    """Times this rank's compute per step on ``model`` and reports it to ``sampler``.

    Registers a forward pre-hook and a DDP communication hook (an all-reduce averaging the
    gradients exactly like DDP's default one), so the model must not have another comm hook;
    with your own hook, time the step yourself and call ``sampler.report(seconds)``.
    ``seconds`` holds the last step's measurement (``native_seconds`` before any emulated
    slowdown, ``cpu_seconds`` its thread CPU time). With gradient accumulation the time runs
    from the first forward after the last report to the synchronising backward.

    ``slowdown`` (tests, benchmarks, the demo) returns this rank's emulated slowdown factor
    ``f >= 1`` for the step; the rank then sleeps ``(f - 1)`` times its measured compute
    before the all-reduce, so it behaves like a rank ``f`` times slower, and reports ``f``
    times the measurement.

    Args:
        model: the ``DistributedDataParallel``-wrapped model (``TypeError`` otherwise).
        sampler: what receives ``report(seconds)`` after every step (a chronica sampler
            with ``kind="dynamic"``), or ``None`` to only measure.
        slowdown: returns this rank's emulated slowdown factor for the step, or ``None``.

    Example::

        ddp = DistributedDataParallel(model)
        timer = ComputeTimer(ddp, sampler)   # every backward reports this rank's compute
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        sampler: Any = None,
        *,
        slowdown: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"model={type(model).__name__} must be the DistributedDataParallel-wrapped "
                "model: ComputeTimer(DistributedDataParallel(model), sampler)"
            )
        self.sampler = sampler
        self.slowdown = slowdown
        self.seconds = math.nan
        self.native_seconds = math.nan
        self.cpu_seconds = math.nan
        self._started: float | None = None
        self._started_cpu = 0.0
        self._group = model.process_group
        self._world = dist.get_world_size(self._group)
        model.register_forward_pre_hook(self._start)
        model.register_comm_hook(self, _timed_average)

    def __repr__(self) -> str:
        return (
            f"ComputeTimer(world={self._world}, reports_to={type(self.sampler).__name__}, "
            f"seconds={self.seconds:.4g})"
        )

    def _start(self, module: Any, inputs: Any) -> None:
        if self._started is None:
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()

    def _stop(self) -> None:
        if self._started is None:
            return
        elapsed = time.perf_counter() - self._started
        self.native_seconds = elapsed
        self.cpu_seconds = time.thread_time() - self._started_cpu
        factor = 1.0 if self.slowdown is None else float(self.slowdown())
        if factor > 1.0:
            time.sleep(elapsed * (factor - 1.0))
            elapsed *= factor
        self._started = None
        self.seconds = elapsed
        if self.sampler is not None:
            self.sampler.report(elapsed)


def _timed_average(
    timer: ComputeTimer, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    # DDP calls the hook once a bucket's gradients are computed, buckets in order, so the
    # last bucket's call marks the end of this rank's own compute.
    if bucket.is_last():
        timer._stop()
    buffer = bucket.buffer().div_(timer._world)
    future = dist.all_reduce(buffer, group=timer._group, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])
