"""Streamed training through the transformers ``Trainer``: one Trainer batch per step of a
``StreamingDataset``.

A stream yields this rank's packed micro-batches, the same count on every rank in every
step, a count that changes from step to step. As for packed map-style data
(``chronica.adapters.torch.hf_packed``), the Trainer's batch is the whole step:
``StreamSteps`` groups the stream's micro-batches by step, and the Trainer's
``training_step`` runs them with ``hf_packed.packed_step_loss``. Each rank sees only its own
part of a step, so ``stream_step_norms`` counts the loss-bearing tokens (labels not -100:
a record's own ``labels`` field masks prompt tokens; a sample's first token never carries
loss) of the step on every rank with one all-reduce of two integers: the accumulated,
all-reduced update is the gradient of the global mean over exactly those tokens
(``Packing.loss="sample"``: over documents).

The stream's position travels with the Trainer's checkpoints: ``save_stream_state`` writes
the stream's ``state_dict()`` at the last step trained (the loader never reads ahead) into
the checkpoint folder, one file per rank, and ``load_stream_state`` reads it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from chronica.adapters.torch.hf_packed import labelled_step_norms
from chronica.adapters.torch.streaming import StreamingDataset

__all__ = ["StreamSteps", "load_stream_state", "save_stream_state", "stream_step_norms"]


class StreamSteps(IterableDataset):
    """The whole steps of a ``StreamingDataset``: every item is this rank's micro-batches of
    one global step, in order (a list of the stream's ``collate_packed`` dicts), so every
    rank gets the same number of items; one iteration is one pass of the stream (the next
    starts the next pass). ``step`` is the global step last yielded (``None`` before any).

    Args:
        stream: the ``StreamingDataset``.

    Example::

        loader = DataLoader(StreamSteps(stream), batch_size=None)
        for micro_batches in loader:    # one step
            ...
    """

    def __init__(self, stream: StreamingDataset) -> None:
        if not isinstance(stream, StreamingDataset):
            raise TypeError(f"StreamSteps takes a chronica StreamingDataset, got {stream!r}")
        self.stream = stream
        self.step: int | None = None

    def __repr__(self) -> str:
        return f"StreamSteps({self.stream!r})"

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        step: list[dict[str, Any]] = []
        for micro in self.stream:
            step.append(micro)
            if micro["last"]:  # yielded before the next step is read: nothing read ahead
                self.step = int(micro["step"])
                yield step
                step = []


def stream_step_norms(
    micro_batches: Sequence[dict[str, Any]],
    loss: str,
    reduce: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | str = "cpu",
) -> tuple[float, dict[int, float]]:
    """``(scale, per_document)`` of one streamed step, as ``hf_packed.step_norms`` gives
    for a planned one: a loss-bearing token's loss (label not -100) counts
    ``scale × per_document.get(document, 1)`` in the step's global loss
    (``hf_packed.labelled_step_norms``). Every rank must call it for the step (``reduce``
    is a collective).

    Args:
        micro_batches: this rank's micro-batches of the step (a ``StreamSteps`` item).
        loss: the stream's ``Packing.loss``.
        reduce: sums a tensor over the ranks (``lambda t: accelerator.reduce(t, "sum")``).
        device: where ``reduce`` takes its tensor (the process group's device).

    Example::

        norms = stream_step_norms(step, "token", lambda t: accelerator.reduce(t, "sum"))
    """
    return labelled_step_norms(micro_batches, loss, reduce, device)


def _state_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"chronica_stream_{rank}.json")


def save_stream_state(stream: StreamingDataset, folder: str, rank: int) -> None:
    """Write ``stream.state_dict()`` (at the micro-batch last yielded) into a checkpoint
    ``folder``, as ``chronica_stream_<rank>.json`` (with ``kind="dynamic"`` a rank's state
    holds its own unexchanged reports, so every rank writes its own).

    Args:
        stream: the ``StreamingDataset``.
        folder: the checkpoint folder (made if missing).
        rank: this process's rank.

    Example::

        save_stream_state(stream, "run/checkpoint-40", rank=0)
    """
    os.makedirs(folder, exist_ok=True)
    with open(_state_file(folder, rank), "w") as f:
        json.dump(stream.state_dict(), f)


def load_stream_state(stream: StreamingDataset, folder: str, rank: int) -> None:
    """Resume ``stream`` at the state ``save_stream_state`` wrote into ``folder`` for
    ``rank`` (on its next ``iter()``); ``ValueError`` naming the file when there is none.

    Args:
        stream: the ``StreamingDataset``.
        folder: the checkpoint folder.
        rank: this process's rank.

    Example::

        load_stream_state(stream, "run/checkpoint-40", rank=0)
    """
    path = _state_file(folder, rank)
    if not os.path.isfile(path):
        raise ValueError(
            f"{path} is missing: a checkpoint to resume a StreamingDataset from must be "
            "saved by chronica.torch.hf.Trainer training that stream (it holds the "
            "stream's position)"
        )
    with open(path) as f:
        stream.load_state_dict(json.load(f))
