"""One rank of a real gloo job with kind="dynamic" (the job of dynamic_job.py), started by
tests/adapters/torch/test_torch_dynamic.py.

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and CHRONICA_COORDINATOR when the
coordinator runs on its own); argv: output JSON path, scenario, coordinator port, sync dir.
Scenarios: "train" (two epochs, variable batches, loss-weighted gradients checked against
the whole step's gradient), "kill" (the test kills the coordinator after step 3 of epoch 0).
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from dynamic_job import KILL_AT, PER_RANK, WINDOW, N, features, kill_point, sizes
from workers import scaled

from chronica.runtime import DynamicOptions
from chronica.torch.utils.data import DistributedBatchSampler


def step_loss(model, indices):
    x, y = map(torch.from_numpy, features(indices))
    return ((model(x).squeeze(1) - y) ** 2).mean()


def main(out_path: str, scenario: str, port: str, sync: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    world, rank = dist.get_world_size(), dist.get_rank()
    lengths = sizes()
    sampler = DistributedBatchSampler(
        list(range(N)),
        batch_size=PER_RANK * world,
        kind="dynamic",
        variable_batch=True,
        sizes=lengths,
        window=WINDOW,
        dynamic=DynamicOptions(port=int(port), timeout=scaled(3.0)),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    slow = 4.0 if rank == world - 1 else 1.0  # the last rank is emulated 4x slower
    epochs, weights, grad_errors = [], [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        steps, step_weights = [], []
        for step, batch in enumerate(sampler):
            if scenario == "kill" and (epoch, step) == KILL_AT:
                kill_point(Path(sync), rank)
            weight = sampler.loss_weight(step)
            steps.append(batch)
            step_weights.append(weight)
            model.zero_grad()
            (step_loss(model, batch) * weight).backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(grads)
            grads /= world
            everyone = [None] * world
            dist.all_gather_object(everyone, batch)
            model.zero_grad()
            step_loss(model, [i for part in everyone for i in part]).backward()
            whole = torch.cat([p.grad.flatten() for p in model.parameters()])
            grad_errors.append(float((grads - whole).abs().max()))
            sampler.report(lengths[batch].sum() * 1e-6 * slow)
        epochs.append(steps)
        weights.append(step_weights)
    session = sampler.stream.session
    result = {
        "rank": rank,
        "epochs": epochs,
        "weights": weights,
        "grad_error": max(grad_errors),
        "dynamic_windows": session.windows_dynamic,
        "static_windows": session.windows_static,
    }
    dist.barrier()
    sampler.close()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
