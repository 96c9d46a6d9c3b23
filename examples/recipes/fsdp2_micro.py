"""An FSDP2 (``fully_shard``) training loop whose micro-batches ``chronica.plan_step`` plans.

Under FSDP every micro-batch all-gathers the parameters and reduce-scatters the gradients,
so the ranks move micro-batch by micro-batch: a step lasts ``sum_k max_r C[r, k]``, the sum
over micro-batches of the slowest rank's. ``Packing(balance="micro")`` minimises exactly
that, under the token cap, with the same number of micro-batches on every rank (no rank
waits in a collective the others never reach). The loop, per step::

    plan = chronica.plan_step(lengths, world, packing, loss_tokens=lengths - 1)
    weights = plan.loss_weights(rank)
    for k, docs in enumerate(plan.micro_batches(rank)):
        loss = mean_token_loss(model, docs, plan, k) * weights[k]
        loss.backward()
    optimizer.step()

The weights make the reduced gradient (FSDP averages over ranks) the gradient of the mean
loss over every loss-bearing token of the global batch, however the plan cut it: the
parameters after N steps equal those of one process training on the whole batches.

Documents are packed flat (one row, ``cu_seqlens`` offsets, positions restarting at every
document), as flash-attention's variable-length kernel consumes them; here attention runs
per document with ``scaled_dot_product_attention``.

    torchrun --nproc-per-node 2 examples/recipes/fsdp2_micro.py
    python examples/recipes/fsdp2_micro.py          # starts the 2 processes itself

(gloo on CPU; on GPUs use nccl and move the model and inputs to the device.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

try:
    import chronica
except ModuleNotFoundError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import chronica

VOCAB, HIDDEN, HEADS, LAYERS, ROW = 64, 32, 2, 2, 256
PACKING = chronica.Packing(max_tokens=512, balance="micro", loss="loss_token")
DOCUMENTS_PER_STEP, LR = 24, 0.5


class Block(nn.Module):
    """Pre-norm transformer layer: causal attention within every document, then an MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.hidden, self.heads = hidden, heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        qkv = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.hidden // self.heads)
        # (1, heads, T, head_dim): 4-D inputs let torch pick its fused (flash) CPU kernel,
        # which works block by block; 3-D ones fall back to the math kernel, which
        # materialises every document's T x T scores.
        q, k, v = qkv.permute(1, 2, 0, 3).unsqueeze(1)
        attended = [
            F.scaled_dot_product_attention(
                q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], is_causal=True
            )
            for s, e in itertools.pairwise(cu_seqlens)
        ]
        x = x + self.out(torch.cat(attended, dim=2)[0].transpose(0, 1).reshape(-1, self.hidden))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A decoder over one flat packed row: ``(T,)`` token ids, positions and the documents'
    ``cu_seqlens`` in, ``(T, vocab)`` logits out; initialised from ``seed``."""

    def __init__(
        self,
        seed: int = 0,
        hidden: int = HIDDEN,
        heads: int = HEADS,
        layers: int = LAYERS,
        row: int = ROW,
        vocab: int = VOCAB,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(row, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: list[int]
    ) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions(position_ids)
        for block in self.blocks:
            x = block(x, cu_seqlens)
        return self.head(x)


def global_batches(steps: int, seed: int = 0) -> list[list[torch.Tensor]]:
    """``steps`` global batches of ``DOCUMENTS_PER_STEP`` token documents, lognormal lengths
    in ``[2, ROW]``: the same on every rank (the trainer's rollouts or SFT batch)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(4.0, 0.9, (steps, DOCUMENTS_PER_STEP)), 2, ROW).astype(int)
    return [[torch.from_numpy(rng.integers(0, VOCAB, n)) for n in step] for step in lengths]


def token_loss_sum(model: nn.Module, documents: list[torch.Tensor]) -> torch.Tensor:
    """Summed next-token cross entropy of ``documents`` packed into one flat row (each
    document's last token predicts nothing: ``len - 1`` loss tokens per document)."""
    if not documents:  # an empty micro-batch still runs the collectives: a zero loss
        return (
            model(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), [0, 1]).sum()
            * 0
        )
    lengths = [len(d) for d in documents]
    cu_seqlens = np.concatenate(([0], np.cumsum(lengths))).tolist()
    positions = torch.cat([torch.arange(n) for n in lengths])
    logits = model(torch.cat(documents), positions, cu_seqlens)
    targets = torch.cat([torch.cat((d[1:], torch.tensor([-100]))) for d in documents])
    return F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")


def train_step(
    model: nn.Module, batch: list[torch.Tensor], world: int, rank: int
) -> chronica.StepPlan:
    """One step of rank ``rank``: plan the global batch, run this rank's micro-batches with
    their loss weights (the optimizer step is the caller's). Returns the plan."""
    lengths = np.array([len(d) for d in batch])
    plan = chronica.plan_step(lengths, world, PACKING, loss_tokens=lengths - 1)
    weights = plan.loss_weights(rank)
    for k, docs in enumerate(plan.micro_batches(rank)):
        loss_tokens = max(1, int((lengths[docs] - 1).sum()))
        mean = token_loss_sum(model, [batch[i] for i in docs]) / loss_tokens
        (mean * weights[k]).backward()
    return plan


def reference_parameters(batches: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One process, no FSDP: every step the mean loss over all loss tokens of the whole
    global batch, SGD. What the sharded run must end with."""
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for batch in batches:
        loss = token_loss_sum(model, batch) / sum(len(d) - 1 for d in batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def main(steps: int, out: str | None) -> None:
    """One rank of the job (torchrun's environment variables say which)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = TinyLM()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    trained = []
    for step, batch in enumerate(global_batches(steps)):
        plan = train_step(model, batch, world, rank)
        optimizer.step()
        optimizer.zero_grad()
        trained.append([docs.tolist() for docs in plan.micro_batches(rank)])
        if rank == 0:
            print(f"step {step}: {plan}")
    everyone: list = [None] * world
    dist.all_gather_object(everyone, trained)
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    if rank == 0 and out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "micro_batches.json").write_text(json.dumps(everyone))
        torch.save(full, Path(out) / "parameters.pt")
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, steps: int, out: str | None) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    main(steps, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", help="folder for the micro-batches and final parameters")
    args = parser.parse_args()
    if "RANK" in os.environ:
        main(args.steps, args.out)
    else:  # start 2 ranks that meet at a store on a port the OS picks
        import torch.multiprocessing as mp

        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        mp.spawn(_spawned, args=(2, store.port, args.steps, args.out), nprocs=2)
