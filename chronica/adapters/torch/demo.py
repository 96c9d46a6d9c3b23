"""``chronica demo``: torch's ``DistributedSampler`` against chronica's, in a real 2-process job.

The demo starts ``--world-size`` (default 2) Python processes that form a ``torch.distributed``
group (gloo over loopback), each on one CPU thread. They train a small sequence classifier on
variable-length token sequences twice, with the same model initialisation, the same data and
the same number of steps: once with ``torch.utils.data.DistributedSampler`` and once with
``chronica.torch.utils.data.DistributedSampler``. The two runs alternate epochs (ABBA order),
so a busy moment of a shared machine does not land on one sampler only. The model packs a
local batch into one flat token tensor, so its compute is proportional to the local batch's
token count (no padding) and the slowest rank sets the pace of every step.

Measured per rank and step: the rank's own compute time (forward and backward up to the moment
its gradients are ready for the all-reduce, taken in a DDP communication hook), because the
synchronised wall time of a step is the same on every rank. The table reports the per-step
max/mean of those times, the same ratio predicted from the sizes, and rank 0's wall-clock epoch
time, including data loading and synchronisation.

The module is also the worker: ``python -m chronica.adapters.torch.demo _worker CONFIG`` runs
one rank (started by ``main``; not meant to be called by hand).
"""

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import DistributedSampler as TorchDistributedSampler
from tqdm import tqdm

from chronica.adapters.torch.data import DistributedBatchSampler as ChronicaBatchSampler
from chronica.adapters.torch.data import DistributedSampler as ChronicaDistributedSampler
from chronica.adapters.torch.feedback import ComputeTimer
from chronica.core.cost import CostModel
from chronica.core.hetero import SpeedProfile

__all__ = [
    "DemoConfig",
    "PackedBatch",
    "PackedClassifier",
    "PackedTokens",
    "collate_packed",
    "cost_model_for",
    "format_report",
    "launch",
    "load_lengths",
    "main",
    "make_lengths",
]

_MODULE = "chronica.adapters.torch.demo"
_WORKER_FLAG = "_worker"
_SAMPLERS = ("torch", "chronica", "dynamic")
# Steps per dynamic plan window in the demo (short epochs need frequent re-evaluation).
_DYNAMIC_WINDOW = 4


# -- data -----------------------------------------------------------------------------------


def make_lengths(
    n: int, seed: int = 0, mean_log: float = 5.0, sigma: float = 1.0, low: int = 8, high: int = 4096
) -> np.ndarray:
    """``n`` token lengths drawn from lognormal(``mean_log``, ``sigma``), rounded and clipped
    to ``[low, high]``, as int64. The same ``seed`` gives the same lengths everywhere."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive int (number of samples)")
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(mean_log, sigma, n)), low, high).astype(np.int64)


def load_lengths(path: str | os.PathLike[str], limit: int | None = None) -> np.ndarray:
    """Token lengths from a text file with one number per line (blank lines and ``#`` comments
    ignored), optionally only the first ``limit``. Every length must be an integer >= 1."""
    values: list[int] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{path}:{number}: {text!r} is not a number") from None
            if not math.isfinite(value) or value < 1 or value != int(value):
                raise ValueError(f"{path}:{number}: length {text} must be an integer >= 1")
            values.append(int(value))
    if not values:
        raise ValueError(f"{path} holds no lengths; write one token count per line")
    if limit is not None:
        if limit > len(values):
            raise ValueError(
                f"--samples {limit} asks for more samples than {path} holds ({len(values)}); "
                f"leave --samples out to use them all"
            )
        values = values[:limit]
    return np.asarray(values, dtype=np.int64)


class PackedTokens(TorchDataset):
    """Variable-length token sequences with learnable labels, stored as one flat tensor.

    Sample ``i`` has ``lengths[i]`` tokens and a label in ``[0, classes)``. About ``signal``
    of its tokens come from the label's own band of the vocabulary, the rest are uniform, so
    the label can be learnt from the token mix. ``sizes`` (the token counts) is what a
    size-aware sampler reads.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        vocab: int = 256,
        classes: int = 4,
        signal: float = 0.25,
        seed: int = 0,
    ) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0 or lengths.min() < 1:
            raise ValueError("lengths must be a non-empty 1-D array of integers >= 1")
        if vocab % classes:
            raise ValueError(f"vocab={vocab} must be a multiple of classes={classes}")
        rng = np.random.default_rng([seed, 1])
        labels = rng.integers(classes, size=lengths.size)
        total = int(lengths.sum())
        tokens = rng.integers(vocab, size=total)
        owner = np.repeat(labels, lengths)
        marked = rng.random(total) < signal
        band = vocab // classes
        tokens[marked] = owner[marked] * band + rng.integers(band, size=int(marked.sum()))
        self.vocab = vocab
        self.classes = classes
        self.sizes = lengths
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        self.tokens = torch.from_numpy(tokens)
        self.labels = labels.tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]], self.labels[index]


class PackedBatch(NamedTuple):
    """A local batch packed without padding: ``tokens`` of all sequences back to back,
    ``segments[t]`` the sequence token ``t`` belongs to, one length and label per sequence."""

    tokens: torch.Tensor
    segments: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor


def collate_packed(batch: list[tuple[torch.Tensor, int]]) -> PackedBatch:
    """``DataLoader`` ``collate_fn`` that concatenates variable-length samples."""
    seqs = [tokens for tokens, _ in batch]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    segments = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    return PackedBatch(torch.cat(seqs), segments, lengths, labels)


# -- model ----------------------------------------------------------------------------------


class _SequenceAttention(nn.Module):
    """Single-head self-attention inside each packed sequence: cost grows with length²."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        parts = [
            F.scaled_dot_product_attention(qs[None], ks[None], vs[None])[0]
            for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
        ]
        return self.out(torch.cat(parts))


class PackedClassifier(nn.Module):
    """Embedding → residual per-token MLP (→ optional per-sequence attention) → mean-pool per
    sequence (``index_add``) → linear classifier. Works on a ``PackedBatch``'s flat tokens, so
    its compute is proportional to the batch's token count (plus Σ length² with attention).

    Without attention, tokens go through in chunks of ``chunk`` tokens: every large tensor then
    has the same shape whatever the batch, so the C allocator reuses freed blocks instead of
    growing the heap and faulting in fresh pages (slow on some virtual machines), which would
    make a large batch cost more per token than a small one.
    """

    def __init__(
        self,
        vocab: int,
        classes: int,
        dim: int = 128,
        hidden: int = 512,
        attention: bool = False,
        chunk: int = 1024,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.attention = _SequenceAttention(dim) if attention else None
        self.head = nn.Linear(dim, classes)
        self.chunk = chunk

    def _tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return x + self.mlp(x)

    def forward(
        self, tokens: torch.Tensor, segments: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        pooled = self.head.weight.new_zeros(lengths.numel(), self.embed.embedding_dim)
        if self.attention is not None:
            x = self._tokens(tokens)
            x = x + self.attention(x, lengths.tolist())
            pooled = pooled.index_add(0, segments, x)
        else:
            for start in range(0, tokens.numel(), self.chunk):
                part = slice(start, start + self.chunk)
                pooled = pooled.index_add(0, segments[part], self._tokens(tokens[part]))
        return self.head(pooled / lengths[:, None].to(pooled.dtype))


def cost_model_for(cost: str, dim: int, hidden: int) -> CostModel:
    """The cost model matching ``PackedClassifier``'s multiply-adds per sequence of length s.

    ``linear``: the per-token MLP, cost ∝ s. ``quadratic``: with attention, 4·d·s² for the
    scores and their use plus (4·d·h + 8·d²)·s for the MLP and projections, divided by 4·d.
    """
    if cost == "linear":
        return CostModel.linear()
    if cost == "quadratic":
        return CostModel.quadratic(0.0, float(hidden + 2 * dim), 1.0)
    raise ValueError(f"cost={cost!r} must be 'linear' or 'quadratic'")


# -- configuration --------------------------------------------------------------------------


@dataclass
class DemoConfig:
    """Everything one demo run depends on; travels to the workers as JSON."""

    lengths: list[int]
    lengths_source: str
    batch_size: int = 32
    epochs: int = 6
    kind: str = "static"
    cost: str = "linear"
    seed: int = 0
    world_size: int = 2
    dim: int = 128
    hidden: int = 512
    lr: float = 3e-3
    warmup_steps: int = 3
    progress: bool = True
    collective_timeout_s: float = 120.0
    samplers: tuple[str, ...] = field(default=_SAMPLERS[:2])
    speeds: str = "constant"
    coordinator_port: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the option to fix."""
        if self.world_size < 1:
            raise ValueError(f"--world-size {self.world_size} must be >= 1")
        if self.batch_size < self.world_size or self.batch_size % self.world_size:
            raise ValueError(
                f"--batch-size {self.batch_size} (global) must be a positive multiple of the "
                f"world size {self.world_size}"
            )
        if self.epochs < 1:
            raise ValueError(f"--epochs {self.epochs} must be >= 1")
        if len(self.lengths) < self.batch_size:
            raise ValueError(
                f"{len(self.lengths)} samples are fewer than one global batch "
                f"({self.batch_size}); raise --samples or lower --batch-size"
            )
        unknown = sorted(set(self.samplers) - set(_SAMPLERS))
        if unknown or not self.samplers:
            raise ValueError(f"--samplers {unknown} must be a comma list of {_SAMPLERS}")
        SpeedProfile.parse(self.speeds, self.world_size)  # raises naming the format

    def profile(self) -> SpeedProfile:
        """The emulated rank speeds (``--speeds``)."""
        return SpeedProfile.parse(self.speeds, self.world_size)


# -- one rank -------------------------------------------------------------------------------


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
            window=_DYNAMIC_WINDOW,
            sizes=dataset.sizes,
            cost=cost,
            port=config.coordinator_port,
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


def _heaviest_local_batch(runs: list["_Training"]) -> list[int]:
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
        coordinator = getattr(getattr(self.sampler, "_session", None), "coordinator", None)
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


# -- launcher -------------------------------------------------------------------------------


class DemoError(RuntimeError):
    """The distributed job failed or timed out; the message says which rank and why."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_pair() -> int:
    """A port whose successor is free too (the coordinator publishes on port + 1)."""
    for _ in range(100):
        port = _free_port()
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise DemoError("no pair of free ports on 127.0.0.1 for the coordinator")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(config: DemoConfig, timeout_s: float) -> dict[str, Any]:
    """Run the ranks as subprocesses and return rank 0's results; never leaves a rank behind."""
    package_root = str(Path(__file__).resolve().parents[3])
    with tempfile.TemporaryDirectory(prefix="chronica-demo-") as tmp:
        config_path = Path(tmp) / "config.json"
        result_path = Path(tmp) / "result.json"
        payload = asdict(config)
        payload["samplers"] = list(config.samplers)
        if "dynamic" in config.samplers and not config.coordinator_port:
            payload["coordinator_port"] = _free_port_pair()
        config_path.write_text(json.dumps(payload))
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
            WORLD_SIZE=str(config.world_size),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
        )
        # Keep freed memory in the ranks' heaps (glibc): returning it to the OS and faulting it
        # back is slow on some virtual machines and would be billed to random steps.
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 36))
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 25))
        command = [sys.executable, "-m", _MODULE, _WORKER_FLAG, str(config_path), str(result_path)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(config.world_size):
                procs.append(subprocess.Popen(command, env=dict(env, RANK=str(rank))))
            deadline = time.monotonic() + timeout_s
            while True:
                codes = [proc.poll() for proc in procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    rank, code = failed[0]
                    raise DemoError(f"rank {rank} exited with code {code} (see its output above)")
                if all(code == 0 for code in codes):
                    break
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"the demo did not finish within {timeout_s:.0f} s; stopped all ranks "
                        f"(raise --timeout on a slow machine)"
                    )
                time.sleep(0.2)
        finally:
            _stop(procs)
        if not result_path.is_file():
            raise DemoError("rank 0 finished without writing its results")
        return json.loads(result_path.read_text())


# -- report ---------------------------------------------------------------------------------


def _ratios(loads: np.ndarray) -> np.ndarray:
    """Per-step max/mean over ranks; steps without load count as balanced."""
    mean = loads.mean(axis=1)
    return np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)


def format_report(config: DemoConfig, results: dict[str, Any], elapsed_s: float) -> str:
    """The demo's table: measured and predicted per-step max/mean rank load, epoch time,
    final-epoch loss and accuracy for each sampler, and the measured speed-up."""
    world, b = config.world_size, config.batch_size
    lengths = np.asarray(config.lengths)
    first = next(iter(results.values()))
    lines = [
        f"chronica demo: {world} processes (torch.distributed, gloo, 1 thread each), "
        f"{len(lengths)} samples, global batch {b} ({b // world} per rank), "
        f"{first['steps_per_epoch']} steps x {config.epochs} epochs, kind={config.kind}, "
        f"cost={config.cost}, rank speeds {config.speeds}",
        f"token lengths: {config.lengths_source}; mean {lengths.mean():.0f}, max {lengths.max()}",
        "",
        f"{'':10}{'per-step max/mean rank load':^30}",
        f"{'sampler':10}{'measured':^15}{'predicted':^15}{'epoch time':>12}"
        f"{'loss':>8}{'accuracy':>10}{'cpu share':>11}",
        f"{'':10}{'mean':>7}{'worst':>8}{'mean':>7}{'worst':>8}",
    ]
    epoch_time: dict[str, float] = {}
    lowest_share = 1.0
    for name, record in results.items():
        compute = np.asarray(record["compute"])
        measured = _ratios(compute)
        predicted = _ratios(np.asarray(record["predicted"]))
        native = float(np.sum(record["compute_native"]))
        share = float(np.sum(record["compute_cpu"]) / max(native, 1e-12))
        lowest_share = min(lowest_share, share)
        epoch_time[name] = float(np.mean(record["epoch_times"]))
        lines.append(
            f"{name:10}{measured.mean():7.2f}{measured.max():8.2f}"
            f"{predicted.mean():7.2f}{predicted.max():8.2f}"
            f"{epoch_time[name]:10.2f} s{record['loss']:8.3f}{record['accuracy']:9.1%}"
            f"{share:10.0%}"
        )
    lines.append("")
    for name in ("chronica", "dynamic"):
        if "torch" in epoch_time and name in epoch_time:
            speedup = epoch_time["torch"] / epoch_time[name]
            lines.append(
                f"speed-up of {name} (torch epoch time / {name} epoch time, measured in this "
                f"run): {speedup:.2f}x"
            )
    chronica = results.get("chronica", {})
    if "bound_mean" in chronica:
        lines.append(
            f"best any equal-count split of chronica's steps could predict: mean "
            f"{chronica['bound_mean']:.2f}, worst {chronica['bound_worst']:.2f} "
            f"(a step cannot beat its largest sample)"
        )
    lines.append(
        f"measured load = each rank's own forward+backward time per step (times its emulated "
        f"slowdown); epoch time = rank 0 wall clock, mean of {config.epochs}; cpu share = CPU "
        f"time / wall time while computing; dynamic = kind='dynamic', variable_batch=True"
    )
    if lowest_share < 0.9:
        lines.append(
            f"note: ranks got only {lowest_share:.0%} of a core while computing (other processes, "
            f"or more ranks than cores, competed for the CPUs), so these timings are noisy"
        )
    lines.append(f"whole demo: {elapsed_s:.0f} s")
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> tuple[DemoConfig, float]:
    parser = argparse.ArgumentParser(
        prog="chronica demo",
        description="Train a small sequence model on variable-length data in a real "
        "multi-process torch.distributed job (gloo, loopback), once with torch's "
        "DistributedSampler and once with chronica's, and compare step balance and epoch time.",
    )
    parser.add_argument("--samples", type=int, default=None, help="samples (default 2048)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (default 32)")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per run (default 6; 2 with --cost quadratic)",
    )
    parser.add_argument("--kind", choices=("static", "guided"), default="static")
    parser.add_argument(
        "--cost",
        choices=("linear", "quadratic"),
        default="linear",
        help="linear: per-token MLP; quadratic: adds per-sequence attention",
    )
    parser.add_argument(
        "--lengths", metavar="FILE", help="token lengths, one per line (default: generated)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--speeds",
        default="constant",
        help="emulated rank speeds: constant, HL2..HL8 (4 ranks), '1,1,0.5', "
        "'straggler:RANK@STEP*FACTOR' (default constant)",
    )
    parser.add_argument(
        "--samplers",
        default=None,
        help="comma list of torch, chronica, dynamic (default torch,chronica; with --speeds "
        "also dynamic)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny configuration (tests)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="stop everything after this many seconds"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    samples = args.samples if args.samples is not None else (192 if quick else 2048)
    if args.lengths:
        lengths = load_lengths(args.lengths, args.samples)
        source = args.lengths
    else:
        if samples < 1:
            parser.error(f"--samples {samples} must be >= 1")
        lengths = make_lengths(samples, seed=args.seed, high=1024 if quick else 4096)
        source = f"lognormal(5, 1) clipped to [8, {1024 if quick else 4096}], seed {args.seed}"
    config = DemoConfig(
        lengths=lengths.tolist(),
        lengths_source=source,
        batch_size=args.batch_size or (16 if quick else 32),
        epochs=args.epochs or (1 if quick else 2 if args.cost == "quadratic" else 6),
        kind=args.kind,
        cost=args.cost,
        seed=args.seed,
        world_size=args.world_size,
        dim=32 if quick else 128,
        hidden=64 if quick else 512,
        warmup_steps=1 if quick else 3,
        progress=not args.no_progress,
        speeds=args.speeds,
        samplers=tuple(args.samplers.split(","))
        if args.samplers
        else _SAMPLERS[:2] + (("dynamic",) if args.speeds != "constant" else ()),
    )
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return config, args.timeout


def main(argv: list[str] | None = None) -> int:
    """Run the demo (``chronica demo [options]``); print the table; return the exit code."""
    started = time.perf_counter()
    try:
        config, timeout_s = _parse(argv)
    except (OSError, ValueError) as exc:  # e.g. a missing or malformed --lengths file
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 2
    print(
        f"chronica demo: starting {config.world_size} processes; each trains once per sampler "
        f"({', '.join(config.samplers)}), alternating epochs",
        file=sys.stderr,
        flush=True,
    )
    try:
        results = launch(config, timeout_s)
    except DemoError as exc:
        print(f"chronica demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("chronica demo: interrupted; all ranks stopped", file=sys.stderr)
        return 130
    print(format_report(config, results, time.perf_counter() - started), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [_WORKER_FLAG] and len(sys.argv) == 4:
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1:]))
