"""One rank of the demo: join the gloo group, calibrate, train every run, gather the numbers.

``python -m chronica.demo.worker CONFIG RESULT`` runs one rank (started by
``chronica.demo.launch``; not meant to be called by hand). Imports torch.

A rank's life:

1. **Warm-up**: untimed training steps on its heaviest local batch of the whole demo.
2. **Calibration** (``calibration_steps``): training steps of a throw-away model on chosen
   local batches (``calibration_batches``). Every rank measures the CPU time of its own
   forward and backward passes (``ComputeTimer.cpu_seconds``: thread CPU time, which other
   processes on a shared machine do not stretch); rank 0 fits the cost model to every
   rank's measurements (``fit_cost``, ``CostModel.fit``) and broadcasts it, so every rank
   plans with the same bytes.
3. **Training**: ``seeds`` x samplers runs, each with its own model (the same initialisation
   for every sampler of a seed), optimiser and loader, their steps interleaved (step 1 of
   every run, then step 2, ...), so that the machine's noise falls on all runs alike. After
   every epoch the cost model is refitted to every step measured so far, and chronica's
   samplers plan the next epoch with it.
4. **Evaluation** of every run's model on the same held-out samples.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
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

from chronica import CostModel, DynamicOptions
from chronica.demo.calibrate import calibration_batches, fit_cost, predict
from chronica.demo.config import DemoConfig, cost_model_for, plural
from chronica.demo.model import PackedClassifier, PackedTokens, collate_packed
from chronica.demo.placement import pin_rank
from chronica.torch.utils.data import ComputeTimer
from chronica.torch.utils.data import DistributedBatchSampler as ChronicaBatchSampler
from chronica.torch.utils.data import DistributedSampler as ChronicaDistributedSampler

__all__: list[str] = []

# Steps per dynamic plan window in the demo (short epochs need frequent re-evaluation).
_DYNAMIC_WINDOW = 4
# What a rank records per step: samples, tokens, squared tokens, CPU seconds of its compute
# (unslowed), emulated slowdown, compute seconds (wall, slowed), unslowed compute seconds.
_FIELDS = ("samples", "tokens", "squares", "cpu", "slowdown", "compute", "native")


def _model(dataset: PackedTokens, config: DemoConfig) -> PackedClassifier:
    return PackedClassifier(
        dataset.vocab, dataset.classes, config.dim, config.hidden, config.cost == "quadratic"
    )


def _torch_sampler(
    dataset: PackedTokens, config: DemoConfig, rank: int, seed: int
) -> TorchDistributedSampler:
    return TorchDistributedSampler(
        dataset, num_replicas=config.world_size, rank=rank, shuffle=True, seed=seed
    )


def _dynamic_sampler(
    dataset: PackedTokens, config: DemoConfig, rank: int, cost: CostModel, seed: int, port: int
) -> ChronicaBatchSampler:
    return ChronicaBatchSampler(
        dataset,
        config.batch_size,
        num_replicas=config.world_size,
        rank=rank,
        seed=seed,
        kind="dynamic",
        variable_batch=True,
        sizes=dataset.sizes,
        cost=cost,
        window=_DYNAMIC_WINDOW,
        dynamic=DynamicOptions(port=port),
    )


def _static_sampler(
    dataset: PackedTokens, config: DemoConfig, rank: int, cost: CostModel, seed: int, port: int
) -> ChronicaDistributedSampler:
    return ChronicaDistributedSampler(
        dataset,
        num_replicas=config.world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        batch_size=config.batch_size,
        kind=config.kind,
        sizes=dataset.sizes,
        cost=cost,
    )


# Every arm of the comparison by its name in the report: (dataset, config, rank, cost, seed,
# port) -> its sampler.
_ARMS: dict[str, Callable[..., Any]] = {
    "torch": lambda dataset, config, rank, cost, seed, port: _torch_sampler(
        dataset, config, rank, seed
    ),
    "chronica": _static_sampler,
    "dynamic": _dynamic_sampler,
}


def _opens_session(sampler: Any) -> bool:
    """Whether ``sampler`` is chronica's and its mode re-plans from reported times."""
    stream = getattr(sampler, "stream", None)
    return stream is not None and stream.config.mode.opens_session


def _local_batches(sampler: Any, local: int) -> list[list[int]]:
    """A fixed-size sampler's local batches of the current epoch (as its loader cuts them)."""
    order = list(iter(sampler))
    return [order[start : start + local] for start in range(0, len(order), local)]


def _heaviest_local_batch(dataset: PackedTokens, config: DemoConfig, rank: int) -> list[int]:
    """This rank's local batch with the most squared tokens over torch's runs (every seed
    and epoch): the heaviest a random split gives, above what a balanced split gives."""
    best: list[int] = []
    best_cost = -1.0
    weight = dataset.sizes.astype(np.float64) ** 2 + dataset.sizes
    for k in range(config.seeds):
        sampler = _torch_sampler(dataset, config, rank, config.seed + k)
        for epoch in range(config.epochs):
            sampler.set_epoch(epoch)
            for batch in _local_batches(sampler, config.local_batch):
                cost = float(weight[batch].sum())
                if cost > best_cost:
                    best, best_cost = batch, cost
    return best


def _gather(rows: np.ndarray, world: int) -> np.ndarray:
    """Every rank's ``rows`` stacked rank by rank (a collective)."""
    local = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).numpy()


def _fit_on_rank0(measurements: np.ndarray, rank: int) -> tuple[CostModel, dict[str, float]]:
    """``fit_cost`` of ``(..., 4)`` measurements on rank 0, broadcast: the same bytes on
    every rank, so the same plans."""
    values = torch.zeros(7, dtype=torch.float64)
    if rank == 0:
        cost, quality = fit_cost(measurements.reshape(-1, 4))
        values = torch.tensor(
            [*cost.to_tuple(), *(quality[k] for k in ("rms_error", "r2", "kept", "measurements"))],
            dtype=torch.float64,
        )
    dist.broadcast(values, src=0)
    v = values.tolist()
    quality = {"rms_error": v[3], "r2": v[4], "kept": int(v[5]), "measurements": int(v[6])}
    return CostModel(v[0], v[1], v[2]), quality


def _calibrate(
    dataset: PackedTokens, config: DemoConfig, rank: int, heaviest: list[int], bar: Any
) -> tuple[CostModel, dict[str, Any], np.ndarray]:
    """Warm up, then fit the cost model to measured CPU time (module docstring, steps 1-2).

    Returns the model, what the report says of it, and every rank's measurements
    ``(rank, step, 4)``: samples, tokens, squared tokens, CPU seconds. The warm-up trains
    on this rank's heaviest local batch of the whole demo: besides kernel start-up and
    DDP's first step, this grows the process heap towards its high-water mark once (on some
    virtual machines the first touch of fresh memory costs ~10 µs a page, which would
    otherwise land on whichever step first meets an unusually large batch).
    """
    torch.manual_seed(config.seed + 1_000_003)
    ddp = DistributedDataParallel(_model(dataset, config))
    timer = ComputeTimer(ddp)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=config.lr)

    def train(indices: Any) -> tuple[float, float]:
        start = time.perf_counter()  # loading and waiting for the other ranks included
        batch = collate_packed([dataset[int(j)] for j in indices])
        dist.barrier()  # every step starts together, as a training step does
        loss = F.cross_entropy(ddp(batch.tokens, batch.segments, batch.lengths), batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.update(1)
        return timer.cpu_seconds, time.perf_counter() - start

    bar.set_description_str("warming up")
    for _ in range(config.warmup_steps):
        train(heaviest)
    steps = config.calibration_steps
    rows = np.zeros((steps, 5))
    bar.set_description_str("calibrating")
    batches = calibration_batches(dataset.sizes, config.local_batch, steps, config.seed, rank)
    for i, indices in enumerate(batches):
        lengths = dataset.sizes[indices].astype(np.float64)
        rows[i] = (len(indices), lengths.sum(), (lengths**2).sum(), *train(indices))
    every = _gather(rows, config.world_size)
    if steps == 0:
        cost = cost_model_for(config.cost, config.dim, config.hidden)
        return cost, {"steps": 0, "coefficients": list(cost.to_tuple())}, every[..., :4]
    cost, quality = _fit_on_rank0(every[..., :4], rank)
    slowest = every[:, :, 3].max(axis=0)  # per step: the slowest rank's CPU seconds
    info = {
        "steps": steps,
        "coefficients": list(cost.to_tuple()),
        **quality,
        # rank 0's wall seconds per step (loading, waiting, optimiser included) over the
        # slowest rank's CPU seconds: how much the machine stretches a step; for the estimate.
        "stretch": float(every[0, :, 4].sum() / max(float(slowest.sum()), 1e-12)),
    }
    return cost, info, every[..., :4]


class _Run:
    """One training run (sampler, seed): model, optimiser, sampler and loader; ``step`` trains
    one step and records this rank's numbers for it (``_FIELDS``)."""

    def __init__(
        self,
        name: str,
        seed_index: int,
        dataset: PackedTokens,
        config: DemoConfig,
        rank: int,
        cost: CostModel,
    ) -> None:
        self.name = name
        self.seed_index = seed_index
        self.seed = config.seed + seed_index
        self.dataset = dataset
        self.config = config
        self.rank = rank
        torch.manual_seed(self.seed)  # the same initialisation for every sampler of a seed
        self.ddp = DistributedDataParallel(_model(dataset, config))
        self.optimizer = torch.optim.Adam(self.ddp.parameters(), lr=config.lr)
        self.port = config.coordinator_port + 2 * seed_index if config.coordinator_port else 0
        self.profile = config.profile()
        self.global_step = 0
        self.cost = cost
        self.sampler: Any
        self.loader: Any
        self._build(cost)
        self.timer = ComputeTimer(
            self.ddp,
            self.sampler if self.reports else None,
            slowdown=self._slowdown,
        )
        self.steps = len(self.loader)
        total = config.epochs * self.steps
        # cosine decay to 0 over the run: the final models settle, so the held-out loss
        # varies less from seed to seed
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda k: 0.5 * (1.0 + math.cos(math.pi * min(k, total) / total))
        )
        self.rows = np.zeros((config.epochs, self.steps, len(_FIELDS)))
        self.wall = np.zeros((config.epochs, self.steps))
        self.batches: Any = iter(())

    def _build(self, cost: CostModel) -> None:
        """(Re)build the sampler and loader planning with ``cost``."""
        self.cost = cost
        self.sampler = _ARMS[self.name](
            self.dataset, self.config, self.rank, cost, self.seed, self.port
        )
        self.reports = _opens_session(self.sampler)
        if self.reports:
            self.loader = DataLoader(
                self.dataset, batch_sampler=self.sampler, collate_fn=collate_packed
            )
        else:
            self.loader = DataLoader(
                self.dataset,
                batch_size=self.config.local_batch,
                sampler=self.sampler,
                collate_fn=collate_packed,
            )

    def recalibrate(self, cost: CostModel) -> None:
        """Plan from now on with ``cost`` (chronica's static sampler; the others keep
        theirs: torch's needs none, the dynamic one learns its own from feedback)."""
        if self.name == "chronica":
            self._build(cost)

    def _slowdown(self) -> float:
        return float(self.profile.slowdown(self.global_step)[self.rank])

    def start_epoch(self, epoch: int) -> None:
        """``set_epoch`` and a fresh iterator over this epoch's local batches; plans the
        epoch before its first step is timed (numba compiles once, on the first plan)."""
        self.sampler.set_epoch(epoch)
        if self.name == "chronica":
            self.sampler.stats(epoch)
        self.batches = iter(self.loader)

    def step(self, epoch: int, step: int) -> float:
        """Train the epoch's next step; return its loss."""
        tokens, segments, lengths, labels = next(self.batches)
        timer = self.timer
        timer.seconds = math.nan
        start = time.perf_counter()
        logits = self.ddp(tokens, segments, lengths)
        loss = F.cross_entropy(logits, labels)
        if self.reports:  # unequal local batches: weight to the global mean
            loss = loss * self.sampler.loss_weight(step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.schedule.step()
        self.wall[epoch, step] = time.perf_counter() - start
        if math.isnan(timer.seconds):
            raise RuntimeError("the DDP communication hook did not run in this step")
        factor = self._slowdown()
        self.global_step += 1
        sizes = lengths.numpy().astype(np.float64)
        self.rows[epoch, step] = (
            sizes.shape[0],
            sizes.sum(),
            (sizes**2).sum(),
            timer.cpu_seconds,
            factor,
            timer.seconds,
            timer.native_seconds,
        )
        return loss.item()

    def measurements(self, epoch: int) -> np.ndarray:
        """This rank's ``(step, 4)`` cost measurements of ``epoch`` (unslowed CPU time)."""
        return self.rows[epoch, :, :4]

    def evaluate(self, held_out: PackedTokens) -> tuple[float, float]:
        """Held-out loss and accuracy of this run's model (every rank evaluates its share)."""
        world, local = self.config.world_size, self.config.local_batch
        mine = list(range(self.rank, len(held_out), world))
        totals = torch.zeros(3, dtype=torch.float64)
        model = self.ddp.module
        with torch.no_grad():
            for start in range(0, len(mine), local):
                batch = collate_packed([held_out[i] for i in mine[start : start + local]])
                logits = model(batch.tokens, batch.segments, batch.lengths)
                loss = F.cross_entropy(logits, batch.labels, reduction="sum")
                correct = (logits.argmax(1) == batch.labels).sum()
                totals += torch.tensor(
                    [float(loss), float(correct), len(batch.labels)], dtype=torch.float64
                )
        dist.all_reduce(totals)
        return float(totals[0] / totals[2]), float(totals[1] / totals[2])

    def record(self, held_out: PackedTokens, final: CostModel) -> dict[str, Any]:
        """Every rank's per-step numbers, gathered (a collective: call it on every rank).
        ``predicted`` is every (step, rank)'s load under the ``final`` cost model."""
        loss, accuracy = self.evaluate(held_out)
        flat = self.rows.reshape(-1, len(_FIELDS))
        every = _gather(flat, self.config.world_size)  # (rank, epoch*step, field)
        column = {name: every[:, :, i].T for i, name in enumerate(_FIELDS)}  # (step, rank)
        predicted = predict(final, every.reshape(-1, len(_FIELDS))).reshape(every.shape[:2]).T
        record: dict[str, Any] = {
            "seed": self.seed,
            "steps_per_epoch": self.steps,
            "samples": column["samples"].tolist(),
            "tokens": column["tokens"].tolist(),
            "squares": column["squares"].tolist(),
            "slowdown": column["slowdown"].tolist(),
            # an emulated slow rank computes `slowdown` times as long: CPU time and
            # prediction scale alike (1 on equal ranks)
            "compute_cpu": (column["cpu"] * column["slowdown"]).tolist(),
            "predicted": (predicted * column["slowdown"]).tolist(),
            "compute": column["compute"].tolist(),
            "compute_native": column["native"].tolist(),
            "wall": self.wall.ravel().tolist(),  # rank 0's (every rank waits for the slowest)
            "epoch_times": self.wall.sum(axis=1).tolist(),
            "loss": loss,
            "accuracy": accuracy,
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


def _pool(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One sampler's runs (one per seed) as one record: per-step arrays concatenated seed
    after seed, held-out loss and accuracy averaged, each seed's record under ``seeds``."""
    first = records[0]
    pooled: dict[str, Any] = {"steps_per_epoch": first["steps_per_epoch"], "seeds": records}
    for key, value in first.items():
        if isinstance(value, list):
            pooled[key] = [row for record in records for row in record[key]]
    for key in ("loss", "accuracy", "bound_mean", "bound_worst"):
        if key in first:
            pooled[key] = float(np.mean([record[key] for record in records]))
    if "coordinator_cpu_s" in first:
        pooled["coordinator_cpu_s"] = float(sum(r["coordinator_cpu_s"] for r in records))
    return pooled


def _epoch_loads(run: _Run, epoch: int) -> np.ndarray:
    """Predicted ``(step, rank)`` loads of one run's epoch, emulated slowdowns included."""
    config = run.config
    sizes = run.dataset.sizes
    if run.name == "torch":
        per_rank = []
        for r in range(config.world_size):
            sampler = _torch_sampler(run.dataset, config, r, run.seed)
            sampler.set_epoch(epoch)
            batches = _local_batches(sampler, config.local_batch)
            per_rank.append([float(run.cost(sizes[b]).sum()) for b in batches])
        loads = np.array(per_rank).T
    else:  # a dynamic run's plans follow feedback: its static plan stands in for them
        loads = np.asarray(run.sampler.plan(epoch).loads, dtype=np.float64)
    steps = np.arange(loads.shape[0]) + epoch * loads.shape[0]
    return loads * np.stack([run.profile.slowdown(int(s)) for s in steps])


def _estimate(runs: list[_Run], config: DemoConfig, stretch: float, held_out: int) -> float:
    """Seconds training and evaluation should take: every step's slowest predicted rank,
    times the calibration's measured stretch (planning only, no training)."""
    train = sum(
        float(_epoch_loads(run, epoch).max(axis=1).sum())
        for run in runs
        for epoch in range(config.epochs)
    )
    # evaluation: a forward pass is about a third of a training step's work per sample
    per_sample = float(np.mean(runs[0].cost(np.asarray(config.lengths))))
    evaluate = len(runs) * held_out / config.world_size * per_sample / 3
    return (train + evaluate) * stretch


def _cost_text(cost: CostModel, seconds: bool) -> str:
    a, b, c = cost.to_tuple()
    if not seconds:
        return f"{a:g} + {b:g}·s + {c:g}·s² per sample of s tokens (relative units)"
    return f"{a * 1e3:.3g} ms + {b * 1e6:.3g} µs·s + {c * 1e9:.3g} ns·s² per sample of s tokens"


def _duration(seconds: float) -> str:
    seconds = max(1, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def _train_all(
    dataset: PackedTokens, held_out: PackedTokens, config: DemoConfig, rank: int
) -> dict[str, Any]:
    """Calibrate, then train every (seed, sampler) run with their steps interleaved."""
    heaviest = _heaviest_local_batch(dataset, config, rank)
    say = rank == 0 and config.progress
    bar = tqdm(
        total=config.warmup_steps + config.calibration_steps,
        unit="step",
        disable=not say,
        mininterval=0.25,
        dynamic_ncols=True,
    )
    with bar:
        cost, calibration, measured = _calibrate(dataset, config, rank, heaviest, bar)
        runs = [
            _Run(name, k, dataset, config, rank, cost)
            for k in range(config.seeds)
            for name in config.samplers
        ]
        steps = max(run.steps for run in runs)
        if rank == 0 and config.calibration_steps:
            estimate = _estimate(runs, config, calibration["stretch"], len(held_out))
            calibration["estimate_s"] = estimate
        if say:
            calibrated = config.calibration_steps > 0
            text = _cost_text(cost, seconds=calibrated)
            tqdm.write(
                f"chronica demo: cost fitted to {config.calibration_steps} steps x "
                f"{config.world_size} ranks of measured CPU time: {text}"
                if calibrated
                else f"chronica demo: a-priori cost model: {text}",
                file=sys.stderr,
            )
            estimate_text = (
                f"estimated {_duration(calibration['estimate_s'])} on this machine as loaded now"
                if calibrated
                else "no run-time estimate without calibration"
            )
            tqdm.write(
                f"chronica demo: training {len(runs)} runs ({plural(config.seeds, 'seed')} x "
                f"{', '.join(config.samplers)}), {config.epochs} epochs x {steps} steps each, "
                f"steps interleaved; {estimate_text}",
                file=sys.stderr,
            )
        bar.reset(total=config.epochs * sum(run.steps for run in runs))
        for epoch in range(config.epochs):
            bar.set_description_str(f"epoch {epoch + 1}/{config.epochs}")
            for run in runs:
                run.start_epoch(epoch)
            dist.barrier()
            loss = math.nan
            for step in range(steps):
                for run in runs:
                    if step < run.steps:
                        loss = run.step(epoch, step)
                        bar.update(1)
                if step % 8 == 0:
                    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if config.calibration_steps:
                mine = np.concatenate([run.measurements(epoch) for run in runs])
                measured = np.concatenate([measured, _gather(mine, config.world_size)], axis=1)
                cost, quality = _fit_on_rank0(measured, rank)
                for run in runs:
                    run.recalibrate(cost)
    records: dict[str, Any] = {}
    for name in config.samplers:
        records[name] = _pool([run.record(held_out, cost) for run in runs if run.name == name])
    if config.calibration_steps:
        calibration["final"] = {"coefficients": list(cost.to_tuple()), **quality}
    records["calibration"] = calibration
    for run in runs:
        if run.reports:
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


def held_out_set(config: DemoConfig) -> PackedTokens:
    """``eval_samples`` fresh samples (new tokens) with lengths drawn from the training
    lengths: the same task and length distribution, never trained on."""
    rng = np.random.default_rng([config.seed, 0xE1A1])
    lengths = rng.choice(np.asarray(config.lengths), config.eval_samples, replace=True)
    return PackedTokens(lengths, seed=config.seed + 7_919)


def _worker(config_path: str, result_path: str) -> int:
    """One rank: join the group, calibrate, train every run, rank 0 writes the results."""
    _watch_parent()
    torch.set_num_threads(1)
    # Subnormal floats (softmax tails once the model has learnt) take a slow path on x86 CPUs
    # and would make later epochs cost more than earlier ones for reasons unrelated to sampling.
    torch.set_flush_denormal(True)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process; harmless
        pass
    payload = json.loads(Path(config_path).read_text())
    payload["samplers"] = tuple(payload["samplers"])
    payload["simulate_worlds"] = tuple(payload["simulate_worlds"])
    config = DemoConfig(**payload)
    dist.init_process_group(
        "gloo", init_method="env://", timeout=timedelta(seconds=config.collective_timeout_s)
    )
    try:
        rank = dist.get_rank()
        pinned = pin_rank(rank, config.world_size, config.pin)
        dataset = PackedTokens(np.asarray(config.lengths), seed=config.seed)
        results = _train_all(dataset, held_out_set(config), config, rank)
        results["pinned"] = pinned
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
