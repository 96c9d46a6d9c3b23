"""The discrete-event cluster simulator behind ``chronica simulate``.

It plans with the real ``chronica.core`` (``Scheduler``, ``DynamicPlanner``, the shuffle
policies and the movement accounting) and replaces only the cluster: W simulated ranks with
speed profiles, a compute-time model driven by chronica's cost models, and an all-reduce
model. Imports ``chronica.core``, numpy and tqdm only (matplotlib and pyarrow lazily); never
a deep-learning framework, ``chronica.comm`` or the adapters.

    from chronica.sim import SimOptions, simulate
    result = simulate(sizes, SimOptions(world=64, speeds="HL4"))
"""

from chronica.sim.engine import (
    DEFAULT_STRATEGIES,
    SimOptions,
    SimulationResult,
    StrategyResult,
    simulate,
)
from chronica.sim.pipeline import PipelineModel
from chronica.sim.report import format_table, plot
from chronica.sim.sizes import SizeDistribution, read_sizes, resample
from chronica.sim.speeds import (
    OMNILEARN_PROFILES,
    SpeedProfile,
    hl_speeds,
    parse_speeds,
    slowdown_matrix,
)
from chronica.sim.strategies import Assignment, Strategy, torch_assignment
from chronica.sim.timing import AllReduceModel, ComputeModel, StepEvaluation, evaluate_steps

__all__ = [
    "DEFAULT_STRATEGIES",
    "OMNILEARN_PROFILES",
    "AllReduceModel",
    "Assignment",
    "ComputeModel",
    "PipelineModel",
    "SimOptions",
    "SimulationResult",
    "SizeDistribution",
    "SpeedProfile",
    "StepEvaluation",
    "Strategy",
    "StrategyResult",
    "evaluate_steps",
    "format_table",
    "hl_speeds",
    "parse_speeds",
    "plot",
    "read_sizes",
    "resample",
    "simulate",
    "slowdown_matrix",
    "torch_assignment",
]
