"""One rank of the context-parallel attention job of
tests/adapters/torch/test_context_parallel_attention.py.

argv: output folder, then one or more sources, checked in turn in the same process group:
``hand`` (a hand-built layout) or ``plan`` (every micro-batch ``chronica.plan_step`` emits with
``Packing(context_parallel=WORLD_SIZE)``); rank 0 writes each source's largest differences to
errors-<source>.txt in the folder. Reads RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Every rank builds the same micro-batches (documents
of mixed lengths, some sharded over the group in head-tail chunks, the others whole on one
rank), and the same queries, keys and values. Each rank takes its shard's tokens,
all-gathers the group's keys and values (autograd-aware, so gradients flow back to their
owners) and runs causal attention within documents; the outputs and the gradients of a
fixed loss are gathered and compared with single-process attention's over the whole
micro-batch, the largest differences written.
"""

import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from chronica import Packing, plan_step
from chronica.core.packing.context_parallel import context_layout, restore_order

HEADS, DIM = 2, 8


def attention(q, k, v, q_doc, q_pos, k_doc, k_pos):
    """Causal attention within documents: a query sees its document's keys at positions at
    or before its own."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / DIM**0.5
    allowed = (q_doc[:, None] == k_doc[None, :]) & (k_pos[None, :] <= q_pos[:, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def layouts(source: str, size: int):
    """The micro-batches to check, each ``(padded lengths, shards)``: a hand-built layout, or
    every micro-batch ``chronica.plan_step`` emits for one CP group of ``size`` ranks."""
    if source == "hand":
        lengths = np.array([8 * size, 5, 4 * size, 3, 12 * size, 1])
        sharded = np.array([True, False, True, False, True, False])
        owner = np.arange(lengths.shape[0]) % size
        return [(lengths, context_layout(lengths, sharded=sharded, owner=owner, size=size))]
    rng = np.random.default_rng(size)
    lengths = np.concatenate(([40 * size, 9 * size], rng.integers(1, 12, 4 * size)))
    packing = Packing(max_tokens=24 * size, context_parallel=size, pad_multiple=2 * size)
    plan = plan_step(lengths, size, packing, cost="quadratic")
    assert plan.sharded[0], "the long document is sharded"
    out = []
    for k in range(plan.num_micro):
        shards = plan.context_shards(0, k)
        for c, shard in enumerate(shards):
            assert shard.position_ids.tolist() == plan.position_ids(c, k).tolist()
            assert shard.cu_seqlens.tolist() == plan.cu_seqlens(c, k).tolist()
        out.append((plan.padded[plan.context_documents(0, k)], shards))
    return out


def compare(rank: int, lengths: np.ndarray, shards) -> dict:
    """Largest differences between context-parallel and single-process attention over one
    micro-batch: outputs and the gradients of q, k and v."""
    total = int(lengths.sum())
    doc = np.repeat(np.arange(lengths.shape[0]), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])

    generator = torch.Generator().manual_seed(total)
    q, k, v = (torch.randn(total, HEADS, DIM, generator=generator, dtype=torch.float64)
               for _ in range(3))  # fmt: skip
    weight = torch.randn(total, HEADS, DIM, generator=generator, dtype=torch.float64)

    # Single process: the whole micro-batch.
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    t_doc, t_pos = torch.from_numpy(doc), torch.from_numpy(pos)
    expected = attention(*full, t_doc, t_pos, t_doc, t_pos)
    (expected * weight).sum().backward()

    # Context parallel: this rank's shard, the group's keys and values gathered.
    mine = torch.from_numpy(shards[rank].tokens)
    local = [t[mine].clone().requires_grad_(True) for t in (q, k, v)]
    sizes = [int(s.tokens.size) for s in shards]
    width = max(sizes)

    def gathered(x):
        padded = torch.zeros(width, *x.shape[1:], dtype=x.dtype)
        padded = torch.cat([x, padded[x.shape[0] :]])
        parts = dist_fn.all_gather(padded)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])

    order = torch.from_numpy(np.concatenate([s.tokens for s in shards]))
    out = attention(
        local[0], gathered(local[1]), gathered(local[2]),
        torch.from_numpy(shards[rank].documents), torch.from_numpy(shards[rank].position_ids),
        t_doc[order], t_pos[order],
    )  # fmt: skip
    (out * weight[mine]).sum().backward()

    # Reassemble outputs and gradients in the micro-batch's order.
    restore = torch.from_numpy(restore_order(shards))
    results = {}
    for name, local_value, full_value in (
        ("out", out.detach(), expected.detach()),
        ("dq", local[0].grad, full[0].grad),
        ("dk", local[1].grad, full[1].grad),
        ("dv", local[2].grad, full[2].grad),
    ):
        together = gathered(local_value)[restore]
        results[name] = float((together - full_value).abs().max())
    return results


def main(folder: str, *sources: str) -> None:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    for source in sources:
        results = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0, "micro_batches": 0}
        for lengths, shards in layouts(source, size):
            for name, error in compare(rank, lengths, shards).items():
                results[name] = max(results[name], error)
            results["micro_batches"] += 1
        if rank == 0:
            with open(Path(folder) / f"errors-{source}.txt", "w") as file:
                file.write(repr(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
