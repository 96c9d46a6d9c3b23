"""``chronica demo``: torch's ``DistributedSampler`` against chronica's, in a real distributed job.

The demo starts ``--world-size`` (default 2) Python processes that form a ``torch.distributed``
group (gloo over loopback), each on one CPU thread. They train a small sequence classifier on
variable-length token sequences twice, with the same model initialisation, the same data and
the same number of steps: once with ``torch.utils.data.DistributedSampler`` and once with
``chronica.torch.utils.data.DistributedSampler``. The two runs alternate epochs (ABBA order),
so a busy moment of a shared machine does not land on one sampler only. The model packs a
local batch into one flat token tensor, so its compute is proportional to the local batch's
token count (no padding) and the slowest rank sets the pace of every step.

Measured per rank and step: the rank's own compute time (forward and backward up to the moment
its gradients are ready for the all-reduce, taken in a DDP communication hook), because the
synchronised wall time of a step is the same on every rank. The table reports the per-step
max/mean of those times, the same ratio predicted from the sizes, and rank 0's wall-clock epoch
time, including data loading and synchronisation.

Modules: ``config`` (what a run depends on; no torch), ``cli`` (the command line), ``launch``
(starts and watches the ranks), ``worker`` (one rank's training; imports torch), ``model``
(the packed data set and classifier; imports torch) and ``report`` (the table). Importing this
package does not import torch; the model's names load it on first use.
"""

from __future__ import annotations

from typing import Any

from chronica.demo.cli import main, parse_args
from chronica.demo.config import DemoConfig, cost_model_for, load_lengths, make_lengths
from chronica.demo.launch import DemoError, launch
from chronica.demo.report import format_report

__all__ = [
    "DemoConfig",
    "DemoError",
    "PackedBatch",
    "PackedClassifier",
    "PackedTokens",
    "collate_packed",
    "cost_model_for",
    "format_report",
    "launch",
    "load_lengths",
    "main",
    "make_lengths",
    "parse_args",
]

_TORCH_NAMES = ("PackedBatch", "PackedClassifier", "PackedTokens", "collate_packed")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:  # imports torch
        from chronica.demo import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
