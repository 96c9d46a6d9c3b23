"""The demo's data set and model: packed variable-length sequences, no padding (imports torch)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset as TorchDataset

__all__ = ["PackedBatch", "PackedClassifier", "PackedTokens", "collate_packed"]


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
        signal: float = 0.5,
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
    """Single-head self-attention inside each packed sequence: cost grows with length².

    Each sequence goes to ``scaled_dot_product_attention`` as a ``(1, 1, length, dim)``
    tensor, which takes torch's fused CPU kernel (flash attention): it works in tiles that
    stay in the processor's cache and never allocates a length x length matrix, so its time
    follows length² closely, without the page faults and memory traffic that make the
    unfused path's time vary from step to step on a shared machine.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        parts = [
            F.scaled_dot_product_attention(qs[None, None], ks[None, None], vs[None, None])[0, 0]
            for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
        ]
        return self.out(torch.cat(parts))


class PackedClassifier(nn.Module):
    """Embedding → residual per-token MLP (→ optional per-sequence attention) → mean-pool per
    sequence (``index_add``) → linear classifier. Works on a ``PackedBatch``'s flat tokens, so
    its compute is proportional to the batch's token count (plus Σ length² with attention).

    The per-token layers take ``chunk`` tokens at a time: their large tensors then have the
    same shape whatever the batch, so the C allocator reuses freed blocks instead of growing
    the heap and faulting in fresh pages (slow on some virtual machines), which would make a
    large batch cost more per token than a small one.
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
            x = torch.cat(
                [
                    self._tokens(tokens[start : start + self.chunk])
                    for start in range(0, tokens.numel(), self.chunk)
                ]
            )
            x = x + self.attention(x, lengths.tolist())
            pooled = pooled.index_add(0, segments, x)
        else:
            for start in range(0, tokens.numel(), self.chunk):
                part = slice(start, start + self.chunk)
                pooled = pooled.index_add(0, segments[part], self._tokens(tokens[part]))
        return self.head(pooled / lengths[:, None].to(pooled.dtype))
