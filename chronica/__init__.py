"""chronica: data and gradient scheduling for distributed deep learning.

``import chronica`` loads no deep-learning framework. The framework faces are attributes
loaded on first use: ``chronica.torch`` (PyTorch), ``chronica.tf`` (TensorFlow),
``chronica.jax`` (JAX), so ``dataset.apply(chronica.tf.schedule(...))`` works after a plain
``import chronica``. ``DynamicOptions`` (the transport of ``kind="dynamic"``) and the runtime
load on first use too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chronica.core import (
    CostModel,
    EpochPlan,
    Packing,
    Pipeline,
    PlanStats,
    ScheduleConfig,
    Scheduler,
    ShufflePolicy,
    StepPlan,
    plan_step,
)
from chronica.core.packing.outliers import OutlierDelay, OutlierQueue
from chronica.core.streaming.options import StreamOptions

if TYPE_CHECKING:
    from chronica import jax, runtime, tf, torch
    from chronica.runtime import DynamicOptions

__version__ = "0.3.0.dev0"

__all__ = [
    "CostModel",
    "DynamicOptions",
    "EpochPlan",
    "OutlierDelay",
    "OutlierQueue",
    "Packing",
    "Pipeline",
    "PlanStats",
    "ScheduleConfig",
    "Scheduler",
    "ShufflePolicy",
    "StepPlan",
    "StreamOptions",
    "__version__",
    "jax",
    "plan_step",
    "runtime",
    "tf",
    "torch",
]

_SUBMODULES = ("jax", "runtime", "tf", "torch")


def __getattr__(name: str) -> Any:
    # PEP 562: import a framework face only when it is first used.
    if name in _SUBMODULES:
        return importlib.import_module(f"chronica.{name}")
    if name == "DynamicOptions":
        return importlib.import_module("chronica.runtime").DynamicOptions
    raise AttributeError(f"module 'chronica' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
