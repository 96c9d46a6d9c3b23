"""``chronica.torch.utils.data``: drop-in ``Dataset``, ``DistributedSampler`` and
``DistributedBatchSampler``, and for packed micro-batches ``PackedDataset`` and
``collate_packed`` (see ``chronica.adapters.torch.data``)."""

from chronica.adapters.torch.data import Dataset, DistributedBatchSampler, DistributedSampler
from chronica.adapters.torch.feedback import ComputeTimer
from chronica.adapters.torch.packed import PackedDataset, PackedIndex, collate_packed

__all__ = [
    "ComputeTimer",
    "Dataset",
    "DistributedBatchSampler",
    "DistributedSampler",
    "PackedDataset",
    "PackedIndex",
    "collate_packed",
]
