"""``chronica.torch``: the PyTorch face of chronica (importing it imports torch).

Mirrors torch's layout so migrating is a change of import:
``from chronica.torch.utils.data import Dataset, DistributedSampler``.
``StreamCheckpoint`` (a Lightning callback) imports Lightning when first used.
"""

from typing import Any

from chronica.adapters.torch.streaming import StreamingDataset
from chronica.torch import utils

__all__ = ["StreamCheckpoint", "StreamingDataset", "utils"]

StreamCheckpoint: type  # imported from chronica.adapters.torch.lightning on first use


def __getattr__(name: str) -> Any:
    if name == "StreamCheckpoint":
        from chronica.adapters.torch.lightning import StreamCheckpoint

        return StreamCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
