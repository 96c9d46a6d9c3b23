"""``StreamCheckpoint``: Lightning checkpoints that hold a ``StreamingDataset``'s state as
of the last micro-batch trained.

Lightning reads one batch ahead of a loader without a length (to know the epoch's last
batch), so with one micro-batch per ``training_step(batch, batch_idx)`` the stream has
yielded one micro-batch more than was trained when a checkpoint is saved, and the state a
``StatefulDataLoader`` saves would make a resumed run skip it. The callback makes the
training loader's streams keep the states after their recent micro-batches
(``StreamingDataset.track_trained``) and marks every batch trained
(``StreamingDataset.trained``) before any checkpoint of that batch is written (Lightning
runs ``ModelCheckpoint`` after the other callbacks), so the saved state is the one after
the last micro-batch trained. A ``training_step(dataloader_iter)`` hands no batch to the
callbacks and reads nothing ahead: the stream's own state is then exact, and the callback
does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback

from chronica.adapters.torch.streaming import StreamingDataset

__all__ = ["StreamCheckpoint"]

_PLACE = ("epoch", "step", "micro")


class StreamCheckpoint(Callback):
    """Makes Lightning's checkpoints resume a ``chronica.torch.StreamingDataset`` (in a
    ``StatefulDataLoader``) at the first micro-batch not trained: every micro-batch is
    trained exactly once across a stop and resume, and the resumed run is bitwise the
    uninterrupted one (same world size). When a checkpoint would need a state the stream
    no longer keeps (Lightning reading more than ``depth - 1`` batches ahead),
    ``StreamingDataset.trained`` raises ``ValueError`` instead of saving one that skips.

    Args:
        depth: the states each stream keeps, ``>= 1`` (``prefetch_batches + 1`` at least).

    Example::

        trainer = L.Trainer(callbacks=[chronica.torch.StreamCheckpoint(), ModelCheckpoint(...)])
    """

    def __init__(self, depth: int = 8) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int, got {type(depth).__name__}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (the states each stream keeps), got {depth}")
        self.depth = depth

    def __repr__(self) -> str:
        return f"StreamCheckpoint(depth={self.depth})"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Every stream of the training loader keeps its recent states (Lightning has
        already read its first batch: the stream keeps the state after it too)."""
        for stream in _streams(trainer.train_dataloader):
            stream.track_trained(self.depth)

    on_train_epoch_start = on_train_start  # a loader reloaded every n epochs is new

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """``batch`` was trained: the streams' saved state is from now on the one after it."""
        if not (isinstance(batch, Mapping) and all(k in batch for k in _PLACE)):
            return  # training_step(dataloader_iter): no read-ahead, nothing to mark
        for stream in _streams(trainer.train_dataloader):
            stream.trained(batch)


def _streams(loaders: Any) -> list[StreamingDataset]:
    """The ``StreamingDataset`` of every loader in Lightning's (possibly nested)
    ``train_dataloader``."""
    if isinstance(loaders, Mapping):
        return [s for value in loaders.values() for s in _streams(value)]
    if isinstance(loaders, list | tuple):
        return [s for value in loaders for s in _streams(value)]
    dataset = getattr(loaders, "dataset", None)
    return [dataset] if isinstance(dataset, StreamingDataset) else []
