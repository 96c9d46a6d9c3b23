"""PyTorch adapter: drop-in data set and samplers (imports torch)."""

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
