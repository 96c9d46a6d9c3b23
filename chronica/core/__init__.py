"""Framework-free scheduling decisions: sizes, cost models, randomness, balancing, plans.

Imports numpy and numba only; no I/O, no deep-learning framework, no transport.
"""

from chronica.core.accounting import LabelSkew, Movement, label_skew, movement
from chronica.core.config import ScheduleConfig
from chronica.core.controller import ControllerOptions
from chronica.core.cost import CostModel, as_cost_model
from chronica.core.modes import KINDS, Mode
from chronica.core.packing import Packing, StepPlan, plan_step
from chronica.core.pipeline import Pipeline
from chronica.core.plan import EpochPlan, MicroLayout, PlanStats
from chronica.core.scheduler import Scheduler
from chronica.core.shuffle import POLICIES, ShufflePolicy, as_shuffle_policy
from chronica.core.sizes import resolve_sizes, sizes_digest, validate_sizes

__all__ = [
    "KINDS",
    "POLICIES",
    "ControllerOptions",
    "CostModel",
    "EpochPlan",
    "LabelSkew",
    "MicroLayout",
    "Mode",
    "Movement",
    "Packing",
    "Pipeline",
    "PlanStats",
    "ScheduleConfig",
    "Scheduler",
    "ShufflePolicy",
    "StepPlan",
    "as_cost_model",
    "as_shuffle_policy",
    "label_skew",
    "movement",
    "plan_step",
    "resolve_sizes",
    "sizes_digest",
    "validate_sizes",
]
