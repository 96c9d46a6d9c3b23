"""``chronica.torch``: the PyTorch face of chronica (importing it imports torch).

Mirrors torch's layout so migrating is a change of import:
``from chronica.torch.utils.data import Dataset, DistributedSampler``.
"""

from chronica.adapters.torch.streaming import StreamingDataset
from chronica.torch import utils

__all__ = ["StreamingDataset", "utils"]
