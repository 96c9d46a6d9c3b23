"""One rank of the context-parallel attention job of
tests/adapters/torch/test_context_parallel_attention.py.

argv: output path. Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Every rank builds the
same micro-batch (documents of mixed lengths, some sharded over the group in head-tail
chunks by ``chronica.core.packing.context_parallel``, the others whole on one rank), and
the same queries, keys and values. Each rank takes its shard's tokens, all-gathers the
group's keys and values (autograd-aware, so gradients flow back to their owners) and runs
causal attention within documents; the outputs and the gradients of a fixed loss are
gathered and written with single-process attention's over the whole micro-batch.
"""

import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from chronica.core.packing.context_parallel import context_layout, restore_order

HEADS, DIM = 2, 8


def attention(q, k, v, q_doc, q_pos, k_doc, k_pos):
    """Causal attention within documents: a query sees its document's keys at positions at
    or before its own."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / DIM**0.5
    allowed = (q_doc[:, None] == k_doc[None, :]) & (k_pos[None, :] <= q_pos[:, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def main() -> None:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    lengths = np.array([8 * size, 5, 4 * size, 3, 12 * size, 1])
    sharded = np.array([True, False, True, False, True, False])
    owner = np.arange(lengths.shape[0]) % size
    shards = context_layout(lengths, sharded=sharded, owner=owner, size=size)
    total = int(lengths.sum())
    doc = np.repeat(np.arange(lengths.shape[0]), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])

    generator = torch.Generator().manual_seed(0)
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
    if rank == 0:
        with open(sys.argv[1], "w") as file:
            file.write(repr(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
