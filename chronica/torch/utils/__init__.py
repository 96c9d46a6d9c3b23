"""``chronica.torch.utils``: mirrors ``torch.utils``."""

from chronica.torch.utils import data

__all__ = ["data"]
