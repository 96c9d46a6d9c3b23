"""PyTorch adapter: drop-in data set and samplers (imports torch)."""

from chronica.adapters.torch.data import Dataset, DistributedBatchSampler, DistributedSampler

__all__ = ["Dataset", "DistributedBatchSampler", "DistributedSampler"]
