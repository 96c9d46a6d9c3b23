"""chronica: data and gradient scheduling for distributed deep learning.

``import chronica`` loads no deep-learning framework; ``chronica.torch`` loads PyTorch.
"""

from chronica.core import (
    CostModel,
    EpochPlan,
    PlanStats,
    ScheduleConfig,
    Scheduler,
    ShufflePolicy,
)

__version__ = "0.3.0.dev0"

__all__ = [
    "CostModel",
    "EpochPlan",
    "PlanStats",
    "ScheduleConfig",
    "Scheduler",
    "ShufflePolicy",
    "__version__",
]
