"""One rank of the demo: join the gloo group, train once per sampler, gather the numbers.

``python -m chronica.demo.worker CONFIG RESULT`` runs one rank (started by
``chronica.demo.launch``; not meant to be called by hand). Imports torch.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchDistributedSampler
from tqdm import tqdm

from chronica.adapters.torch.data import DistributedBatchSampler as ChronicaBatchSampler
from chronica.adapters.torch.data import DistributedSampler as ChronicaDistributedSampler
from chronica.adapters.torch.feedback import ComputeTimer
from chronica.core.cost import CostModel
from chronica.demo.config import DemoConfig, cost_model_for
from chronica.demo.model import PackedClassifier, PackedTokens, collate_packed
from chronica.runtime.options import DynamicOptions

__all__: list[str] = []

# Steps per dynamic plan window in the demo (short epochs need frequent re-evaluation).
_DYNAMIC_WINDOW = 4


def _make_sampler(
    name: str, dataset: PackedTokens, config: DemoConfig, rank: int, cost: CostModel
) -> Any:
    if name == "torch":
        return TorchDistributedSampler(
            dataset, num_replicas=config.world_size, rank=rank, shuffle=True, seed=config.seed
        )
    if name == "dynamic":
        return ChronicaBatchSampler(
            dataset,
            config.batch_size,
            num_replicas=config.world_size,
            rank=rank,
            seed=config.seed,
            kind="dynamic",
            variable_batch=True,
            sizes=dataset.sizes,
            cost=cost,
            dynamic=DynamicOptions(window=_DYNAMIC_WINDOW, port=config.coordinator_port),
        )
    sampler = ChronicaDistributedSampler(
        dataset,
        num_replicas=config.world_size,
        rank=rank,
        shuffle=True,
        seed=config.seed,
        batch_size=config.batch_size,
        kind=config.kind,
        sizes=dataset.sizes,
        cost=cost,
    )
    # Plans the first epoch now, so one-time numba compilation is not billed to epoch 0;
    # planning later epochs happens inside the timed loop, as it would in training.
    sampler.stats(0)
    return sampler


def _heaviest_local_batch(runs: list[_Training]) -> list[int]:
    """This rank's local batch with the most tokens over every run and epoch."""
    best: list[int] = []
    best_tokens = -1
    for run in runs:
        if run.name == "dynamic":
            continue  # its plans come from feedback; the static runs cover the same batches
        local = run.config.batch_size // run.config.world_size
        for epoch in range(run.config.epochs):
            run.sampler.set_epoch(epoch)
            order = list(iter(run.sampler))
            for start in range(0, len(order), local):
                batch = order[start : start + local]
                tokens = int(run.sizes[batch].sum())
                if tokens > best_tokens:
                    best, best_tokens = batch, tokens
        run.sampler.set_epoch(0)
    return best


def _warm_up(dataset: PackedTokens, config: DemoConfig, indices: list[int]) -> None:
    """Untimed steps on this rank's heaviest local batch of the whole demo.

    Besides kernel start-up, this grows the process heap towards its high-water mark once: on
    some virtual machines the first touch of fresh memory costs ~10 µs a page, which would
    otherwise land on whichever sampler first produces an unusually large local batch.
    """
    model = PackedClassifier(
        dataset.vocab, dataset.classes, config.dim, config.hidden, config.cost == "quadratic"
    )
    batch = collate_packed([dataset[i] for i in indices])
    for _ in range(config.warmup_steps):
        logits = model(batch.tokens, batch.segments, batch.lengths)
        F.cross_entropy(logits, batch.labels).backward()


class _Training:
    """One training run (model, optimiser, sampler, loader) that advances an epoch at a time,
    so the two runs can alternate epochs and share the machine's slow and fast moments."""

    def __init__(self, name: str, dataset: PackedTokens, config: DemoConfig, rank: int) -> None:
        self.name = name
        self.config = config
        self.cost = cost_model_for(config.cost, config.dim, config.hidden)
        torch.manual_seed(config.seed)  # the same initialisation for both runs
        model = PackedClassifier(
            dataset.vocab, dataset.classes, config.dim, config.hidden, config.cost == "quadratic"
        )
        self.ddp = DistributedDataParallel(model)
        self.optimizer = torch.optim.Adam(self.ddp.parameters(), lr=config.lr)
        self.sampler = _make_sampler(name, dataset, config, rank, self.cost)
        self.sizes = dataset.sizes
        self.profile = config.profile()
        self.global_step = 0
        self.timer = ComputeTimer(
            self.ddp,
            self.sampler if name == "dynamic" else None,
            slowdown=lambda: float(self.profile.slowdown(self.global_step)[rank]),
        )
        if name == "dynamic":
            self.loader = DataLoader(dataset, batch_sampler=self.sampler, collate_fn=collate_packed)
        else:
            self.loader = DataLoader(
                dataset,
                batch_size=config.batch_size // config.world_size,
                sampler=self.sampler,
                collate_fn=collate_packed,
            )
        self.steps = len(self.loader)
        self.compute = np.zeros((config.epochs, self.steps))
        self.predicted = np.zeros((config.epochs, self.steps))
        self.compute_cpu = np.zeros((config.epochs, self.steps))
        self.native = np.zeros((config.epochs, self.steps))
        self.epoch_times: list[float] = []
        self.totals = torch.zeros(3, dtype=torch.float64)  # last epoch: loss sum, correct, count

    def run_epoch(self, epoch: int, bar: Any) -> None:
        """Train one epoch; record per-step compute time, predicted load and epoch time."""
        ddp, timer = self.ddp, self.timer
        self.sampler.set_epoch(epoch)
        bar.set_description_str(f"{self.name:>8} epoch {epoch + 1}/{self.config.epochs}")
        dist.barrier()
        start_epoch = time.perf_counter()
        for step, (tokens, segments, lengths, labels) in enumerate(self.loader):
            timer.seconds = math.nan
            logits = ddp(tokens, segments, lengths)
            loss = F.cross_entropy(logits, labels)
            if self.name == "dynamic":  # unequal local batches: weight to the global mean
                loss = loss * self.sampler.loss_weight(step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            if math.isnan(timer.seconds):
                raise RuntimeError("the DDP communication hook did not run in this step")
            self.global_step += 1
            self.compute[epoch, step] = timer.seconds
            self.native[epoch, step] = timer.native_seconds
            self.compute_cpu[epoch, step] = timer.cpu_seconds
            self.predicted[epoch, step] = float(self.cost(lengths.numpy()).sum())
            if epoch == self.config.epochs - 1:
                correct = float((logits.argmax(1) == labels).sum())
                self.totals += torch.tensor(
                    [loss.item() * len(labels), correct, len(labels)], dtype=torch.float64
                )
            bar.update(1)
            if step % 8 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        self.epoch_times.append(time.perf_counter() - start_epoch)

    def record(self) -> dict[str, Any]:
        """Gather every rank's per-step numbers (a collective: call it on every rank)."""
        world = self.config.world_size
        dist.all_reduce(self.totals)
        local = torch.from_numpy(
            np.stack(
                [
                    self.compute.ravel(),
                    self.predicted.ravel(),
                    self.compute_cpu.ravel(),
                    self.native.ravel(),
                ]
            )
        )
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        both = torch.stack(gathered).numpy()  # (rank, {compute, predicted, cpu, native}, step)
        record: dict[str, Any] = {
            "steps_per_epoch": self.steps,
            "compute": both[:, 0].T.tolist(),  # (epoch*step, rank)
            "predicted": both[:, 1].T.tolist(),
            "compute_cpu": both[:, 2].T.tolist(),
            "compute_native": both[:, 3].T.tolist(),
            "epoch_times": self.epoch_times,
            "loss": float(self.totals[0] / self.totals[2]),
            "accuracy": float(self.totals[1] / self.totals[2]),
        }
        session = getattr(getattr(self.sampler, "stream", None), "session", None)
        coordinator = getattr(session, "coordinator", None)
        if coordinator is not None:  # rank 0 of a dynamic run
            record["coordinator_cpu_s"] = coordinator.stats.cpu_seconds
        if self.name == "chronica":
            stats = self.sampler.stats(self.config.epochs - 1)
            record["bound_mean"] = stats.bound_mean
            record["bound_worst"] = stats.bound_worst
        return record


def _train_all(dataset: PackedTokens, config: DemoConfig, rank: int) -> dict[str, Any]:
    """Train once per sampler, alternating epochs in ABBA order so that drifts in machine
    speed (shared, noisy CPUs) fall on both runs alike."""
    runs = [_Training(name, dataset, config, rank) for name in config.samplers]
    _warm_up(dataset, config, _heaviest_local_batch(runs))
    bar = tqdm(
        total=config.epochs * sum(run.steps for run in runs),
        unit="step",
        disable=rank != 0 or not config.progress,
        mininterval=0.25,
        dynamic_ncols=True,
    )
    with bar:
        for epoch in range(config.epochs):
            for run in runs if epoch % 2 == 0 else runs[::-1]:
                run.run_epoch(epoch, bar)
    records = {run.name: run.record() for run in runs}
    for run in runs:
        if run.name == "dynamic":
            run.sampler.close()
    return records


def _watch_parent() -> None:
    """Exit when the launching process dies, so a killed demo leaves no orphan ranks."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="chronica-demo-parent-watch", daemon=True).start()


def _worker(config_path: str, result_path: str) -> int:
    """One rank: join the group, train with both samplers, rank 0 writes the results."""
    _watch_parent()
    torch.set_num_threads(1)
    # Subnormal floats (softmax tails once the model has learnt) take a slow path on x86 CPUs
    # and would make later epochs cost more than earlier ones for reasons unrelated to sampling.
    torch.set_flush_denormal(True)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process; harmless
        pass
    config = DemoConfig(**json.loads(Path(config_path).read_text()))
    dist.init_process_group(
        "gloo", init_method="env://", timeout=timedelta(seconds=config.collective_timeout_s)
    )
    try:
        rank = dist.get_rank()
        dataset = PackedTokens(np.asarray(config.lengths), seed=config.seed)
        results = _train_all(dataset, config, rank)
        if rank == 0:
            tmp = Path(result_path).with_suffix(".tmp")
            tmp.write_text(json.dumps(results))
            tmp.replace(result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m chronica.demo.worker CONFIG RESULT (started by chronica demo)")
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
