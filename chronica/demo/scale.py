"""What the demo's calibrated job means on larger clusters: ``chronica.sim.simulate`` (no torch).

The real run has 2 ranks, where a random split of a step cannot be very unbalanced; the
slowest of W ranks grows with W. ``project`` simulates the same job (the cost model fitted to
the real run's measured CPU time, the same length distribution, the same samples per rank)
at larger world sizes: torch's ``DistributedSampler`` arithmetic, chronica's equal-count
split (the one the demo ran), and chronica's packing (``Packing(max_tokens)``: token-capped
micro-batches, counts free to differ), compute only (no all-reduce, no overhead). These are
simulations, not measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chronica import CostModel
from chronica.sim import AllReduceModel, ComputeModel, SimOptions, resample, simulate

__all__ = ["packed_max_tokens", "project"]

_COMPUTE_ONLY = AllReduceModel(latency_s=0.0, grad_bytes=0.0)
_MIN_STEPS = 8  # simulated steps per world size (more when the data set is larger)


def packed_max_tokens(lengths: Any, local_batch: int) -> int:
    """The token cap of the simulated packing: the power of two that holds a rank's mean
    share of a step (``local_batch`` mean lengths), and never below the longest sample."""
    lengths = np.asarray(lengths, dtype=np.float64)
    share = float(lengths.mean()) * local_batch
    return int(max(float(lengths.max()), 2.0 ** np.ceil(np.log2(max(share, 1.0)))))


def project(
    lengths: Any,
    cost: CostModel,
    local_batch: int,
    worlds: Sequence[int],
    *,
    kind: str = "static",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per world size: simulated per-step slowest/mean rank compute of torch's
    sampler, of chronica's ``kind`` and of chronica's packing, and their speed-ups over
    torch's (``max_tokens`` of the packing: ``packed_max_tokens``). ``lengths`` are resampled
    (with replacement) to at least 8 steps of ``local_batch`` samples per rank."""
    lengths = np.asarray(lengths, dtype=np.float64)
    max_tokens = packed_max_tokens(lengths, local_batch)
    packed = f"packed,max_tokens={max_tokens}"
    rows = []
    for world in worlds:
        n = max(lengths.shape[0], _MIN_STEPS * local_batch * world)
        options = SimOptions(
            world=world,
            batch_size=local_batch * world,
            seed=seed,
            cost=cost,
            compute=ComputeModel(seconds_per_cost=1.0),  # the fitted cost is in seconds
            allreduce=_COMPUTE_ONLY,
            strategies=("torch", kind, packed),
        )
        result = simulate(resample(lengths, n, seed), options, progress=False)
        torch_r, chronica_r, packed_r = (result.result(s) for s in ("torch", kind, packed))
        rows.append(
            {
                "world": world,
                "samples": n,
                "max_tokens": max_tokens,
                "torch_ratio": torch_r.load_ratio,
                "chronica_ratio": chronica_r.load_ratio,
                "chronica_speedup": chronica_r.speedup,
                "packed_ratio": packed_r.load_ratio,
                "packed_speedup": packed_r.speedup,
            }
        )
    return rows
