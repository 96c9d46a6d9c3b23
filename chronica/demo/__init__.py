"""``chronica demo``: torch's ``DistributedSampler`` against chronica's, in a real distributed job.

The demo starts ``--world-size`` (default 2) Python processes that form a ``torch.distributed``
group (gloo over loopback), each on one CPU thread. They train a small sequence classifier
with per-sequence attention (its cost grows with the square of a sequence's length) on
long-tailed token lengths, with ``torch.utils.data.DistributedSampler`` and with
``chronica.torch.utils.data.DistributedSampler``: for each of ``--seeds`` model
initialisations, one run per sampler from that same initialisation, the runs' steps
interleaved so that a busy moment of a shared machine falls on every run alike. The model
packs a local batch into one flat token tensor (no padding), so the slowest rank sets the pace
of every step.

Before training, the ranks time a few calibration steps and fit chronica's cost model
(``CostModel.fit``) to their measured CPU time; the model is refitted after every epoch to
every step measured so far, and chronica plans with it.

Measured per rank and step: the CPU time of the rank's own forward and backward passes
(``ComputeTimer``: thread CPU time up to the moment its gradients are ready for the
all-reduce), which other processes on a shared machine do not stretch, unlike wall time. The
report gives per sampler the measured per-step slowest/mean rank compute, the same ratio
predicted by the cost model, the slowest rank's compute (the headline speed-up) and rank 0's
wall clock, held-out loss and accuracy over the seeds, and what the simulator
(``chronica.sim``) predicts for the same calibrated job on 8 to 1024 ranks.

Modules: ``config`` (what a run depends on; no torch), ``cli`` (the command line), ``launch``
(starts and watches the ranks), ``worker`` (one rank's calibration and training; imports
torch), ``model`` (the packed data set and classifier; imports torch), ``calibrate`` (the
robust cost fit; no torch), ``report`` (the figures and the table) and ``scale`` (the
simulated projection). Importing this package does not import torch; the model's names load
it on first use.
"""

from __future__ import annotations

from typing import Any

from chronica.core.cost import CostModel
from chronica.demo.calibrate import calibration_batches, fit_cost, predict
from chronica.demo.cli import main, parse_args
from chronica.demo.config import DemoConfig, cost_model_for, load_lengths, make_lengths
from chronica.demo.launch import DemoError, launch
from chronica.demo.report import format_report, noise_floor, summarize

__all__ = [
    "CostModel",
    "DemoConfig",
    "DemoError",
    "PackedBatch",
    "PackedClassifier",
    "PackedTokens",
    "calibration_batches",
    "collate_packed",
    "cost_model_for",
    "fit_cost",
    "format_report",
    "launch",
    "load_lengths",
    "main",
    "make_lengths",
    "noise_floor",
    "packed_max_tokens",
    "parse_args",
    "predict",
    "project",
    "summarize",
]

_TORCH_NAMES = ("PackedBatch", "PackedClassifier", "PackedTokens", "collate_packed")
_SIM_NAMES = ("packed_max_tokens", "project")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:  # imports torch
        from chronica.demo import model

        return getattr(model, name)
    if name in _SIM_NAMES:  # imports the simulator
        from chronica.demo import scale

        return getattr(scale, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
