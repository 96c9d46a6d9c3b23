"""A tiny Llama-style decoder that trains on packed documents, for timing micro-batches.

One micro-batch is a flat run of tokens: the documents of the micro-batch one after the
other, positions restarting at every document and ``cu_seqlens`` marking where each starts,
as flash-attention's variable-length kernels take them (no padding, no attention across
documents). The blocks are Llama's: RMSNorm, rotary positions, causal self-attention,
a SwiGLU feed-forward, tied nothing.

The attention kernel is chosen once, by ``pick_attention``:

``varlen``
    ``torch.nn.attention.varlen.varlen_attn`` (flash attention over ``cu_seqlens``), on a
    CUDA device where it runs forward and backward and matches the per-document reference.
``sdpa``
    ``torch.nn.functional.scaled_dot_product_attention`` once per document (causal): the
    reference, and the kernel on a CPU.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LlamaConfig",
    "PackedBatch",
    "TinyLlama",
    "packed_batch",
    "parameters_millions",
    "pick_attention",
    "sdpa_per_document",
]

# (q, k, v as (tokens, heads, head_dim), cu_seqlens int32, longest document) -> like q
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class LlamaConfig:
    """The model's shape.

    Args:
        vocab: vocabulary size (the output projection's width).
        hidden: model width.
        layers: decoder blocks.
        heads: attention heads (``hidden`` must be a multiple).
        ffn: the SwiGLU feed-forward's inner width.
        rope_theta: the rotary embedding's base.
    """

    vocab: int = 32000
    hidden: int = 1024
    layers: int = 8
    heads: int = 16
    ffn: int = 2816
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class PackedBatch:
    """One packed micro-batch on a device: ``tokens`` and ``labels`` (flat), the
    ``positions`` restarting at each document, ``cu_seqlens`` (int32, documents + 1) and
    the longest document."""

    tokens: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    longest: int


def packed_batch(lengths: np.ndarray, vocab: int, device: torch.device, seed: int) -> PackedBatch:
    """Random tokens for documents of ``lengths`` packed into one micro-batch.

    Args:
        lengths: the documents' token counts (positive).
        vocab: the vocabulary the tokens are drawn from.
        device: where the tensors live.
        seed: seeds the tokens (the times must not depend on them, but runs stay equal).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (total + 1,), generator=generator)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    positions = np.arange(total) - np.repeat(starts[:-1], lengths)
    return PackedBatch(
        tokens=tokens[:-1].to(device),
        labels=tokens[1:].to(device),
        positions=torch.from_numpy(positions).to(device),
        cu_seqlens=torch.from_numpy(starts.astype(np.int32)).to(device),
        longest=int(lengths.max()),
    )


def sdpa_per_document(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, longest: int
) -> torch.Tensor:
    """Causal attention within each document, one ``scaled_dot_product_attention`` call per
    document (the reference the variable-length kernel is checked against)."""
    bounds = cu_seqlens.tolist()
    parts = []
    for start, end in itertools.pairwise(bounds):
        # (tokens, heads, dim) -> (1, heads, tokens, dim)
        one_q, one_k, one_v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(one_q, one_k, one_v, is_causal=True)
        parts.append(attended[0].transpose(0, 1))
    return torch.cat(parts)


def _varlen() -> Attention:
    from torch.nn.attention.varlen import varlen_attn

    causal = (
        {"is_causal": True}
        if "is_causal" in inspect.signature(varlen_attn).parameters
        else {"window_size": (-1, 0)}
    )

    def attend(q, k, v, cu_seqlens, longest):
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, longest, longest, **causal)

    return attend


def pick_attention(device: torch.device, dtype: torch.dtype) -> tuple[str, Attention, str]:
    """``(name, kernel, why)``: the variable-length flash kernel where it runs on
    ``device`` and agrees with the per-document reference (forward and gradients), else the
    reference itself, with the reason."""
    if device.type != "cuda":
        return "sdpa", sdpa_per_document, "not a CUDA device"
    try:
        attend = _varlen()
    except ImportError as error:
        return "sdpa", sdpa_per_document, f"no varlen_attn in torch {torch.__version__}: {error}"
    generator = torch.Generator().manual_seed(0)
    shape = (96, 4, 64)
    cu = torch.tensor([0, 17, 60, 96], dtype=torch.int32, device=device)
    inputs = [torch.randn(shape, generator=generator).to(device, dtype) for _ in range(3)]
    outputs = []
    kernels: tuple[Attention, ...] = (attend, sdpa_per_document)
    for kernel in kernels:
        leaves = [x.clone().requires_grad_() for x in inputs]
        try:
            out = kernel(leaves[0], leaves[1], leaves[2], cu, 43)
            out.float().square().sum().backward()
        except Exception as error:  # any failure means: use the reference
            return "sdpa", sdpa_per_document, f"varlen_attn failed: {type(error).__name__}: {error}"
        outputs.append([out.detach().float(), *(x.grad.float() for x in leaves)])
    worst = max(float((a - b).abs().max()) for a, b in zip(*outputs, strict=True))
    if worst > 0.1:
        return "sdpa", sdpa_per_document, f"varlen_attn differs from the reference by {worst:.3g}"
    return "varlen", attend, f"varlen_attn matches the reference within {worst:.3g}"


class _Block(nn.Module):
    def __init__(self, config: LlamaConfig, attend: Attention) -> None:
        super().__init__()
        width = config.hidden
        self.heads, self.attend = config.heads, attend
        self.attn_norm = nn.RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.ffn_norm = nn.RMSNorm(width)
        self.gate_up = nn.Linear(width, 2 * config.ffn, bias=False)
        self.down = nn.Linear(config.ffn, width, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: PackedBatch):
        q, k, v = self.qkv(self.attn_norm(x)).view(x.shape[0], 3, self.heads, -1).unbind(1)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        x = x + self.out(self.attend(q, k, v, batch.cu_seqlens, batch.longest).flatten(1))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class TinyLlama(nn.Module):
    """The decoder; ``forward(batch)`` returns the mean next-token loss of the packed
    micro-batch.

    Args:
        config: the shape.
        attend: the attention kernel (``pick_attention``).
    """

    def __init__(self, config: LlamaConfig, attend: Attention) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(_Block(config, attend) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)
        half = config.head_dim // 2
        inverse = config.rope_theta ** (-torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("inverse_frequency", inverse, persistent=False)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        angles = batch.positions.float()[:, None] * self.inverse_frequency[None]
        rope = (
            angles.cos()[:, None].to(self.head.weight.dtype),
            angles.sin()[:, None].to(self.head.weight.dtype),
        )
        x = self.embed(batch.tokens)
        for block in self.blocks:
            x = block(x, rope, batch)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float(), batch.labels)

    def __repr__(self) -> str:
        return f"TinyLlama({self.config})"


def parameters_millions(model: nn.Module) -> float:
    """The model's parameter count, in millions."""
    return sum(p.numel() for p in model.parameters()) / 1e6
