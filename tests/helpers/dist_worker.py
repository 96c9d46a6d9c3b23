"""One rank of a real torch.distributed (gloo, loopback) job, started by test_torch_sampler.

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; writes what it consumed as JSON to argv[1].
"""

import json
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from sized_dataset import Sized
from torch.utils.data import DataLoader

from chronica.torch.utils.data import DistributedSampler


def main(out_path: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    world, rank = dist.get_world_size(), dist.get_rank()
    dataset = Sized(np.random.default_rng(0).lognormal(4, 1, 203).astype(int) + 1)
    sampler = DistributedSampler(dataset, batch_size=8 * world, kind="static")
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        steps = []
        for batch in loader:
            steps.append(batch.tolist())
            # A real collective per step: it would hang if ranks had unequal step counts.
            dist.all_reduce(torch.ones(1))
        epochs.append(steps)
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "epochs": epochs, "len": len(sampler)}, f)


if __name__ == "__main__":
    main(sys.argv[1])
