"""``chronica.torch.utils.data``: drop-in ``Dataset``, ``DistributedSampler`` and
``DistributedBatchSampler`` (see ``chronica.adapters.torch.data``)."""

from chronica.adapters.torch.data import Dataset, DistributedBatchSampler, DistributedSampler
from chronica.adapters.torch.feedback import ComputeTimer

__all__ = ["ComputeTimer", "Dataset", "DistributedBatchSampler", "DistributedSampler"]
