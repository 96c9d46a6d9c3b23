"""``chronica.torch.distributed``: gradient-priority communication scheduling for PyTorch.

``opt = ScheduledOptimizer(model, torch.optim.AdamW(model.parameters()))`` then
``loss.backward(); opt.step()`` as usual; see ``chronica.adapters.torch.grad``.
"""

from chronica.adapters.torch.grad import ScheduledOptimizer
from chronica.runtime.dispatcher import SchedulingOptions

__all__ = ["ScheduledOptimizer", "SchedulingOptions"]
