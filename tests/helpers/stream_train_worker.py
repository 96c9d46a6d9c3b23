"""One rank of a 2-process gloo job training a tiny causal transformer (DDP) on packed,
balanced micro-batches of an MDS stream (``chronica.torch.StreamingDataset`` through
torchdata's ``StatefulDataLoader``), started by
tests/adapters/torch/test_streaming_train.py.

argv: data_dir, out_dir, modes, cut; modes is one mode or several, comma-separated, run in
turn in the same process group, each on a fresh data set, model and optimizer. Modes:
``full``   the whole pass, uninterrupted;
``part``   the pass up to the optimizer step of global step ``cut``; then every rank saves
           the loader's state, the model and the optimizer to out_dir/ckpt-<rank>.pt, trains
           on into the next step, and dies by ``os._exit`` (no close, no group teardown);
``rest``   fresh processes that load the checkpoint and train to the end of the pass.
Writes out_dir/<mode>-<rank>.pt: the final parameters (``full``, ``rest``) or the
checkpoint's (``part``), the steps trained and, for ``part``, the stream's position.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

from chronica.core.packing import Packing
from chronica.runtime.sources import MDSSource
from chronica.torch import StreamingDataset

VOCAB, HIDDEN, HEADS, LAYERS, LONGEST = 32, 16, 2, 2, 48
PACKING = Packing(max_tokens=96)
OPTIONS = {"batch_size": 8, "window_steps": 2, "buffer_size": 4, "seed": 5}


class Block(nn.Module):
    """Pre-norm transformer layer: causal attention within every packed document, then an
    MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(
            nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN)
        )

    def forward(self, x: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, HEADS, HIDDEN // HEADS).permute(1, 2, 0, 3)
        attended = [
            F.scaled_dot_product_attention(q[:, s:e], k[:, s:e], v[:, s:e], is_causal=True)
            for s, e in itertools.pairwise(cu_seqlens)
        ]
        x = x + self.out(torch.cat(attended, dim=1).transpose(0, 1).reshape(-1, HIDDEN))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A decoder over one flat packed row: token ids, positions restarting at every
    document, and the documents' ``cu_seqlens`` in; ``(T, vocab)`` logits out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(LONGEST, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, batch: dict) -> torch.Tensor:
        """The micro-batch's summed next-token loss (a document's last token predicts
        nothing); an empty micro-batch gives a zero that still reaches every parameter."""
        if int(batch["num_tokens"]) == 0:
            return sum(p.sum() for p in self.parameters()) * 0.0
        ids, cu_seqlens = batch["input_ids"], batch["cu_seqlens"].tolist()
        x = self.tokens(ids) + self.positions(batch["position_ids"])
        for block in self.blocks:
            x = block(x, cu_seqlens)
        targets = torch.cat((ids[1:], ids[:1]))
        targets[torch.as_tensor(cu_seqlens[1:]) - 1] = -100
        return F.cross_entropy(self.head(x), targets, ignore_index=-100, reduction="sum")


def train(model, optimizer, batches, cut: int | None) -> list[int]:
    """Train to the end of the pass (or through step ``cut``): each micro-batch's mean
    token loss times its ``loss_weight``, gradients all-reduced on the step's last
    micro-batch only. Returns the steps trained."""
    steps: list[int] = []
    for batch in batches:
        with contextlib.nullcontext() if batch["last"] else model.no_sync():
            loss = model(batch) / max(1, int(batch["num_tokens"])) * batch["loss_weight"]
            loss.backward()
        if batch["last"]:
            optimizer.step()
            optimizer.zero_grad()
            steps.append(int(batch["step"]))
            if cut is not None and batch["step"] == cut:
                break
    return steps


def main(data_dir: str, out_dir: str, modes: str, cut: str) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
    for mode in modes.split(","):
        run(data_dir, Path(out_dir), mode, int(cut))
    dist.destroy_process_group()


def run(data_dir: str, folder: Path, mode: str, cut: int) -> None:
    rank = dist.get_rank()
    dataset = StreamingDataset(MDSSource(data_dir, length="input_ids"), PACKING, **OPTIONS)
    loader = StatefulDataLoader(dataset, batch_size=None)
    model = DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    if mode == "rest":
        saved = torch.load(folder / f"ckpt-{rank}.pt", weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
    batches = iter(loader)
    steps = train(model, optimizer, batches, cut if mode == "part" else None)
    result = {
        "steps": steps,
        "params": {k: v.clone() for k, v in model.module.state_dict().items()},
    }
    if mode == "part":
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "loader": loader.state_dict()},
            folder / f"ckpt-{rank}.pt",
        )  # fmt: skip
        result["stream"] = dataset.state_dict()
        torch.save(result, folder / f"{mode}-{rank}.pt")
        dist.barrier()  # both checkpoints are written: now die mid-step, mid-window
        batch = next(batches)
        with model.no_sync():
            model(batch).backward()
        os._exit(0)
    torch.save(result, folder / f"{mode}-{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
