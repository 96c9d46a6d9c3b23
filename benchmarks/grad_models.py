"""The workloads of the gradient benchmarks (``benchmarks/gradsched.py``,
``benchmarks/grad_sim_validation.py``): the models, their per-rank batches and the variants'
``ScheduledOptimizer`` knobs, in one place both import."""

from __future__ import annotations

__all__ = [
    "AUTO_BATCH",
    "GRID",
    "MODELS",
    "OUTSIDE",
    "VARIANTS",
    "WHOLE",
    "input_shape",
    "knobs_for",
    "model",
]

WHOLE = "whole"  # partition_bytes = the largest gradient's bytes: no tensor is cut

# Each variant: None (no chronica: plain training, see gradsched's DDP_ARGS) or
# ScheduledOptimizer's knobs.
VARIANTS: dict[str, dict | None] = {
    "no overlap": None,
    "DDP": None,
    "DDP static_graph": None,
    "DDP bucket_cap_mb=2": None,
    "DDP bucket_cap_mb=0.5": None,
    "DDP again": None,
    "chronica auto": {"mode": "auto"},
    "chronica bucketed": {"mode": "bucketed"},
    "FIFO": {
        "mode": "scheduled",
        "order": "fifo",
        "partition_bytes": WHOLE,
        "credit_bytes": 1 << 40,
    },
    "priority": {
        "mode": "scheduled",
        "order": "priority",
        "partition_bytes": WHOLE,
        "credit_bytes": 1,
    },
    "priority+partition+credit": {
        "mode": "scheduled",
        "order": "priority",
        "partition_bytes": 256 << 10,
        "credit_bytes": 1 << 20,
    },
    "auto-tuned": {"mode": "scheduled", "order": "priority", "auto_tune": True},
    # The settings chronica auto searches (chronica.runtime.auto.candidates), each fixed:
    # partitions no bigger than all the gradients, credit four partitions.
    "scheduled 256 KiB": {"mode": "scheduled", "partition_bytes": 256 << 10, "credit_parts": 4},
    "scheduled 1 MiB": {"mode": "scheduled", "partition_bytes": 1 << 20, "credit_parts": 4},
    "scheduled 4 MiB": {"mode": "scheduled", "partition_bytes": 4 << 20, "credit_parts": 4},
    # Settings outside that search (``OUTSIDE``), measured only where named (``--only``).
    "scheduled 128 KiB": {"mode": "scheduled", "partition_bytes": 128 << 10, "credit_parts": 4},
    "scheduled 512 KiB": {"mode": "scheduled", "partition_bytes": 512 << 10, "credit_parts": 4},
    "scheduled 256 KiB (credit 2)": {
        "mode": "scheduled",
        "partition_bytes": 256 << 10,
        "credit_parts": 2,
    },
    "scheduled 256 KiB (credit 8)": {
        "mode": "scheduled",
        "partition_bytes": 256 << 10,
        "credit_parts": 8,
    },
}
GRID = ("scheduled 256 KiB", "scheduled 1 MiB", "scheduled 4 MiB")  # credit: 4 partitions
OUTSIDE = (
    "scheduled 128 KiB",
    "scheduled 512 KiB",
    "scheduled 256 KiB (credit 2)",
    "scheduled 256 KiB (credit 8)",
)
# The auto target's batches, chosen when the two ranks shared both cores: pinned to one core
# each, their compute lasts about a third of vgg's and mlp's all-reduce at 100 Mbit/s, so the
# link caps the gain there (vgg: DDP's step over the link's time, about 1.15x).
AUTO_BATCH = {"vgg": 64, "mlp": 1536}
MODELS = {"vgg": 32, "mlp": 1024, "mlp670k": 128}  # name -> per-rank batch


def knobs_for(variant: str, net) -> dict:
    """``ScheduledOptimizer``'s arguments for ``variant`` on ``net`` (empty for DDP and
    the other plain variants): ``WHOLE`` partitions as big as the largest gradient, the
    ``GRID`` settings cut as ``chronica.runtime.auto.candidates`` cuts them (partitions no
    bigger than all the gradients, a credit of four partitions).

    Args:
        variant: one of ``VARIANTS``.
        net: the model it trains (its parameters size the partitions).

    Example::

        >>> knobs_for("DDP", model("mlp"))   # doctest: +SKIP
        {}
    """
    knobs = dict(VARIANTS[variant] or {})
    sizes = [4 * p.numel() for p in net.parameters()]
    if knobs.get("partition_bytes") == WHOLE:
        knobs["partition_bytes"] = max(sizes)
    if "credit_parts" in knobs:  # cut as chronica.runtime.auto.candidates cuts
        knobs["partition_bytes"] = min(knobs["partition_bytes"], sum(sizes))
        knobs["credit_bytes"] = knobs.pop("credit_parts") * knobs["partition_bytes"]
    return knobs


def input_shape(name: str, batch: int) -> tuple[int, ...]:
    """The input of ``model(name)`` for ``batch`` samples.

    Args:
        name: one of ``MODELS``.
        batch: samples.

    Example::

        >>> input_shape("vgg", 2)
        (2, 3, 32, 32)
    """
    return {"vgg": (batch, 3, 32, 32), "mlp670k": (batch, 784)}.get(name, (batch, 512))


def model(name: str):
    """A fresh ``torch.nn.Sequential`` for model ``name`` (one of ``MODELS``).

    Args:
        name: ``"vgg"``, ``"mlp"`` or ``"mlp670k"``.

    Example::

        >>> model("mlp")   # doctest: +SKIP
    """
    from torch import nn

    if name == "vgg":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )
    if name == "mlp670k":  # 784-512-512-10: 669,706 parameters, an MNIST-sized classifier
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    layers = [m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(512, 10))
