"""One rank of a 2-process DDP job (torchrun's variables, gloo, CPU) whose ``DataLoader``
has 2 workers, started by test_torch_resume_workers.

argv: MODE (``first`` or ``resumed``), the JSON file for this rank's results, the JSON file
of its checkpointed sampler state. ``first`` trains epoch ``EPOCH`` and, after every step,
checkpoints ``sampler.state_dict()`` (while the workers have fetched batches ahead); at batch
``KILL_AT`` every rank kills itself with SIGKILL, mid-epoch. ``resumed`` is a new process:
a new loader and sampler that load the checkpoint and train the rest of the epoch. The
results file holds the batches the training loop received, written after every batch.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from chronica.torch.utils.data import DistributedSampler

N, GLOBAL_BATCH, LOADER_BATCH, EPOCH, KILL_AT = 120, 12, 3, 1, 7
SIZES = np.random.default_rng(2).lognormal(3, 1, N)


def main(mode: str, out_path: str, state_path: str) -> None:
    dist.init_process_group("gloo")
    data = TensorDataset(torch.arange(N))
    sampler = DistributedSampler(data, batch_size=GLOBAL_BATCH, sizes=SIZES)
    loader = DataLoader(data, batch_size=LOADER_BATCH, sampler=sampler, num_workers=2)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "resumed":
        with open(state_path) as f:
            sampler.load_state_dict(json.load(f))
    else:
        sampler.set_epoch(EPOCH)
    received: list[list[int]] = []
    for (batch,) in loader:
        received.append(batch.tolist())
        model(batch.float()[:, None]).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        with open(state_path, "w") as f:  # a checkpoint after every step
            json.dump(sampler.state_dict(), f)
        with open(out_path, "w") as f:
            json.dump({"sizes": SIZES.tolist(), "received": received}, f)
        if mode == "first" and len(received) == KILL_AT:
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)  # preempted, workers mid-prefetch
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
