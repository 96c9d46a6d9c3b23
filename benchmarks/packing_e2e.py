"""End-to-end packing benchmark: a small transformer trained by 2 processes on packed documents.

Two processes (``torch.distributed``, gloo on 127.0.0.1, one CPU thread each) train a small
decoder-only transformer with DDP and gradient accumulation (``no_sync`` on every micro-batch
but a step's last) on the same documents, from the same initialisation, three ways:

``chronica``
    ``DistributedBatchSampler(..., sizes=lengths, packing=Packing(max_tokens,
    tokens_per_step=...))`` with ``PackedDataset`` and ``collate_packed``: each step's
    documents are packed into the same number of micro-batches on every rank, balanced by
    predicted cost (chronica's default cost model: tokens).
``firstfit``
    The same steps (chronica's epoch order cut by the same token budget), each step's
    documents in epoch order into the first micro-batch of ``max_tokens`` they fit in,
    micro-batches dealt to the ranks round-robin, the rank with fewer given empty ones:
    packing without balancing. Same flat layout and collate function as chronica.
``padding``
    The same steps, torch ``DistributedSampler``'s strided split (rank ``r`` takes the step's
    documents ``r, r + W, ...``: counts equal, or one apart when the step's count is odd),
    each rank's documents in order into micro-batches of as many as fit when padded to the
    longest (count × longest ≤ ``max_tokens``), counts equalised by empty micro-batches.

Attention is per document in every method: SDPA with a block-diagonal causal mask built from
``segment_ids`` (a padded row is one segment, its padding after the real tokens). Queries are
taken in chunks of ``CHUNK`` tokens, each against the keys from the start of its first
token's document (a block-sparse kernel's skipping), so that attention costs about the sum of
the documents' squared lengths rather than the micro-batch's. The loss is next-token cross
entropy within each document (its last token predicts an end-of-document token), every
micro-batch's summed token loss times ``loss_weight / num_tokens`` (chronica's weight; the
baselines' from ``chronica.core.packing.micro_weights``): every method's update is the
gradient of the step's mean token loss, so the loss curves differ by float rounding only.

Measured per method: real tokens per second (global tokens of a step over its wall time,
median over the steps after ``WARMUP_STEPS`` and over repeats; and over the CPU seconds of
the step's slowest rank's compute, which other processes on a shared machine do not
stretch), each method's ratio to the baselines step by step; per-step rank balance
(max/mean over ranks of each rank's own compute: the CPU time of its training thread,
``time.thread_time``, over the forward and backward passes of its micro-batches, which
excludes waiting for the other rank in the all-reduce and gloo's own threads); the predicted
balance of the same steps (max/mean of the rank loads the plan predicts: tokens, padded
tokens for padding); and the per-step global mean token loss. The methods' steps run
interleaved (step 1 of chronica, of first fit, of padding, step 2 of chronica, ...), each
method with its own model, so the machine's noise hits all alike; one repeat per model seed,
so the repeats measure seed noise.

    python -m benchmarks --only packing_e2e [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import packing_peers as peers
from chronica import Packing
from chronica.core.packing import micro_weights, step_starts
from chronica.core.shuffle import epoch_order
from chronica.torch.utils.data import (
    DistributedBatchSampler,
    PackedDataset,
    PackedIndex,
    collate_packed,
)

__all__ = [
    "METHODS",
    "Settings",
    "TinyLM",
    "attention_spans",
    "collate_padded",
    "document_attention",
    "document_lengths",
    "document_mask",
    "first_fit",
    "format_table",
    "method_batches",
    "padded",
    "render_markdown",
    "run",
]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPRODUCE = "python -m benchmarks --only packing_e2e"

METHODS = {
    "chronica": "chronica Packing (balanced)",
    "firstfit": "first fit, epoch order, round-robin",
    "padding": "padding to the longest",
}
BASELINE = "firstfit"
STYLE = {"chronica": "tab:blue", "firstfit": "tab:purple", "padding": "tab:red"}
SHORT = {"chronica": "chronica", "firstfit": "first fit", "padding": "padding"}
DASH = {"chronica": "-", "firstfit": "--", "padding": ":"}

WORLD = 2
VOCAB = 256
EOS = 0  # the end-of-document token; documents use 1 .. VOCAB - 1
HIDDEN = 128
HEADS = 4
LAYERS = 2
MAX_TOKENS = 512
TOKENS_PER_STEP = 4096
CHUNK = 128
LR = 3e-3
DATA_SEED = 2025
LENGTH_MU, LENGTH_SIGMA, MIN_LENGTH = 4.5, 1.0, 8
NOISE = 0.1  # share of a document's tokens replaced by random ones
WARMUP_STEPS = 3
IGNORE = -100


@dataclass(frozen=True)
class Settings:
    """One run: ``steps`` training steps per (method, seed), ``repeats`` seeds."""

    steps: int
    repeats: int
    max_tokens: int = MAX_TOKENS
    tokens_per_step: int = TOKENS_PER_STEP
    world: int = WORLD
    hidden: int = HIDDEN
    chunk: int = CHUNK

    @property
    def num_documents(self) -> int:
        """Documents in the data set: more than ``steps`` steps of the token budget need
        (document lengths average about 135 tokens)."""
        return (self.steps + 2) * self.tokens_per_step // 100

    @property
    def packing(self) -> Packing:
        return Packing(self.max_tokens, tokens_per_step=self.tokens_per_step)


QUICK = Settings(steps=16, repeats=2)
FULL = Settings(steps=40, repeats=5)


# -- data -------------------------------------------------------------------------------------


def document_lengths(n: int, max_tokens: int = MAX_TOKENS, seed: int = DATA_SEED) -> np.ndarray:
    """``n`` long-tailed token counts: lognormal(4.5, 1) rounded, clipped to [8, max_tokens]."""
    rng = np.random.default_rng(seed)
    raw = np.rint(rng.lognormal(LENGTH_MU, LENGTH_SIGMA, n))
    return np.clip(raw, MIN_LENGTH, max_tokens).astype(np.int64)


class Documents(torch.utils.data.Dataset):
    """Token ids of every document: a noisy arithmetic sequence modulo ``VOCAB - 1`` (start
    and stride 1..7 drawn per document, ``NOISE`` of the tokens replaced by random ones), in
    1 .. ``VOCAB - 1``. A model learns the stride from the context, so the loss falls."""

    def __init__(self, lengths: np.ndarray, seed: int = DATA_SEED) -> None:
        self.docs = []
        for i, length in enumerate(np.asarray(lengths).tolist()):
            rng = np.random.default_rng([seed, i])
            start, stride = rng.integers(0, VOCAB - 1), rng.integers(1, 8)
            tokens = (start + stride * np.arange(length)) % (VOCAB - 1)
            noisy = rng.random(length) < NOISE
            tokens[noisy] = rng.integers(0, VOCAB - 1, int(noisy.sum()))
            self.docs.append(torch.from_numpy(tokens + 1))

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.docs[index]


# -- the model: per-document attention --------------------------------------------------------


def document_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """The block-diagonal causal mask of ``segment_ids`` (``(..., T)``, one id per document,
    a document's tokens contiguous): ``(..., T, T)``, true where query ``i`` may attend key
    ``j``: the same document and ``j <= i``."""
    t = segment_ids.shape[-1]
    idx = torch.arange(t, device=segment_ids.device)
    same = segment_ids[..., :, None] == segment_ids[..., None, :]
    return same & (idx[None, :] <= idx[:, None])


def attention_spans(segment_ids: torch.Tensor, chunk: int) -> list[tuple[int, int, int]]:
    """``(query start, query end, key start)`` of every chunk of ``chunk`` queries of
    ``segment_ids`` (``(B, T)``): a chunk's keys start where its first query's document
    starts (the earliest over the rows), since nothing before can be attended."""
    b, t = segment_ids.shape
    if t <= chunk:
        return [(0, t, 0)]
    idx = torch.arange(t).expand(b, t)
    new = torch.ones_like(segment_ids, dtype=torch.bool)
    new[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=1).values
    return [(qs, min(t, qs + chunk), int(first[:, qs].min())) for qs in range(0, t, chunk)]


def attention_plan(
    segment_ids: torch.Tensor, chunk: int
) -> list[tuple[int, int, int, torch.Tensor]]:
    """Every chunk's span and its slice of ``document_mask`` (``(B, 1, q, k)``), built once
    per forward pass and shared by the layers."""
    out = []
    for qs, qe, ks in attention_spans(segment_ids, chunk):
        q_ids, k_ids = segment_ids[:, qs:qe], segment_ids[:, ks:qe]
        causal = torch.arange(ks, qe)[None, :] <= torch.arange(qs, qe)[:, None]
        mask = (q_ids[:, :, None] == k_ids[:, None, :]) & causal
        out.append((qs, qe, ks, mask[:, None]))
    return out


def attention_area(segment_ids: torch.Tensor, chunk: int) -> int:
    """Query-key pairs the chunked attention computes per head and layer (its cost)."""
    b = segment_ids.shape[0]
    return sum(b * (qe - qs) * (qe - ks) for qs, qe, ks in attention_spans(segment_ids, chunk))


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segment_ids: torch.Tensor,
    chunk: int = CHUNK,
    plan: list[tuple[int, int, int, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """SDPA of ``q, k, v`` (``(B, H, T, D)``) under ``document_mask(segment_ids)``, query
    chunk by query chunk over the keys each chunk can see (``attention_plan``)."""
    plan = attention_plan(segment_ids, chunk) if plan is None else plan
    parts = [
        F.scaled_dot_product_attention(
            q[:, :, qs:qe], k[:, :, ks:qe], v[:, :, ks:qe], attn_mask=mask
        )
        for qs, qe, ks, mask in plan
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


class Block(nn.Module):
    """Pre-norm transformer layer: per-document attention, then a 4× MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor, segment_ids: torch.Tensor, plan: list) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = document_attention(q, k, v, segment_ids, plan=plan)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Decoder-only transformer over ``(B, T)`` token ids with per-token positions (restarting
    in every document) and segment ids (documents attend only within themselves)."""

    def __init__(
        self,
        vocab: int = VOCAB,
        hidden: int = HIDDEN,
        heads: int = HEADS,
        layers: int = LAYERS,
        max_len: int = MAX_TOKENS,
        chunk: int = CHUNK,
    ) -> None:
        super().__init__()
        self.chunk = chunk
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, segment_ids: torch.Tensor
    ) -> torch.Tensor:
        plan = attention_plan(segment_ids, self.chunk)
        x = self.tokens(input_ids) + self.positions(position_ids)
        for block in self.blocks:
            x = block(x, segment_ids, plan)
        return self.head(self.norm(x))


def packed_targets(input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Next-token targets of a flat packed micro-batch: the next token of the same document,
    ``EOS`` at each document's last token."""
    targets = torch.full_like(input_ids, EOS)
    if input_ids.shape[0] > 1:
        same = segment_ids[1:] == segment_ids[:-1]
        targets[:-1] = torch.where(same, input_ids[1:], targets[:-1])
    return targets


# -- the baselines ----------------------------------------------------------------------------


def first_fit(lengths: np.ndarray, num_replicas: int, max_tokens: int) -> peers.MicroBatches:
    """The step's documents in epoch order, each into the first micro-batch of ``max_tokens``
    it fits in, micro-batches dealt round-robin; ranks with fewer get empty ones."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    where, bins = peers._first_fit(lengths, np.arange(lengths.shape[0]), max_tokens)
    m = max(1, -(-bins // num_replicas))
    return peers.MicroBatches(
        where % num_replicas, where // num_replicas, m, lengths.astype(np.float64)
    )


def padded(lengths: np.ndarray, num_replicas: int, max_tokens: int) -> peers.MicroBatches:
    """DistributedSampler's strided split, micro-batches of as many documents as fit padded
    to the longest (``benchmarks/packing_peers.py``'s ``padding``)."""
    return peers.padding(lengths, num_replicas, max_tokens)


def method_batches(
    method: str, steps: list[np.ndarray], lengths: np.ndarray, settings: Settings, rank: int
) -> list[list[PackedIndex]]:
    """Rank ``rank``'s micro-batches for a baseline over the given steps' documents (epoch
    order), as ``PackedIndex`` lists (an empty micro-batch: one zero-length entry), for
    ``collate_packed`` (first fit) or ``collate_padded`` (padding)."""
    plan = first_fit if method == "firstfit" else padded
    out = []
    w = settings.world
    for s, docs in enumerate(steps):
        mb = plan(lengths[docs], w, settings.max_tokens)
        slot = mb.rank * mb.num_micro + mb.micro
        tokens = np.bincount(slot, weights=lengths[docs], minlength=w * mb.num_micro)
        count = np.bincount(slot, minlength=w * mb.num_micro)
        weights = micro_weights(tokens, count, w, "token")
        for j in range(mb.num_micro):
            here = np.flatnonzero(slot == rank * mb.num_micro + j)
            weight = float(weights[rank * mb.num_micro + j])
            meta = (s, j, mb.num_micro, weight)
            if here.shape[0] == 0:
                out.append([PackedIndex(0, 0, 0, 0, *meta)])
            else:
                out.append(
                    [PackedIndex(int(docs[i]), 0, int(lengths[docs[i]]), 0, *meta) for i in here]
                )
    return out


def collate_padded(items: list[tuple[torch.Tensor, PackedIndex]]) -> dict[str, Any]:
    """A padded micro-batch: ``input_ids``, ``position_ids``, ``segment_ids`` (0) and
    ``targets`` (``IGNORE`` on padding) of shape ``(documents, longest)``, plus what
    ``collate_packed`` says of the micro-batch's place in the step."""
    docs = [(item, index) for item, index in items if index.length > 0]
    head = items[0][1]
    longest = max((index.length for _, index in docs), default=0)
    b = len(docs)
    input_ids = torch.zeros((b, longest), dtype=torch.int64)
    targets = torch.full((b, longest), IGNORE, dtype=torch.int64)
    for row, (item, index) in enumerate(docs):
        n = index.length
        input_ids[row, :n] = item[:n]
        targets[row, : n - 1] = item[1:n]
        targets[row, n - 1] = EOS
    return {
        "input_ids": input_ids,
        "position_ids": torch.arange(longest).expand(b, longest),
        "segment_ids": torch.zeros((b, longest), dtype=torch.int64),
        "targets": targets,
        "num_tokens": sum(index.length for _, index in docs),
        "loss_weight": float(head.loss_weight),
        "step": head.step,
        "micro": head.micro,
        "num_micro": head.num_micro,
        "last": head.micro == head.num_micro - 1,
    }


# -- plans shared by the parent and the ranks -------------------------------------------------


def chronica_sampler(
    dataset: Any, lengths: np.ndarray, settings: Settings, rank: int | None = None
) -> DistributedBatchSampler:
    """chronica's packed sampler (the world from ``torch.distributed`` when ``rank`` is
    None), epoch 0 planned."""
    world = None if rank is None else settings.world
    sampler = DistributedBatchSampler(
        dataset,
        None,
        num_replicas=world,
        rank=rank,
        seed=DATA_SEED,
        drop_last=True,
        sizes=lengths,
        packing=settings.packing,
    )
    sampler.set_epoch(0)
    return sampler


def epoch_steps(
    sampler: DistributedBatchSampler, lengths: np.ndarray, steps: int
) -> list[np.ndarray]:
    """The first ``steps`` steps' documents in epoch order: chronica's epoch order cut by the
    token budget as chronica cuts it. Checked against the sampler's plan, so that every
    method trains the same documents in every step."""
    config = sampler.scheduler.config
    assert config.packing is not None
    order = epoch_order(config.shuffle, lengths.shape[0], config.seed, 0, None)
    cuts = step_starts(lengths[order], None, config.packing.tokens_per_step)
    plan = sampler.plan(0)
    if plan.num_steps < steps:
        raise ValueError(f"the epoch has {plan.num_steps} steps, fewer than {steps}")
    out = []
    for s in range(steps):
        docs = order[cuts[s] : cuts[s + 1]]
        planned = plan.indices[plan.bounds[s, 0] : plan.bounds[s, -1]]
        if not np.array_equal(np.sort(docs), np.sort(planned)):
            raise AssertionError(f"step {s}: chronica's documents differ from the epoch order's")
        out.append(docs)
    return out


def predicted(settings: Settings) -> dict[str, Any]:
    """Every method's predicted per-step rank loads (tokens; padded tokens for padding),
    micro-batches per rank and padding share, and chronica's plan statistics."""
    lengths = document_lengths(settings.num_documents, settings.max_tokens)
    sampler = chronica_sampler(range(lengths.shape[0]), lengths, settings, rank=0)
    steps = epoch_steps(sampler, lengths, settings.steps)
    plan, stats = sampler.plan(0), sampler.stats(0)
    out: dict[str, Any] = {}
    micro = plan.micro
    assert micro is not None
    chronica_loads = np.asarray(plan.loads[: settings.steps], dtype=np.float64)
    step_tokens = np.array([lengths[d].sum() for d in steps], dtype=np.float64)
    assert np.allclose(chronica_loads.sum(axis=1), step_tokens), "plan loads are not tokens"
    out["chronica"] = {
        "loads": chronica_loads.tolist(),
        "num_micro": micro.num_micro[: settings.steps].tolist(),
        "padding_share": 0.0,
    }
    for method in ("firstfit", "padding"):
        plan_of = first_fit if method == "firstfit" else padded
        loads, counts, pad, used = [], [], 0.0, 0.0
        for docs in steps:
            mb = plan_of(lengths[docs], settings.world, settings.max_tokens)
            loads.append(np.bincount(mb.rank, weights=mb.padded, minlength=settings.world))
            counts.append(mb.num_micro)
            pad += float(mb.padded.sum())
            used += float(lengths[docs].sum())
        out[method] = {
            "loads": np.asarray(loads).tolist(),
            "num_micro": counts,
            "padding_share": 1.0 - used / pad,
        }
    for record in out.values():
        rank_loads = np.asarray(record["loads"])
        record["ratio"] = (rank_loads.max(axis=1) / rank_loads.mean(axis=1)).tolist()
    return {
        "methods": out,
        "tokens": [int(lengths[d].sum()) for d in steps],
        "documents": [int(d.shape[0]) for d in steps],
        "plan_stats": {
            "load_ratio_mean": stats.load_ratio_mean,
            "load_ratio_worst": stats.load_ratio_worst,
            "bound_mean": stats.bound_mean,
            "num_steps": stats.num_steps,
        },
    }


# -- one rank ---------------------------------------------------------------------------------


class _QuietBatchSize(logging.Filter):
    """Drops the sampler's "batch_size was not given" warning, which a packed sampler with
    ``tokens_per_step`` logs although it balances (reported; repeated once per run here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "batch_size (the global batch) was not given" not in record.getMessage()


def _inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """``(input_ids, position_ids, segment_ids, targets)`` as ``(B, T)`` tensors."""
    if "targets" in batch:  # padded
        return batch["input_ids"], batch["position_ids"], batch["segment_ids"], batch["targets"]
    ids, seg = batch["input_ids"], batch["segment_ids"]
    return ids[None], batch["position_ids"][None], seg[None], packed_targets(ids, seg)[None]


class _Run:
    """One method's training on this rank: a fresh model (seed ``seed``) under DDP, Adam,
    and the method's micro-batch iterator; ``step()`` trains one step and records its wall
    seconds, this rank's compute CPU seconds, token loss sum, real tokens, non-empty
    micro-batches, token slots (padding included) and attention area."""

    KEYS = ("wall", "cpu", "loss", "tokens", "micro", "slots", "area")

    def __init__(self, loader: Any, seed: int, settings: Settings) -> None:
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(seed)
        self.model = TinyLM(
            hidden=settings.hidden, max_len=settings.max_tokens, chunk=settings.chunk
        )
        self.ddp = DistributedDataParallel(self.model)  # rank 0's parameters everywhere
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.batches = iter(loader)
        self.chunk = settings.chunk
        self.record: dict[str, list] = {key: [] for key in self.KEYS}

    def step(self) -> None:
        totals = dict.fromkeys(self.KEYS, 0.0)
        dummy = torch.zeros((1, 1), dtype=torch.int64)
        start_step = time.perf_counter()
        while True:
            batch = next(self.batches)
            empty = batch["num_tokens"] == 0
            if empty and not batch["last"]:
                continue  # nothing to compute; the step's last micro-batch synchronises
            ids, pos, seg, targets = (dummy,) * 4 if empty else _inputs(batch)
            sync = contextlib.nullcontext() if batch["last"] else self.ddp.no_sync()
            start = time.thread_time()
            with sync:
                logits = self.ddp(ids, pos, seg)
                if empty:  # takes part in the all-reduce with zero gradients
                    loss = logits.sum() * 0.0
                else:
                    token_loss = F.cross_entropy(
                        logits.view(-1, VOCAB),
                        targets.view(-1),
                        ignore_index=IGNORE,
                        reduction="sum",
                    )
                    loss = token_loss * (batch["loss_weight"] / batch["num_tokens"])
                loss.backward()
            totals["cpu"] += time.thread_time() - start
            if not empty:
                totals["loss"] += token_loss.item()
                totals["tokens"] += batch["num_tokens"]
                totals["micro"] += 1
                totals["slots"] += ids.numel()
                totals["area"] += attention_area(seg, self.chunk)
            if batch["last"]:
                break
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals["wall"] = time.perf_counter() - start_step
        for key in self.KEYS:
            self.record[key].append(totals[key])


def _worker(rank: int, port: int, config_path: str, out_path: str) -> int:
    import torch.distributed as dist

    logging.getLogger("chronica").addFilter(_QuietBatchSize())
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    settings = Settings(**json.loads(Path(config_path).read_text()))
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=settings.world, timeout=timedelta(seconds=300)
    )
    try:
        lengths = document_lengths(settings.num_documents, settings.max_tokens)
        documents = Documents(lengths)
        steps = epoch_steps(chronica_sampler(documents, lengths, settings), lengths, settings.steps)
        baseline = {
            m: method_batches(m, steps, lengths, settings, rank) for m in ("firstfit", "padding")
        }
        # One untimed step of each layout loads the kernels before anything is measured.
        for method in baseline:
            _Run(_loader(method, documents, lengths, settings, baseline), 0, settings).step()
        runs = []
        for repeat in range(settings.repeats):
            # Every method from the same initialisation; their steps interleaved (A B C A B
            # C ...) so that the machine's noise falls on all of them alike.
            trainings = {
                method: _Run(
                    _loader(method, documents, lengths, settings, baseline), repeat, settings
                )
                for method in METHODS
            }
            dist.barrier()
            for _ in range(settings.steps):
                for training in trainings.values():
                    training.step()
            runs += [
                {"repeat": repeat, "method": method, **training.record}
                for method, training in trainings.items()
            ]
        gathered: list[Any] = [None] * settings.world
        dist.all_gather_object(gathered, runs)
        if rank == 0:
            tmp = Path(out_path).with_suffix(".tmp")
            tmp.write_text(json.dumps(gathered))
            tmp.replace(out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _loader(
    method: str, documents: Documents, lengths: np.ndarray, settings: Settings, baseline: dict
) -> torch.utils.data.DataLoader:
    """The method's DataLoader for this rank (chronica's sampler is fresh every run)."""
    if method == "chronica":
        sampler: Any = chronica_sampler(documents, lengths, settings)
        collate: Any = collate_packed
    else:
        sampler = baseline[method]
        collate = collate_packed if method == "firstfit" else collate_padded
    return torch.utils.data.DataLoader(
        PackedDataset(documents), batch_sampler=sampler, collate_fn=collate
    )


def _launch(settings: Settings, timeout_s: float) -> list[list[dict]]:
    """Run the two ranks; every rank's runs (rank, then run)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MALLOC_TRIM_THRESHOLD_": str(1 << 36),
        "MALLOC_MMAP_THRESHOLD_": str(1 << 25),
    }
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on 127.0.0.1
    with tempfile.TemporaryDirectory(prefix="chronica-packing-e2e-") as tmp:
        config, out = Path(tmp) / "config.json", Path(tmp) / "runs.json"
        config.write_text(json.dumps(asdict(settings)))
        procs = []
        try:
            for rank in range(settings.world):
                cmd = [sys.executable, "-m", "benchmarks.packing_e2e", "--worker", str(rank)]
                cmd += [str(store.port), str(config), str(out)]
                procs.append(subprocess.Popen(cmd, env=env))
            deadline = time.monotonic() + timeout_s
            while any(p.poll() is None for p in procs):
                failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"packing_e2e ranks failed or timed out: codes {failed}")
                time.sleep(0.2)
            codes = [p.returncode for p in procs]
            if any(codes):
                raise RuntimeError(f"packing_e2e ranks exited with codes {codes}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return json.loads(out.read_text())


# -- analysis ---------------------------------------------------------------------------------


def _ratio(loads: np.ndarray) -> np.ndarray:
    """Per row, max over mean (1.0 where the mean is 0)."""
    mean = loads.mean(axis=1)
    return np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)


def _analyse(settings: Settings, plans: dict, ranks: list[list[dict]]) -> dict[str, Any]:
    repeats, n, post = settings.repeats, settings.steps, slice(WARMUP_STEPS, None)
    keys = ("cpu", "loss", "tokens", "micro", "slots", "area")
    data: dict[str, dict[str, np.ndarray]] = {}
    for method in METHODS:
        runs = [[r for r in rank_runs if r["method"] == method] for rank_runs in ranks]
        per = {k: np.array([[run[k] for run in rr] for rr in runs]) for k in keys}
        arrays = {k: v.transpose(1, 2, 0) for k, v in per.items()}  # (repeat, step, rank)
        arrays["wall"] = np.array([run["wall"] for run in runs[0]])  # rank 0: (repeat, step)
        data[method] = arrays
    tokens = np.asarray(plans["tokens"], dtype=np.float64)
    for method, arrays in data.items():
        if not np.array_equal(arrays["tokens"].sum(axis=2), np.broadcast_to(tokens, (repeats, n))):
            raise AssertionError(f"{method} did not train every token of every step once")
    # A per-micro-batch cost model fitted to every measured (run, step, rank) after warm-up:
    # CPU seconds = fixed per non-empty micro-batch + per token slot + per attention pair.
    features = np.concatenate(
        [
            np.stack([data[m][k][:, post].ravel() for k in ("micro", "slots", "area")], axis=1)
            for m in METHODS
        ]
    )
    target = np.concatenate([data[m]["cpu"][:, post].ravel() for m in METHODS])
    coef = np.linalg.lstsq(features, target, rcond=None)[0]
    fitted_all = features @ coef
    r2 = 1.0 - ((target - fitted_all) ** 2).sum() / ((target - target.mean()) ** 2).sum()
    # Measurement noise of a rank's share: every seed runs the same plans, so at a given
    # (method, step) a rank's share of the step's compute, log(cpu / mean over ranks), would
    # be the same in every seed but for noise (the machine's load scales both ranks and
    # cancels). Pooled standard deviation over seeds; two equally loaded ranks then measure
    # max/mean 1 + sigma·sqrt(2/pi) on average: the floor a measured ratio sits on.
    sigma = float("nan")
    if repeats > 1:
        shares = [
            np.log(data[m]["cpu"] / data[m]["cpu"].mean(axis=2, keepdims=True))[:, post]
            for m in METHODS
        ]
        sigma = float(np.sqrt(np.mean([x.var(axis=0, ddof=1).mean() for x in shares])))
    methods = {}
    loss = {m: data[m]["loss"].sum(axis=2) / tokens[None, :] for m in METHODS}
    for method in METHODS:
        arrays, plan = data[method], plans["methods"][method]
        tput = tokens[None, :] / arrays["wall"]  # (repeat, step)
        tput_repeat = np.median(tput[:, post], axis=1)
        # The same step of two methods ran one after the other: compare them step by step.
        vs_base = (data[BASELINE]["wall"] / arrays["wall"])[:, post]
        vs_pad = (data["padding"]["wall"] / arrays["wall"])[:, post]
        measured = _ratio(arrays["cpu"].reshape(-1, settings.world)).reshape(repeats, n)
        # The step as the slowest rank's compute alone would make it: CPU seconds, which
        # other processes on the machine do not stretch, unlike the wall time.
        slowest = arrays["cpu"].max(axis=2)  # (repeat, step)
        cpu_vs_base = (data[BASELINE]["cpu"].max(axis=2) / slowest)[:, post]
        cpu_vs_pad = (data["padding"]["cpu"].max(axis=2) / slowest)[:, post]
        # The features are the same in every repeat (the same plans): repeat 0's.
        per_rank = np.stack([arrays[k][0] for k in ("micro", "slots", "area")], axis=2)
        fitted_ratio = _ratio(per_rank @ coef)[post]
        predicted_ratio = np.asarray(plan["ratio"])
        gap = np.abs(loss[method] - loss["chronica"]).max()
        methods[method] = {
            "label": METHODS[method],
            "tokens_per_s": float(np.median(tput[:, post])),
            "tokens_per_s_repeats": tput_repeat.tolist(),
            "vs_firstfit": float(np.median(vs_base)),
            "vs_padding": float(np.median(vs_pad)),
            "vs_firstfit_repeats": np.median(vs_base, axis=1).tolist(),
            "cpu_tokens_per_s": float(np.median((tokens[None, :] / slowest)[:, post])),
            "cpu_vs_firstfit": float(np.median(cpu_vs_base)),
            "cpu_vs_padding": float(np.median(cpu_vs_pad)),
            "cpu_vs_firstfit_repeats": np.median(cpu_vs_base, axis=1).tolist(),
            "step_s": float(np.median(arrays["wall"][:, post])),
            "outside_compute_s": float(np.median((arrays["wall"] - slowest)[:, post])),
            "cpu_per_rank_s": float(np.median(arrays["cpu"][:, post].mean(axis=2))),
            "measured_ratio_median": float(np.median(measured[:, post])),
            "measured_ratio_mean": float(np.mean(measured[:, post])),
            "measured_ratio_worst": float(np.max(measured[:, post])),
            "measured_ratio": measured.tolist(),
            "predicted_ratio_median": float(np.median(predicted_ratio[post])),
            "predicted_ratio_mean": float(np.mean(predicted_ratio[post])),
            "predicted_ratio": predicted_ratio.tolist(),
            "fitted_ratio_mean": float(np.mean(fitted_ratio)),
            # How closely the measured ratio follows the predicted one from step to step.
            "predicted_measured_corr": float(
                np.corrcoef(
                    np.broadcast_to(predicted_ratio[post], measured[:, post].shape).ravel(),
                    measured[:, post].ravel(),
                )[0, 1]
            )
            if np.ptp(predicted_ratio[post]) > 0
            else float("nan"),
            "cpu": arrays["cpu"].tolist(),  # (seed, step, rank) seconds
            "wall": arrays["wall"].tolist(),  # (seed, step) seconds, rank 0
            "num_micro": float(np.mean(plan["num_micro"])),
            "padding_share": plan["padding_share"],
            "loss": loss[method].tolist(),
            "final_loss": float(loss[method][:, -3:].mean()),
            "max_loss_gap_vs_chronica": float(gap),
        }
    chronica_loss = loss["chronica"]
    return {
        "methods": methods,
        "cost_fit": {
            "per_micro_s": float(coef[0]),
            "per_token_s": float(coef[1]),
            "per_attention_pair_s": float(coef[2]),
            "r2": float(r2),
        },
        "noise": {"share_std": sigma, "floor": 1.0 + sigma * np.sqrt(2.0 / np.pi)},
        "seed_noise": {
            # Spread over seeds of one method's loss at a step (median over the steps), and of
            # its final loss: what "the same within seed noise" is judged against.
            "step_loss_std": float(np.median(chronica_loss.std(axis=0, ddof=1)))
            if repeats > 1
            else float("nan"),
            "final_loss_std": float(chronica_loss[:, -3:].mean(axis=1).std(ddof=1))
            if repeats > 1
            else float("nan"),
        },
        "first_loss": float(chronica_loss[:, 0].mean()),
    }


def run(quick: bool) -> dict[str, Any]:
    """Train the three methods interleaved on 2 processes; JSON-serialisable results."""
    settings = QUICK if quick else FULL
    started = time.perf_counter()
    plans = predicted(settings)
    ranks = _launch(settings, timeout_s=900)
    result = _analyse(settings, plans, ranks)
    result.update(
        {
            "mode": "quick" if quick else "full",
            "settings": asdict(settings),
            "heads": HEADS,
            "layers": LAYERS,
            "vocab": VOCAB,
            "lr": LR,
            "warmup_steps": WARMUP_STEPS,
            "data_seed": DATA_SEED,
            "step_tokens_mean": float(np.mean(plans["tokens"])),
            "step_documents_mean": float(np.mean(plans["documents"])),
            "plan_stats": plans["plan_stats"],
            "seconds": time.perf_counter() - started,
        }
    )
    return result


# -- report -----------------------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{'method':12}{'tok/s':>8}{'vs ff':>7}{'vs pad':>8}{'cpu tok/s':>10}{'vs ff':>7}"
        f"{'vs pad':>8}{'meas':>7}{'pred':>7}{'fit':>7}{'micro':>7}{'pad%':>6}{'loss':>7}"
    )
    lines = [head]
    for key, row in result["methods"].items():
        lines.append(
            f"{SHORT[key]:12}{row['tokens_per_s']:8.0f}{row['vs_firstfit']:6.3f}x"
            f"{row['vs_padding']:7.3f}x{row['cpu_tokens_per_s']:10.0f}"
            f"{row['cpu_vs_firstfit']:6.3f}x{row['cpu_vs_padding']:7.3f}x"
            f"{row['measured_ratio_mean']:7.3f}"
            f"{row['predicted_ratio_mean']:7.3f}{row['fitted_ratio_mean']:7.3f}"
            f"{row['num_micro']:7.2f}{100 * row['padding_share']:6.1f}{row['final_loss']:7.3f}"
        )
    noise = result["seed_noise"]
    lines.append(
        f"noise floor of measured max/mean: {result['noise']['floor']:.3f}; "
        f"seed noise of the final loss (std over {result['settings']['repeats']} seeds): "
        f"{noise['final_loss_std']:.4f}; largest loss gap to chronica: "
        + ", ".join(
            f"{k} {v['max_loss_gap_vs_chronica']:.2e}" for k, v in result["methods"].items()
        )
    )
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warm = result["warmup_steps"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for method, row in result["methods"].items():
        loss = np.asarray(row["loss"])
        steps = np.arange(1, loss.shape[1] + 1)
        color = STYLE[method]
        left.plot(steps, loss.mean(axis=0), color=color, ls=DASH[method], label=row["label"])
        left.fill_between(steps, loss.min(axis=0), loss.max(axis=0), color=color, alpha=0.15)
        measured = np.asarray(row["measured_ratio"])[:, warm:]
        pred = np.asarray(row["predicted_ratio"])[warm:]
        right.scatter(
            np.broadcast_to(pred, measured.shape).ravel(),
            measured.ravel(),
            s=10,
            color=color,
            alpha=0.6,
            label=row["label"],
        )
    left.set_xlabel("step")
    left.set_ylabel("global mean token loss")
    left.set_title("loss: mean over seeds, band min..max over seeds (curves coincide)", fontsize=10)
    left.legend(fontsize=8)
    low = 0.98
    high = max(
        max(np.max(np.asarray(r["measured_ratio"])[:, warm:]) for r in result["methods"].values()),
        max(np.max(r["predicted_ratio"][warm:]) for r in result["methods"].values()),
    )
    right.plot([low, high], [low, high], color="gray", ls=":", lw=1, label="measured = predicted")
    right.set_xlabel("predicted max/mean rank load (tokens; padded tokens for padding)")
    right.set_ylabel("measured max/mean rank CPU time")
    right.set_title("per step and seed, after warm-up", fontsize=10)
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md, with its plot written into ``img_dir``."""
    img_dir = Path(img_dir)
    _plot(result, img_dir / "packing_e2e.png")
    s = result["settings"]
    fit = result["cost_fit"]
    seeds = result["seed_noise"]
    gaps = {k: v["max_loss_gap_vs_chronica"] for k, v in result["methods"].items()}
    lines = [
        "## Packing end to end: a transformer trained on 2 processes",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s). Two processes "
        "(`torch.distributed`, gloo on 127.0.0.1, one CPU thread each) train a decoder-only "
        f"transformer ({result['layers']} layers, hidden {s['hidden']}, {result['heads']} "
        f"heads, vocabulary {result['vocab']}, Adam {result['lr']}) with DDP and gradient "
        "accumulation (`no_sync` except on a step's last micro-batch). Documents: "
        f"lognormal({LENGTH_MU}, {LENGTH_SIGMA}) lengths clipped to [{MIN_LENGTH}, "
        f"{s['max_tokens']}], tokens a noisy arithmetic sequence per document (stride learnt "
        "from the context). Every method trains the same steps (chronica's epoch order cut "
        f"at {s['tokens_per_step']} tokens: {result['step_tokens_mean']:.0f} tokens and "
        f"{result['step_documents_mean']:.1f} documents per step on average) from the same "
        f"initialisation, micro-batches of at most {s['max_tokens']} tokens. Attention is per "
        "document: SDPA with the block-diagonal causal mask of `segment_ids`, queries in chunks "
        f"of {s['chunk']} against the keys from their document's start (so it costs about "
        "the documents' squared lengths, as a variable-length kernel does). The loss is "
        "next-token cross entropy within each document, every micro-batch's token sum times "
        "`loss_weight / num_tokens`: each method's update is the gradient of the step's mean "
        "token loss.",
        "",
        "- **chronica**: `DistributedBatchSampler(docs, None, sizes=lengths, "
        f"packing=Packing({s['max_tokens']}, tokens_per_step={s['tokens_per_step']}))`, "
        "`PackedDataset`, `collate_packed` (default cost model: tokens).",
        "- **first fit**: each step's documents in epoch order into the first micro-batch they "
        "fit in, micro-batches dealt round-robin, the rank with fewer given an empty one "
        "(packing without balancing; same layout and collate function).",
        "- **padding**: DistributedSampler's strided split of the step (equal counts, one apart "
        "when the count is odd), each rank's documents in order into micro-batches of as many "
        "as fit padded to the longest (count × longest ≤ max_tokens).",
        "",
        f"{s['steps']} steps per run, {s['repeats']} seeds (model initialisations), the "
        "methods interleaved step by step, each with its own model (step 1 of chronica, of "
        "first fit, of padding, step 2 of chronica, ...). *tokens/s*: real "
        "tokens of a step over its wall time, median over the steps after the first "
        f"{result['warmup_steps']} and over seeds; *vs first fit*, *vs padding*: the median "
        "over the steps after warm-up and the seeds of the ratio of the wall times of the same "
        "step of two methods (they ran one after the other in the same job). *tokens/s "
        "(slowest rank's CPU)*: the step's real tokens over the CPU seconds of its slowest "
        "rank's compute (defined below), the same medians and ratios: the speed on an "
        "otherwise idle machine with free communication, which other processes' load does "
        "not stretch, unlike the wall time of a shared machine. *step*: median wall seconds; "
        "*outside compute*: median wall seconds of a step beyond its slowest rank's compute "
        "(all-reduce, optimizer, data, and time the ranks were not running). *measured "
        "max/mean*: per step, the slowest rank's compute over the mean, a rank's compute being "
        "the CPU time of its training thread (`time.thread_time`) over its micro-batches' "
        "forward and backward passes (no waiting in the all-reduce, no gloo thread), mean "
        "over steps after warm-up and seeds. *predicted*: the same ratio of the rank loads the "
        "plan predicts (tokens; padded tokens for padding), for chronica its plan's `loads` "
        f"(`stats().load_ratio_mean` over the whole epoch: "
        f"{result['plan_stats']['load_ratio_mean']:.5f}). *fitted*: the ratio the plans give "
        "under a cost model fitted to every measured (step, rank): "
        f"{1e3 * fit['per_micro_s']:.2f} ms per non-empty micro-batch + "
        f"{1e6 * fit['per_token_s']:.1f} µs per token slot + "
        f"{1e9 * fit['per_attention_pair_s']:.2f} ns per query-key pair (R² "
        f"{fit['r2']:.3f}). *micro*: micro-batches per rank and "
        "step; *padding*: share of the token slots that is padding; *loss*: mean token loss "
        "over the last 3 steps, mean over seeds.",
        "",
        "| method | tokens/s (wall) | vs first fit | vs padding | tokens/s (slowest rank's "
        "CPU) | vs first fit | vs padding | step (s) | outside compute (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["methods"].values():
        lines.append(
            f"| {row['label']} | {row['tokens_per_s']:,.0f} | {row['vs_firstfit']:.3f}× | "
            f"{row['vs_padding']:.3f}× | {row['cpu_tokens_per_s']:,.0f} | "
            f"{row['cpu_vs_firstfit']:.3f}× | {row['cpu_vs_padding']:.3f}× | "
            f"{row['step_s']:.3f} | {row['outside_compute_s']:.3f} |"
        )
    chron = result["methods"]["chronica"]
    wall_seeds, cpu_seeds = chron["vs_firstfit_repeats"], chron["cpu_vs_firstfit_repeats"]
    lines += [
        "",
        "chronica against first fit, per seed (median over its steps): "
        f"{min(wall_seeds):.3f}–{max(wall_seeds):.3f}× in wall time, "
        f"{min(cpu_seeds):.3f}–{max(cpu_seeds):.3f}× in the slowest rank's CPU time. Wall "
        "times include whatever else the machine ran (the *outside compute* column), so the "
        "CPU columns are the steadier measure of what the plans change.",
        "",
        "| method | measured max/mean | predicted | fitted | micro | padding | loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["methods"].values():
        lines.append(
            f"| {row['label']} | {row['measured_ratio_mean']:.3f} | "
            f"{row['predicted_ratio_mean']:.3f} | {row['fitted_ratio_mean']:.3f} | "
            f"{row['num_micro']:.2f} | {100 * row['padding_share']:.1f}% | "
            f"{row['final_loss']:.3f} |"
        )
    rows, noise = result["methods"], result["noise"]
    lines += [
        "",
        "Measured against predicted balance: for the baselines the measured ratio follows "
        "the predicted one step by step (correlation over the steps and seeds: "
        + ", ".join(
            f"{SHORT[k]} {rows[k]['predicted_measured_corr']:.2f}" for k in rows if k != "chronica"
        )
        + f"). chronica's plans predict {rows['chronica']['predicted_ratio_mean']:.4f} (tokens) "
        f"and measure {rows['chronica']['measured_ratio_mean']:.3f}; under the fitted cost "
        f"model they give {rows['chronica']['fitted_ratio_mean']:.3f}, since the token cost "
        "model does not see the per-micro-batch overhead and the attention pairs; and noise "
        "alone puts two equally loaded ranks near "
        f"{noise['floor']:.3f} (a rank's share of a step's compute varies by "
        f"{100 * noise['share_std']:.1f}% between seeds that run the same plans).",
        "",
        f"Loss: {result['first_loss']:.2f} at the first step. Seed noise (the seeds change "
        "the model's initialisation, not the data): the final loss "
        f"varies by {seeds['final_loss_std']:.4f} (standard deviation over the seeds; "
        f"{seeds['step_loss_std']:.4f} at a step, median over steps), while the largest "
        "difference between a method's loss and chronica's at any step of any seed is "
        + ", ".join(f"{gaps[k]:.1e} ({SHORT[k]})" for k in gaps if k != "chronica")
        + ": the curves are the same up to float rounding, far within seed noise.",
        "",
        f"![loss curves and measured vs predicted balance]({img_dir.name}/packing_e2e.png)",
        "",
        f"Reproduce: `{result.get('command', REPRODUCE)}` (`--quick`: {QUICK.steps} steps, "
        f"{QUICK.repeats} seeds; full: {FULL.steps} steps, {FULL.repeats} seeds).",
        "",
    ]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("RANK", "PORT", "CONFIG", "OUT"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        rank, port, config, out = args.worker
        return _worker(int(rank), int(port), config, out)
    print(format_table(run(args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
