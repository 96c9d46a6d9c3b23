"""The world a torch sampler plans for, from ``torch.distributed``, and the ranks'
agreement over a gloo group of their own (``kind="dynamic"``)."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

from chronica.core import Scheduler
from chronica.runtime import Agreement

__all__ = ["gloo_agreement", "torch_world"]


def torch_world() -> tuple[int, int]:
    """``(world size, rank)`` of ``torch.distributed``'s default group; without one, a world
    of one process (rank 0), as torch's own samplers train a single process, unless a
    launcher's ``WORLD_SIZE`` says this process is one of several, which raises
    ``RuntimeError`` naming the missing ``init_process_group``.

    Example::

        world, rank = torch_world()   # (1, 0) in a plain `python train.py`
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    launched = os.environ.get("WORLD_SIZE", "1")
    if launched.strip() not in ("", "1"):
        raise RuntimeError(
            f"WORLD_SIZE={launched} says this process is one of {launched}, but "
            "torch.distributed is not initialized yet, so chronica cannot know its rank: "
            "call dist.init_process_group(...) before building the sampler, or pass "
            "num_replicas and rank (under Lightning, build the sampler in "
            "train_dataloader(), where the group exists; under accelerate or the "
            "transformers Trainer, after Accelerator() or TrainingArguments(...))"
        )
    return 1, 0


def gloo_agreement(scheduler: Scheduler) -> Agreement | None:
    """The ranks' ``Agreement``, its sums all-reduced over a gloo group of their own (the
    key it draws never leaves torch.distributed); ``None`` without a process group (every
    window is then the static plan)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    config = scheduler.config
    if dist.get_world_size() != config.num_replicas:
        raise ValueError(
            f"num_replicas={config.num_replicas} differs from the process group's world size "
            f"{dist.get_world_size()}; kind='dynamic' needs one rank per replica"
        )
    group = dist.new_group(backend="gloo")

    def total(vector: np.ndarray) -> np.ndarray:
        summed = torch.from_numpy(np.array(vector, np.int64))
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        return summed.numpy()

    return Agreement(total, dist.get_rank(), config.num_replicas)
