"""Measured gloo all-gathers on this machine, for the context-parallel exchange model.

``measure(sizes, nbytes, repeats)`` starts ``g`` processes per group size (gloo over
127.0.0.1, rendezvous through a file store), all-gathers float32 buffers of every total size
(each rank's share ``bytes / g``) in ``repeats`` rounds over the sizes after two warm-up
rounds, and returns the median
seconds per (size, bytes) and the fastest call, each call timed as its slowest rank's (a
barrier before it).
``chronica.sim.context.CommModel.fit`` then fits the alpha-beta model to them.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["measure"]


def _worker(rank: int, size: int, store: str, nbytes: list[int], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, size), rank=rank, world_size=size)
    shares = [torch.ones(max(1, total // (4 * size)), dtype=torch.float32) for total in nbytes]
    times: list[list[float]] = [[] for _ in nbytes]
    # Rounds over every size, so that a burst of load elsewhere touches them all alike.
    for attempt in range(repeats + 2):
        for j, share in enumerate(shares):
            parts = [torch.empty_like(share) for _ in range(size)]
            dist.barrier()
            start = time.perf_counter()
            dist.all_gather(parts, share)
            spent = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(spent, op=dist.ReduceOp.MAX)
            if attempt >= 2:  # the first two rounds warm the connections up
                times[j].append(float(spent))
    medians = [(float(np.median(t)), float(np.min(t))) for t in times]
    if rank == 0:
        Path(out).write_text(" ".join(f"{m!r},{low!r}" for m, low in medians))
    dist.destroy_process_group()


def measure(sizes: list[int], nbytes: list[int], repeats: int, sessions: int = 1) -> list[dict]:
    """Median (``seconds``) and least (``fastest``) seconds of one gloo all-gather for every
    group size and total byte count.

    Args:
        sizes: group sizes ``g`` (processes started per size).
        nbytes: total bytes gathered (every rank's share ``bytes / g``).
        repeats: calls timed per point (after two warm-up rounds).
        sessions: process groups started one after another per size (a burst of load
            elsewhere rarely spans them all); the median of their medians and the least of
            their fastest calls are kept.
    """
    import torch.multiprocessing as mp

    out = []
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for size in sizes:
        runs = []
        for _ in range(sessions):
            with tempfile.TemporaryDirectory() as folder:
                store, result = f"{folder}/store", f"{folder}/result"
                mp.spawn(_worker, args=(size, store, nbytes, repeats, result), nprocs=size)
                runs.append([x.split(",") for x in Path(result).read_text().split()])
        for j, b in enumerate(nbytes):
            out.append({
                "size": size,
                "bytes": b,
                "seconds": float(np.median([float(run[j][0]) for run in runs])),
                "fastest": min(float(run[j][1]) for run in runs),
            })  # fmt: skip
    return out
