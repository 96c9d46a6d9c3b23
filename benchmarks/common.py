"""Shared pieces of the benchmarks: data sets, the balance metric, machine information.

The metric is the one ``chronica.core.PlanStats`` reports, computed here from any assignment
of samples to (step, rank), so that chronica's plans and the peers' are measured by one
function: per step, the slowest rank's cost over the mean rank cost (1.0 is perfect), and the
bound ``max(mean rank cost, largest single sample cost) / mean`` that no split of that step's
samples can beat.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "Assignment",
    "LengthOnly",
    "equal_count_bound",
    "heavy_tailed_sizes",
    "lognormal_sizes",
    "machine_info",
    "read_lengths",
    "step_metrics",
]


@dataclass(frozen=True)
class Assignment:
    """Which samples every rank trains on at every step of one epoch.

    The layout is ``chronica.core.EpochPlan``'s: rank ``r``'s samples at step ``s`` are
    ``indices[bounds[s, r] : bounds[s, r + 1]]``, and ``loads[s, r]`` is their total cost.
    """

    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray

    @classmethod
    def build(cls, indices: np.ndarray, bounds: np.ndarray, costs: np.ndarray) -> Assignment:
        """An assignment with ``loads`` computed from ``costs`` (one cost per sample)."""
        indices = np.asarray(indices, dtype=np.int64)
        bounds = np.asarray(bounds, dtype=np.int64)
        per_sample = costs[indices]
        steps, width = bounds.shape
        loads = np.zeros((steps, width - 1))
        for s in range(steps):
            for r in range(width - 1):
                loads[s, r] = per_sample[bounds[s, r] : bounds[s, r + 1]].sum()
        return cls(indices, bounds, loads)

    @property
    def num_steps(self) -> int:
        """Steps in the epoch."""
        return int(self.bounds.shape[0])


class LengthOnly:
    """A stand-in data set for ``torch.utils.data.DistributedSampler``: only its length
    matters to the sampler."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def lognormal_sizes(n: int, seed: int, mu: float = 5.0, sigma: float = 1.0) -> np.ndarray:
    """``n`` integer sizes (token counts, at least 1) drawn from lognormal(``mu``, ``sigma``)."""
    rng = np.random.default_rng(seed)
    return np.maximum(1.0, np.rint(rng.lognormal(mu, sigma, n)))


def heavy_tailed_sizes(n: int, seed: int, num_giants: int = 16, factor: float = 100.0):
    """Lognormal(5, 1) sizes with ``num_giants`` random samples set to ``factor`` × the median."""
    sizes = lognormal_sizes(n, seed)
    rng = np.random.default_rng(seed + 1)
    giants = rng.choice(n, size=num_giants, replace=False)
    sizes[giants] = np.rint(factor * np.median(sizes))
    return sizes


def read_lengths(path: Path) -> np.ndarray:
    """One number per line (blank lines ignored) as a float64 vector."""
    values = [float(line) for line in path.read_text().split() if line.strip()]
    return np.asarray(values, dtype=np.float64)


def step_metrics(assignment: Assignment, costs: np.ndarray, sizes: np.ndarray) -> dict:
    """Per-step balance of ``assignment`` and the padding it implies.

    Returns ``ratio`` (per step max/mean rank cost), ``bound`` (per step
    max(mean, largest sample)/mean), ``load_ratio_mean``/``load_ratio_worst`` (mean and max
    of ``ratio``), ``bound_mean``/``bound_worst`` and ``padding_fraction`` (share of the
    padded local batches that is padding when every sample is padded to the longest one of
    its local batch, as ``chronica.core.PlanStats`` defines it).
    """
    loads = assignment.loads
    mean = loads.mean(axis=1)
    safe = np.where(mean > 0, mean, 1.0)
    ratio = np.where(mean > 0, loads.max(axis=1) / safe, 1.0)
    per_sample = costs[assignment.indices]
    largest = np.array(
        [per_sample[b[0] : b[-1]].max() if b[-1] > b[0] else 0.0 for b in assignment.bounds]
    )
    bound = np.where(mean > 0, np.maximum(mean, largest) / safe, 1.0)
    padded = used = 0.0
    local_sizes = sizes[assignment.indices]
    for b in assignment.bounds:
        for r in range(b.shape[0] - 1):
            if b[r + 1] > b[r]:
                chunk = local_sizes[b[r] : b[r + 1]]
                padded += float(chunk.max()) * chunk.shape[0]
                used += float(chunk.sum())
    return {
        "ratio": ratio,
        "bound": bound,
        "load_ratio_mean": float(ratio.mean()),
        "load_ratio_worst": float(ratio.max()),
        "bound_mean": float(bound.mean()),
        "bound_worst": float(bound.max()),
        "padding_fraction": 0.0 if padded == 0 else 1.0 - used / padded,
    }


def equal_count_bound(assignment: Assignment, costs: np.ndarray) -> np.ndarray:
    """Per step, a bound that also respects equal counts: the rank holding the largest sample
    holds ``k - 1`` more, at least the ``k - 1`` smallest of the step, so no equal-count split
    beats ``max(mean, largest + (k - 1) smallest) / mean`` (``k`` = samples per rank)."""
    out = np.ones(assignment.num_steps)
    width = assignment.bounds.shape[1] - 1
    for s, b in enumerate(assignment.bounds):
        c = np.sort(costs[assignment.indices[b[0] : b[-1]]])
        mean = c.sum() / width
        if mean > 0:
            k = c.shape[0] // width
            out[s] = max(mean, c[-1] + c[: k - 1].sum()) / mean
    return out


def machine_info() -> dict:
    """Where and when a benchmark ran: OS, CPU, core count, library versions, UTC date."""
    import numba

    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numba": numba.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    return info


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def median_seconds(
    fn: Callable[[int], object], repeats: int, first: int = 1
) -> tuple[float, list[float]]:
    """Median and every timing of ``fn(i)`` for ``i = first .. first + repeats - 1``."""
    times = []
    for i in range(first, first + repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return float(np.median(times)), times


def rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
