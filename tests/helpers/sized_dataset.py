"""A map-style torch data set of given sample sizes (the upstream ``__sizeof__(index)``
protocol), for the torch samplers' tests and the gloo worker they start."""

from __future__ import annotations

import numpy as np

from chronica.torch.utils.data import Dataset


class Sized(Dataset):
    """Sample ``i`` is the index ``i``; its size is ``sizes[i]``."""

    def __init__(self, sizes):
        self.sizes_ = np.asarray(sizes)

    def __len__(self):
        return len(self.sizes_)

    def __getitem__(self, index):
        return index

    def __sizeof__(self, index=None):
        return float(self.sizes_[index]) if index is not None else super().__sizeof__()
