"""Packed training through the transformers ``Trainer``: one Trainer batch per chronica step.

A packed step is ``num_micro`` micro-batches on every rank, a count that changes from step
to step, while the Trainer accumulates a fixed ``gradient_accumulation_steps``. So the
Trainer's batch is the whole step (``PackedSteps`` yields this rank's micro-batches of one
step, ``collate_steps`` turns them into a list of ``collate_packed`` dicts) and
``packed_step_loss`` runs them: every micro-batch a forward over its flat tokens with
``position_ids`` restarting in every document and a block-diagonal causal mask (a document
never attends to another), its backward without gradient synchronisation but for the
step's last one. The loss follows ``Packing.loss`` over the loss-bearing tokens: those
whose label (``collate_packed``'s ``labels``: a document's own ``labels`` field, -100 on
prompt tokens in supervised fine-tuning, else its tokens) is not -100, a document's first
token never: ``"token"``, the mean over the step's loss-bearing tokens on every rank;
``"sample"``, the mean over its documents of their mean. ``labelled_step_norms`` counts
them from this rank's micro-batches with one all-reduce (``step_norms`` reads the plan
instead, for documents without labels). The all-reduced gradient is then that of the
step's global loss, equal to the unpacked one.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from chronica.adapters.torch.data import DistributedBatchSampler
from chronica.adapters.torch.packed import IGNORED_LABEL, PackedIndex, collate_packed
from chronica.runtime.micro import planned_micro_batches

__all__ = [
    "PackedSteps",
    "collate_steps",
    "labelled_step_norms",
    "loss_pieces",
    "normalisers",
    "packed_step_loss",
    "step_norms",
]


class PackedSteps(Sampler[list[int]]):
    """A ``DataLoader`` batch sampler of whole steps: every batch is this rank's packed
    micro-batches of one step of ``sampler``, concatenated (``collate_steps`` splits them
    again); ``len`` counts steps, ``set_epoch`` is the sampler's.

    Args:
        sampler: a packed ``DistributedBatchSampler``.

    Example::

        loader = DataLoader(PackedDataset(docs), batch_sampler=PackedSteps(batches),
                            collate_fn=collate_steps)
    """

    def __init__(self, sampler: DistributedBatchSampler) -> None:
        self.sampler = sampler

    def __repr__(self) -> str:
        return f"PackedSteps({self.sampler!r})"

    def __len__(self) -> int:
        return self.sampler.stream.num_steps

    def set_epoch(self, epoch: int) -> None:
        """The sampler's ``set_epoch``.

        Args:
            epoch: the epoch to iterate next.
        """
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        step: list[int] = []
        for micro in self.sampler:
            if step and step[0].step != micro[0].step:  # type: ignore[attr-defined]
                yield step
                step = []
            step.extend(micro)
        if step:
            yield step


def collate_steps(items: Sequence[tuple[Any, PackedIndex]], key: str = "input_ids") -> list:
    """One step's micro-batches, each a ``collate_packed`` dict, in order.

    Args:
        items: ``PackedDataset`` items of one ``PackedSteps`` batch.
        key: the field holding the tokens when documents are mappings.

    Example::

        micro_batches = collate_steps(items)   # [{"input_ids": ..., "last": False}, ...]
    """
    groups: dict[int, list[tuple[Any, PackedIndex]]] = defaultdict(list)
    for item in items:
        groups[item[1].micro].append(item)
    return [collate_packed(groups[m], key) for m in sorted(groups)]


# Norms of the steps seen last, by plan identity and step (a plan is immutable).
_NORMS: dict[tuple[int, int, str], tuple[Any, tuple[float, dict[int, float]]]] = {}


def _norms(plan: Any, step: int, loss: str) -> tuple[float, dict[int, float]]:
    key = (id(plan), step, loss)
    cached = _NORMS.get(key)
    if cached is not None and cached[0] is plan:
        return cached[1]
    pieces: list[tuple[int, int]] = []
    for rank in range(plan.num_replicas):
        for micro in planned_micro_batches(plan, step, rank):
            pieces += [
                (int(d), int(n)) for d, n in zip(micro.indices, micro.lengths, strict=True) if n > 1
            ]
    norms = normalisers(pieces, loss)
    if len(_NORMS) > 1024:
        _NORMS.clear()
    _NORMS[key] = (plan, norms)
    return norms


def normalisers(
    pieces: Sequence[tuple[int, int]], loss: str, totals: tuple[int, int] | None = None
) -> tuple[float, dict[int, float]]:
    """``(scale, per_document)`` of one step (see ``step_norms``) from its ``pieces``: the
    ``(document, tokens)`` of every piece of a document the step trains with more than one
    token (a causal model predicts ``tokens - 1`` of them: the loss-bearing tokens of a
    document without labels; ``labelled_step_norms`` counts them from labels).

    Args:
        pieces: the step's pieces, on every rank, or on this rank only with ``totals``.
        loss: ``Packing.loss``: ``"sample"`` weighs documents equally, else tokens.
        totals: ``(predicted tokens, documents)`` of the whole step on every rank when
            ``pieces`` are this rank's only (``None``: counted from ``pieces``).

    Example::

        >>> normalisers([(0, 3), (1, 5)], "token")
        (0.16666666666666666, {})
    """
    return _unit_norms([(d, n - 1) for d, n in pieces], loss, totals)


def _unit_norms(
    units: Sequence[tuple[int, int]], loss: str, totals: tuple[int, int] | None
) -> tuple[float, dict[int, float]]:
    """``normalisers`` from ``(document, loss-bearing tokens)`` pairs (a document in pieces
    is one document, of its pieces' tokens)."""
    if totals is None:
        totals = (sum(n for _, n in units), len({d for d, _ in units}))
    tokens, documents = totals
    if loss == "sample":
        per_document: dict[int, int] = defaultdict(int)
        for d, n in units:
            per_document[d] += n
        return 1.0 / max(1, documents), {d: 1.0 / n for d, n in per_document.items()}
    return 1.0 / max(1, tokens), {}


def loss_pieces(micro_batches: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(document, loss-bearing tokens)`` of every piece of a document in
    ``micro_batches`` that has at least one: its ``labels`` that are not -100 (a piece's
    first is always -100: nothing before it in the micro-batch predicts it).

    Args:
        micro_batches: ``collate_packed`` dicts (``collate_steps`` of a step, or a
            ``StreamSteps`` item).

    Example::

        >>> loss_pieces(collate_steps(items))   # [(document, tokens), ...]
    """
    out = []
    for micro in micro_batches:
        bounds = micro["cu_seqlens"].tolist()[: len(micro["indices"]) + 1]  # not the padding
        if "labels" in micro:
            counted = torch.cumsum(micro["labels"] != IGNORED_LABEL, 0).tolist()
            counts = [
                counted[b - 1] - (counted[a - 1] if a else 0) for a, b in itertools.pairwise(bounds)
            ]
        else:  # a dict built without labels: every token but a piece's first
            counts = [b - a - 1 for a, b in itertools.pairwise(bounds)]
        out += [
            (int(d), n) for d, n in zip(micro["indices"].tolist(), counts, strict=True) if n > 0
        ]
    return out


def labelled_step_norms(
    micro_batches: Sequence[dict[str, Any]],
    loss: str,
    reduce: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | str = "cpu",
) -> tuple[float, dict[int, float]]:
    """``(scale, per_document)`` of one step (see ``step_norms``) counted from the
    ``labels`` of this rank's micro-batches (``loss_pieces``) and one all-reduce of two
    integers (the step's loss-bearing tokens and documents): the accumulated, all-reduced
    update is the gradient of the global mean over exactly the loss-bearing tokens
    (``"sample"``: over the documents holding one). Every rank must call it for the step
    (``reduce`` is a collective).

    Args:
        micro_batches: this rank's micro-batches of the step.
        loss: ``Packing.loss`` (``"sample"`` weighs documents equally, else tokens).
        reduce: sums a tensor over the ranks (``lambda t: accelerator.reduce(t, "sum")``).
        device: where ``reduce`` takes its tensor (the process group's device).

    Example::

        norms = labelled_step_norms(step, "token", lambda t: accelerator.reduce(t, "sum"))
    """
    units = loss_pieces(micro_batches)
    counts = [sum(n for _, n in units), len({d for d, _ in units})]
    local = torch.tensor(counts, dtype=torch.int64, device=device)
    tokens, documents = reduce(local).tolist()
    return _unit_norms(units, loss, (int(tokens), int(documents)))


def step_norms(sampler: DistributedBatchSampler, step: int) -> tuple[float, dict[int, float]]:
    """``(scale, per_document)`` of ``step`` of the current epoch: a predicted token's loss
    counts ``scale × per_document.get(document, 1)`` in the step's global loss
    (``Packing.loss="token"``: ``1 / predicted tokens`` over every rank; ``"sample"``:
    ``1 / documents`` times ``1 / the document's predicted tokens``).

    Args:
        sampler: the packed ``DistributedBatchSampler``.
        step: the step.
    """
    plan = sampler.stream.plan()
    packing = sampler.stream.config.packing
    assert packing is not None
    return _norms(plan, step, packing.loss)


def packed_step_loss(
    model: torch.nn.Module,
    micro_batches: Sequence[dict[str, Any]],
    norms: tuple[float, dict[int, float]],
    num_replicas: int,
    backward: Callable[[torch.Tensor], None],
    no_sync: Callable[[], Any],
    device: torch.device,
) -> torch.Tensor:
    """Forward and backward every micro-batch of one step; returns this rank's share of the
    step's global loss, detached (its mean over the ranks is the step's loss).

    Args:
        model: a causal language model taking ``input_ids``, ``position_ids`` and a 4-D
            boolean ``attention_mask`` and returning ``logits``.
        micro_batches: ``collate_steps`` of the step.
        norms: ``step_norms`` of the step.
        num_replicas: the ranks whose gradients are averaged.
        backward: runs the backward pass of a loss (``accelerator.backward``).
        no_sync: a context without gradient synchronisation (``accelerator.no_sync``).
        device: where the model is.
    """
    scale, per_document = norms
    total = torch.zeros((), device=device)
    for number, micro in enumerate(micro_batches):
        last = number == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            loss = _micro_loss(model, micro, scale * num_replicas, per_document, device)
            backward(loss)
        total += loss.detach()
    return total


def _micro_loss(
    model: torch.nn.Module,
    micro: dict[str, Any],
    scale: float,
    per_document: dict[int, float],
    device: torch.device,
) -> torch.Tensor:
    ids = micro["input_ids"].to(device)
    if micro["num_tokens"] == 0:  # an empty micro-batch still takes part in the step
        return model(input_ids=torch.ones((1, 1), dtype=torch.long, device=device)).logits.sum() * 0
    segments = micro["segment_ids"].to(device)
    count = ids.shape[0]
    causal = torch.ones((count, count), dtype=torch.bool, device=device).tril()
    mask = (segments[:, None] == segments[None, :]) & causal
    logits = model(
        input_ids=ids[None],
        position_ids=micro["position_ids"].to(device)[None],
        attention_mask=mask[None, None],
    ).logits[0]
    predicted = segments[1:] == segments[:-1]  # a document's first token is not predicted
    targets = ids[1:]
    if "labels" in micro:  # loss-bearing: labels not -100 (prompt tokens carry none)
        targets = micro["labels"].to(device)[1:]
        predicted = predicted & (targets != IGNORED_LABEL)
    logits = logits[:-1].to(torch.promote_types(logits.dtype, torch.float32))
    losses = torch.nn.functional.cross_entropy(
        logits, targets, reduction="none", ignore_index=IGNORED_LABEL
    )
    weights = torch.full_like(losses, scale)
    if per_document:
        documents = micro["indices"].numpy()[micro["segment_ids"].numpy()[1:]]
        weights = weights * torch.as_tensor(
            np.array([per_document.get(int(d), 0.0) for d in documents]), device=device
        ).to(weights.dtype)
    return (losses * weights * predicted).sum()
