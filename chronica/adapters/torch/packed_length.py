"""The micro-batch count a packed ``DistributedBatchSampler`` promises for every epoch.

A packed epoch's micro-batch count depends on its order (how its documents fill the token
budget), so it changes a little from epoch to epoch. Training libraries read ``len`` once
per run (Lightning fixes its batches per epoch before it calls ``set_epoch``) and stop an
epoch after that many batches: a longer epoch would lose its last micro-batches, and with
them its last step's update, without a word. So the length is promised once, when it is
first read: the most micro-batches of the epochs ``LOOKAHEAD`` from the current one. An
epoch with fewer is padded with empty micro-batches (loss weight 0, placed before the real
micro-batches of its last step, so that step's update still comes with its last real
micro-batch); an epoch with more raises ``ValueError`` before it yields anything, naming
``Packing(micro_batches=...)``, which fixes the count per step.
"""

from __future__ import annotations

import numpy as np

from chronica.runtime.micro import MicroBatch
from chronica.runtime.progress import plan_epoch
from chronica.runtime.stream import RankStream

__all__ = ["EMPTY", "LOOKAHEAD", "PackedLength"]

# Epochs whose micro-batch counts the promised length covers, from the one selected when
# ``len`` is first read (each is planned once more at most; plans are cached).
LOOKAHEAD = 4

_NONE = np.empty(0, np.int64)
EMPTY = MicroBatch(_NONE, _NONE, _NONE, _NONE, 0.0)  # a padding micro-batch


class PackedLength:
    """The promised micro-batch count of ``stream``'s epochs (``promised``, ``None`` until
    ``length`` is first called) and each epoch's padding up to it.

    Args:
        stream: the packed sampler's ``RankStream``.

    Example::

        length = PackedLength(sampler.stream)
        length.length()   # promised from now on: the most of the next LOOKAHEAD epochs
        length.padding()  # empty micro-batches the current epoch adds
    """

    def __init__(self, stream: RankStream) -> None:
        self.stream = stream
        self.promised: int | None = None
        self._covered = (0, 0)

    def __repr__(self) -> str:
        return f"PackedLength(promised={self.promised}, covered epochs={self._covered})"

    def _count(self, epoch: int) -> int:
        micro = plan_epoch(self.stream.scheduler, epoch).micro
        assert micro is not None
        return int(micro.num_micro.sum())

    def _remainder(self) -> bool:
        """Whether the current epoch is an elastically resumed remainder (its own plan)."""
        stream = self.stream
        return stream.plan() is not plan_epoch(stream.scheduler, stream.epoch)

    def length(self) -> int:
        """Micro-batches every epoch yields: promised at the first call (the most of the
        current epoch and the next ``LOOKAHEAD - 1``); an elastically resumed remainder
        counts its own."""
        if self._remainder():
            micro = self.stream.plan().micro
            assert micro is not None
            return int(micro.num_micro.sum())
        if self.promised is None:
            first = self.stream.epoch
            self._covered = (first, first + LOOKAHEAD - 1)
            self.promised = max(self._count(e) for e in range(first, first + LOOKAHEAD))
        return self.promised

    def padding(self) -> int:
        """Empty micro-batches the current epoch adds to its last step to yield the promised
        count (0 before a promise, or for a resumed remainder). Raises ``ValueError`` when
        the epoch has more micro-batches than promised."""
        if self.promised is None or self._remainder():
            return 0
        plan = self.stream.plan()
        assert plan.micro is not None
        count = int(plan.micro.num_micro.sum())
        if count > self.promised:
            most = int(plan.micro.num_micro.max())
            raise ValueError(
                f"epoch {self.stream.epoch} of this packed plan has {count} micro-batches, "
                f"more than the {self.promised} that len() promised when it was first read "
                f"(the most of epochs {self._covered[0]}-{self._covered[1]}); a training "
                "library that reads len once per run (Lightning) would drop the rest, and "
                "the last step's update, without a word. Fix the count per step with "
                f"Packing(micro_batches={most}) (every step then has that many micro-batches "
                "per rank unless its documents need more)"
            )
        return self.promised - count
