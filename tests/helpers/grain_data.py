"""Data shared by tests/adapters/jax/test_grain.py and its 2-process worker (grain_worker.py):
variable-length samples, their sizes, and a source that counts the records read from it."""

from __future__ import annotations

import numpy as np

__all__ = ["BATCH", "EPOCHS", "N", "RESUME_AT", "CountingSource", "samples"]  # noqa: RUF022

N = 206  # samples: 103 per rank at W=2, 13 steps of 8 per rank (the last one partial)
BATCH = 16  # the global batch over both processes
EPOCHS = 2
RESUME_AT = 7  # Grain's checkpoint is taken after this many records (mid-epoch 0)


def samples(n: int = N, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """``n`` int32 sequences of lognormal lengths (sample ``i`` holds ``i`` in every
    element, so a padded batch shows whose tokens it holds), and their lengths."""
    lengths = np.random.default_rng(seed).lognormal(3, 1, n).astype(np.int64) + 1
    return [np.full(k, i, dtype=np.int32) for i, k in enumerate(lengths)], lengths


class CountingSource:
    """A random-access source that counts every record read (``reads``, one entry per
    read: the index), as a Grain data source over files would cost a read each."""

    def __init__(self, records: list) -> None:
        self.records = records
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        self.reads.append(int(index))
        return self.records[index]
