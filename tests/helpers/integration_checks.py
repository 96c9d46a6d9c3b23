"""What the integration tests (Lightning, accelerate, the transformers Trainer) check in the
batches a real 2-process job's training step received: chronica's plan for each rank and
epoch, exactly-once coverage, and the per-step balance of what was received."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

from chronica.torch.utils.data import DistributedSampler

__all__ = ["WORLD", "assert_balanced", "assert_once", "load_ratios", "planned", "run_job"]

WORLD = 2


def run_job(worker: str, folder: Path, variables: str, timeout: float = 300) -> list[dict]:
    """Run ``tests/helpers/<worker>`` as ranks 0 and 1 of a job on 127.0.0.1, each writing
    JSON (argv[1]) and using ``folder/checkpoints`` (argv[2]); returns the ranks' results.
    ``variables`` picks the launcher's environment: ``"lightning"`` (``LOCAL_RANK``,
    ``NODE_RANK``: processes Lightning did not start) or ``"torchrun"``."""
    outs = [folder / f"rank{rank}.json" for rank in range(WORLD)]
    command = [sys.executable, str(HELPERS / worker)]
    with torch_rendezvous(WORLD) as meeting:
        env = base_env(
            ROOT,
            WORLD_SIZE=str(WORLD),
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            **meeting,
        )
        env.pop("CUDA_VISIBLE_DEVICES", None)
        ranks = []
        for rank in range(WORLD):
            extra = {"LOCAL_RANK": str(rank)}
            if variables == "lightning":
                extra["NODE_RANK"] = "0"
            else:
                extra.update(RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
            ranks.append({**env, **extra})
        commands = [[*command, str(out), str(folder / "checkpoints")] for out in outs]
        run_workers(commands, ranks, timeout)
    return [json.loads(out.read_text()) for out in outs]


def planned(sizes: Sequence[float], global_batch: int, epochs: int) -> list[list[list[list]]]:
    """``[rank][epoch][step]``: the local batches chronica plans (default arguments, seed 0)
    for every rank, recomputed here from the sizes alone."""
    out = []
    for rank in range(WORLD):
        sampler = DistributedSampler(
            range(len(sizes)), WORLD, rank, batch_size=global_batch, sizes=np.asarray(sizes)
        )
        epochs_of_rank = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            plan = sampler.plan()
            epochs_of_rank.append([plan.local(s, rank).tolist() for s in range(plan.num_steps)])
        out.append(epochs_of_rank)
    return out


def assert_once(batches_by_rank: Sequence[Sequence[Sequence[int]]], n: int) -> None:
    """Over all ranks, the epoch's batches hold every sample index in ``range(n)`` exactly
    once (``n`` a multiple of the world: no padding), and every rank ran as many steps."""
    assert len({len(batches) for batches in batches_by_rank}) == 1, "unequal step counts"
    seen = Counter(i for batches in batches_by_rank for batch in batches for i in batch)
    assert sorted(seen) == list(range(n)), "samples missing or foreign"
    assert set(seen.values()) == {1}, "samples trained more than once"


def load_ratios(batches_by_rank: Sequence[Sequence[Sequence[int]]], sizes) -> np.ndarray:
    """Per step, the largest rank load over the mean (a load: the summed sizes)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    loads = np.array(
        [[sizes[batch].sum() for batch in step] for step in zip(*batches_by_rank, strict=True)]
    )
    return loads.max(axis=1) / loads.mean(axis=1)


def assert_balanced(batches_by_rank: Sequence[Sequence[Sequence[int]]], sizes) -> None:
    """The steps' loads are even (mean max/mean under 1.1), and clearly more even than an
    unbalanced split of the same steps (each step's samples dealt to the ranks in turn)."""
    steps = [[i for batch in step for i in batch] for step in zip(*batches_by_rank, strict=True)]
    dealt = [[step[r::WORLD] for step in steps] for r in range(WORLD)]
    balanced = load_ratios(batches_by_rank, sizes).mean()
    assert balanced < 1.1 < load_ratios(dealt, sizes).mean(), balanced
