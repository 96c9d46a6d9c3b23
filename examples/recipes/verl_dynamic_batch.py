"""A verl-style dynamic-batch step planned by ``chronica.plan_step``.

verl's FSDP actor, with ``use_dynamic_bsz``, cuts each rank's share of the batch into
micro-batches of at most ``max_token_len`` real tokens::

    micro_batches, indices = rearrange_micro_batches(batch=data.batch, max_token_len=...)

after the driver's ``_balance_batch`` reordered the global batch so that every rank's chunk
holds about as many tokens. Two planners, two objectives, and neither sees the other: the
ranks' micro-batch counts are equalised afterwards (an all-reduce of the maximum), groups
(the responses of one prompt) are split wherever the partition puts them, and under FSDP
the step lasts the sum over micro-batches of the slowest rank's micro-batch, which neither
planner minimises. ``plan_micro_batches`` below replaces both with one call on the global
batch, made identically on every rank (it is deterministic):

    - micro_batches, indices = rearrange_micro_batches(batch=data.batch, max_token_len=L)
    + micro_batches, indices, weights = plan_micro_batches(global_batch, L, world, rank)

``weights[k]`` multiplies micro-batch ``k``'s *mean* loss (over its response tokens): summed
over the rank's micro-batches and averaged over the ranks (what FSDP's gradient reduction
does), the update is the gradient of the mean over every response token of the global batch,
which verl's ``loss_scale_factor = len(micro_batch) / ppo_mini_batch_size`` is not.

    python examples/recipes/verl_dynamic_batch.py

prints, for a synthetic GRPO batch (8 responses per prompt, lognormal lengths), each rank's
micro-batches and the plan's figures. Paste ``plan_micro_batches`` (and ``_take``) into the
worker; ``batch`` is a ``TensorDict`` (``DataProto.batch``) or a plain ``dict`` of tensors.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    import chronica
except ModuleNotFoundError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import chronica


def _take(batch: Any, index: np.ndarray) -> Any:
    """The rows ``index`` of every tensor of ``batch`` (a dict of tensors or a TensorDict)."""
    rows = torch.from_numpy(index)
    if isinstance(batch, Mapping):
        return {key: value[rows] for key, value in batch.items()}
    return batch[rows]


def plan_micro_batches(
    batch: Any,
    max_token_len: int,
    world_size: int,
    rank: int,
    *,
    uid: Any = None,
    loss_mask_key: str = "response_mask",
    balance: str = "micro",
    min_num_micro_batch: int | None = None,
    num_batches_divided_by: int = 1,
    cost: Any = "linear",
) -> tuple[list[Any], list[list[int]], np.ndarray]:
    """This rank's micro-batches of the global ``batch``, planned for every rank at once.

    Guarantees (wherever the batch has at least ``world_size`` prompts, or sequences when
    ``uid`` is ``None``): every rank gets the same number of micro-batches, none empty; no
    micro-batch holds more than ``max_token_len`` real tokens (``attention_mask``'s ones);
    the sequences of one ``uid`` share a rank and a micro-batch; every sequence is on
    exactly one rank once. Every rank calling it with the same batch gets its part of one
    plan, so no all-reduce of the micro-batch count is needed.

    Args:
        batch: the step's global batch, ``(B, S)`` tensors including ``attention_mask``.
        max_token_len: the most real tokens in one micro-batch (verl's
            ``ppo_max_token_len_per_gpu``).
        world_size: the data-parallel ranks.
        rank: this rank.
        uid: a group id per sequence (GRPO's ``non_tensor_batch["uid"]``: strings or
            integers); the responses of one prompt stay together. ``None``: no groups.
        loss_mask_key: the ``(B, S)`` mask of the tokens that carry loss; the weights
            normalise by its count. Without that key, by ``attention_mask``'s.
        balance: ``"micro"`` (FSDP, ZeRO-3, Megatron: ranks move micro-batch by
            micro-batch) or ``"rank"`` (DDP-style: one synchronisation per step).
        min_num_micro_batch: the fewest micro-batches per rank (verl's argument of the
            same name).
        num_batches_divided_by: the count per rank is a multiple of it (verl's argument of
            the same name: Megatron's virtual pipeline size).
        cost: how a sequence's length predicts its time: ``"linear"``, ``"quadratic"`` or a
            ``chronica.CostModel``.

    Returns:
        ``(micro_batches, indices, weights)``: the micro-batches (``_take`` of ``batch``),
        their sequences' indices into the global batch (verl's ``micro_bsz_idx``), and the
        weight of each micro-batch's mean loss.

    Example::

        >>> mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
        >>> batch = {"attention_mask": mask, "input_ids": torch.arange(16).view(4, 4)}
        >>> micro, indices, weights = plan_micro_batches(batch, 4, world_size=2, rank=0)
        >>> indices, weights.tolist()
        ([[2], [1]], [0.8, 0.4])
    """
    lengths = batch["attention_mask"].sum(-1).cpu().numpy()
    carried = batch[loss_mask_key] if loss_mask_key in batch.keys() else None
    loss_tokens = None if carried is None else carried.sum(-1).cpu().numpy()
    groups = None if uid is None else np.unique(np.asarray(uid), return_inverse=True)[1]
    packing = chronica.Packing(
        max_tokens=max_token_len,
        micro_batches=min_num_micro_batch,
        micro_batch_multiple=num_batches_divided_by,
        balance=balance,
        loss="token" if loss_tokens is None else "loss_token",
    )
    plan = chronica.plan_step(
        lengths, world_size, packing, groups=groups, loss_tokens=loss_tokens, cost=cost
    )
    indices = plan.micro_batches(rank)
    return (
        [_take(batch, index) for index in indices],
        [index.tolist() for index in indices],
        plan.loss_weights(rank),
    )


def grpo_batch(prompts: int, responses: int, width: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    """A synthetic GRPO global batch: ``prompts`` prompts of ``responses`` responses each,
    right-padded to ``width``; the prompt part of every sequence carries no loss. Returns
    ``(batch, uid)``."""
    rng = np.random.default_rng(seed)
    n = prompts * responses
    prompt = np.repeat(rng.integers(8, width // 4, prompts), responses)
    response = np.clip(rng.lognormal(5.0, 1.0, n).astype(np.int64), 1, width - prompt)
    position = torch.arange(width)
    attention = (position < torch.from_numpy(prompt + response)[:, None]).long()
    loss_mask = attention * (position >= torch.from_numpy(prompt)[:, None]).long()
    batch = {
        "input_ids": torch.from_numpy(rng.integers(1, 1000, (n, width))) * attention,
        "attention_mask": attention,
        "response_mask": loss_mask,
    }
    uid = np.repeat([f"prompt-{p}" for p in range(prompts)], responses)
    return batch, uid


def main() -> None:
    world, max_token_len = 4, 8192
    batch, uid = grpo_batch(prompts=16, responses=8, width=1024)
    for rank in range(world):
        micro, _, weights = plan_micro_batches(batch, max_token_len, world, rank, uid=uid)
        tokens = [int(m["attention_mask"].sum()) for m in micro]
        print(
            f"rank {rank}: {len(micro)} micro-batches, tokens {tokens},",
            f"weights {np.round(weights, 3).tolist()}",
        )
    lengths = batch["attention_mask"].sum(-1).numpy()
    groups = np.unique(uid, return_inverse=True)[1]
    for balance in ("rank", "micro"):
        packing = chronica.Packing(max_tokens=max_token_len, balance=balance)
        plan = chronica.plan_step(lengths, world, packing, groups=groups)
        print(f"balance={balance!r}: {plan}")


if __name__ == "__main__":
    main()
