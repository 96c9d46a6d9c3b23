"""``chronica.torch.utils.data``: drop-in ``Dataset``, ``DistributedSampler`` and
``DistributedBatchSampler`` (see ``chronica.adapters.torch.data``)."""

from chronica.adapters.torch.data import Dataset, DistributedBatchSampler, DistributedSampler

__all__ = ["Dataset", "DistributedBatchSampler", "DistributedSampler"]
