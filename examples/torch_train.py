"""From torch's DistributedSampler to chronica's: the three lines that change.

    python examples/torch_train.py

starts 2 processes (torch.distributed, gloo on 127.0.0.1), trains a tiny sequence classifier
on variable-length sequences, once per sampler, and prints how unequal the ranks' token loads
were per step. The migration, in a training script that already uses DDP:

    - from torch.utils.data import DistributedSampler
    + from chronica.torch.utils.data import DistributedSampler           # 1. the import
    - sampler = DistributedSampler(dataset)
    + sampler = DistributedSampler(dataset, batch_size=GLOBAL_BATCH,     # 2. the global batch
    +                              sizes=dataset.lengths)                 # 3. what a sample costs
      loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler, ...)

Everything else (``set_epoch``, ``len``, padding, ``drop_last``) is torch's contract.
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import DistributedSampler as TorchDistributedSampler

try:
    from chronica.torch.utils.data import DistributedSampler
except ModuleNotFoundError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from chronica.torch.utils.data import DistributedSampler
from chronica.comm.ports import free_port

WORLD = 2
GLOBAL_BATCH = 32
EPOCHS = 2


class Sequences(Dataset):
    """Token sequences of lognormal length; the label is which half of the vocabulary they use."""

    def __init__(self, n: int = 1024, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = np.clip(rng.lognormal(5.0, 1.0, n), 8, 2048).astype(np.int64)
        self.labels = rng.integers(2, size=n)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        label = int(self.labels[index])
        tokens = torch.randint(128, (int(self.lengths[index]),), generator=generator)
        return tokens + 128 * label, label


def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, ...]:
    """Pack the local batch into one flat token tensor (no padding)."""
    lengths = torch.tensor([len(tokens) for tokens, _ in batch])
    segments = torch.repeat_interleave(torch.arange(len(batch)), lengths)
    labels = torch.tensor([label for _, label in batch])
    return torch.cat([tokens for tokens, _ in batch]), segments, lengths, labels


class Classifier(nn.Module):
    """Per-token MLP, mean-pooled per sequence: compute grows with the batch's token count."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, 2)

    def forward(
        self, tokens: torch.Tensor, segments: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.mlp(x)
        pooled = x.new_zeros(len(lengths), x.shape[1]).index_add_(0, segments, x)
        return self.head(pooled / lengths[:, None])


def train(rank: int, world: int, port: int) -> None:
    """One rank: train with torch's sampler, then with chronica's; rank 0 prints the loads."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dataset = Sequences()
    for name in ("torch", "chronica"):
        if name == "torch":
            sampler = TorchDistributedSampler(dataset)
        else:
            sampler = DistributedSampler(dataset, batch_size=GLOBAL_BATCH, sizes=dataset.lengths)
        loader = DataLoader(
            dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler, collate_fn=collate
        )
        torch.manual_seed(0)
        model = DistributedDataParallel(Classifier())
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        tokens_per_step = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for tokens, segments, lengths, labels in loader:
                loss = F.cross_entropy(model(tokens, segments, lengths), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                tokens_per_step.append(len(tokens))
        per_step = _gathered(torch.tensor(tokens_per_step, dtype=torch.float64), world)
        if rank == 0:
            ratio = per_step.max(dim=1).values / per_step.mean(dim=1)
            print(
                f"{name:>8} sampler: per-step max/mean rank tokens {ratio.mean():.3f} "
                f"(worst {ratio.max():.2f}), last loss {loss.item():.3f}",
                flush=True,
            )
    dist.destroy_process_group()


def _gathered(local: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's ``local`` as the columns of one tensor, on every rank, gathered over a gloo
    group of their own that is gone when this returns.

    Why not the default group: DDP keeps it, and so its gloo threads, alive until the
    interpreter exits, and a gloo thread that lets go of a tensor made here after the exit has
    begun aborts the process ("terminate called without an active exception"). This group's
    threads are joined below, while this frame still holds the tensors.
    """
    group = dist.new_group(backend="gloo")
    loads = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(loads, local, group=group)
    dist.destroy_process_group(group)
    del group  # the last reference: its threads are joined here
    return torch.stack(loads, dim=1)  # (step, rank)


if __name__ == "__main__":
    mp.spawn(train, args=(WORLD, free_port()), nprocs=WORLD, join=True)
