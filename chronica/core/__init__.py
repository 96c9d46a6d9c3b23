"""Framework-free scheduling decisions: sizes, cost models, randomness, balancing, plans.

Imports numpy and numba only; no I/O, no deep-learning framework, no transport.
"""

from chronica.core.cost import CostModel, as_cost_model
from chronica.core.plan import EpochPlan, PlanStats
from chronica.core.scheduler import KINDS, ScheduleConfig, Scheduler
from chronica.core.sizes import resolve_sizes, sizes_digest, validate_sizes

__all__ = [
    "KINDS",
    "CostModel",
    "EpochPlan",
    "PlanStats",
    "ScheduleConfig",
    "Scheduler",
    "as_cost_model",
    "resolve_sizes",
    "sizes_digest",
    "validate_sizes",
]
