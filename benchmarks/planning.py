"""Planning speed: how long chronica takes to plan one epoch, next to ``numpy.argsort``.

N lognormal sizes (10,000,000; 1,000,000 with ``--quick``), W=1024 ranks, global batch
B=65,536. Each timing is the median of several repeats after a warm-up call that loads or
compiles the numba kernels. Rows:

* ``numpy.argsort(sizes)``: the yardstick, measured in the same run;
* ``Scheduler(sizes, config).plan_epoch(e)`` for exact, pool and guided: construction
  (validation, costs, digest of the sizes) plus planning, a fresh scheduler per repeat;
  ``plan only`` is ``plan_epoch(e)`` on an existing scheduler (a new epoch each time, so the
  plan cache never answers);
* torch's ``DistributedSampler``: ``list(sampler)`` for one rank after ``set_epoch(e)``
  (torch draws the whole permutation, then slices out the rank's share).

Run alone: ``PYTHONPATH=. python benchmarks/run_all.py --only planning [--quick]``.
"""

from __future__ import annotations

import numpy as np
from common import LengthOnly, lognormal_sizes, machine_info, median_seconds

from chronica.core import ScheduleConfig, Scheduler

__all__ = ["MODES", "run"]

NUM_REPLICAS = 1024
BATCH_SIZE = 65_536
DATA_SEED = 7
# (key, kind, exact)
MODES = [("exact", "static", True), ("pool", "static", False), ("guided", "guided", True)]


def _config(kind: str, exact: bool) -> ScheduleConfig:
    return ScheduleConfig(
        num_replicas=NUM_REPLICAS, batch_size=BATCH_SIZE, kind=kind, exact=exact, seed=0
    )


def run(quick: bool) -> dict:
    """Time every row (see the module docstring); returns the JSON-ready result."""
    n = 1_000_000 if quick else 10_000_000
    repeats = 3 if quick else 5
    sizes = lognormal_sizes(n, DATA_SEED)
    rows = []

    argsort_s, argsort_all = median_seconds(lambda i: np.argsort(sizes), repeats)
    rows.append(
        {
            "key": "argsort",
            "label": "numpy.argsort(sizes)",
            "seconds": argsort_s,
            "all": argsort_all,
        }
    )

    for key, kind, exact in MODES:
        config = _config(kind, exact)
        Scheduler(sizes, config).plan_epoch(0)  # warm-up: numba cache load or compile
        total, total_all = median_seconds(
            lambda i, c=config: Scheduler(sizes, c).plan_epoch(i), repeats
        )
        scheduler = Scheduler(sizes, config)
        plan_only, plan_all = median_seconds(scheduler.plan_epoch, repeats)
        rows.append(
            {
                "key": key,
                "label": f"chronica {key}: Scheduler(...).plan_epoch(e)",
                "seconds": total,
                "all": total_all,
                "plan_only_seconds": plan_only,
                "plan_only_all": plan_all,
                "num_steps": scheduler.num_steps(),
            }
        )

    try:
        from torch.utils.data import DistributedSampler
    except ImportError:
        DistributedSampler = None
    if DistributedSampler is not None:
        sampler = DistributedSampler(LengthOnly(n), num_replicas=NUM_REPLICAS, rank=0, seed=0)

        def one_rank(epoch: int) -> list:
            sampler.set_epoch(epoch)
            return list(sampler)

        one_rank(0)
        seconds, all_times = median_seconds(one_rank, repeats)
        rows.append(
            {
                "key": "torch",
                "label": "torch DistributedSampler, one rank's indices",
                "seconds": seconds,
                "all": all_times,
            }
        )

    for row in rows:
        row["ratio_to_argsort"] = row["seconds"] / argsort_s
    return {
        "name": "planning",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "num_samples": n,
        "num_replicas": NUM_REPLICAS,
        "batch_size": BATCH_SIZE,
        "repeats": repeats,
        "data_seed": DATA_SEED,
        "rows": rows,
    }


def format_table(result: dict) -> str:
    """A plain-text table of the medians."""
    lines = [
        f"N={result['num_samples']:,}  W={result['num_replicas']}  B={result['batch_size']:,}  "
        f"(median of {result['repeats']})"
    ]
    for row in result["rows"]:
        extra = ""
        if "plan_only_seconds" in row:
            extra = f"  plan only {row['plan_only_seconds']:.3f} s"
        lines.append(
            f"  {row['label']:48s} {row['seconds']:8.3f} s  "
            f"{row['ratio_to_argsort']:6.2f}x argsort{extra}"
        )
    return "\n".join(lines)
