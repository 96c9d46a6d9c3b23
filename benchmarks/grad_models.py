"""The workloads of the gradient benchmarks (``benchmarks/gradsched.py``,
``benchmarks/grad_sim_validation.py``): the models, their per-rank batches and the variants'
``ScheduledOptimizer`` knobs, in one place both import."""

from __future__ import annotations

__all__ = [
    "AUTO_BATCH",
    "AUTO_COMPUTE_MS",
    "GRID",
    "MODELS",
    "OUTSIDE",
    "VARIANTS",
    "WHOLE",
    "compute_ms",
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
# The auto target's batches: pinned to one core each, their compute (forward, backward, SGD
# step) lasts about as long as the all-reduce of all their gradients at 100 Mbit/s (vgg
# 4,583,336 bytes: 372 ms at the 12.31 MB/s fitted there; mlp 6,324,264 bytes: 514 ms), so
# that priority scheduling can hide most of one behind the other there. Measured per batch
# (``python -m benchmarks.grad_models``: thread CPU time, median of 10 steps after 2, one
# thread pinned to one core) in two runs at load averages 5-8 on 2 cores: vgg 192 323 and
# 355 ms (256: 617 ms, past a cache cliff), mlp 4096 460 and 472 ms; on a quiet machine the
# conv net's figures run lower (vgg 64: 95-101 ms in the last quiet run, 120-177 ms loaded).
AUTO_BATCH = {"vgg": 192, "mlp": 4096}
AUTO_COMPUTE_MS = {"vgg": 323, "mlp": 460}  # those batches' compute, measured as above
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


def compute_ms(name: str, batch: int, repeats: int = 10, warm: int = 2) -> float:
    """Median thread CPU milliseconds of one forward, backward and SGD step of
    ``model(name)`` on ``batch`` samples, on one thread (pin the process to one core first):
    a rank's compute per step, whatever else the machine runs.

    Args:
        name: one of ``MODELS``.
        batch: samples per step.
        repeats: measured steps.
        warm: steps run first, not measured.

    Example::

        >>> compute_ms("mlp", 64, repeats=2)   # doctest: +SKIP
        4.1
    """
    import time

    import numpy as np
    import torch

    torch.manual_seed(0)
    net = model(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(*input_shape(name, batch))
    y = torch.randint(0, 10, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(warm + repeats):
        start = time.thread_time()
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
        times.append(time.thread_time() - start)
    return float(np.median(times[warm:])) * 1e3


def _main() -> None:
    """Print each model's compute per batch size, pinned to one core (``AUTO_COMPUTE_MS``)."""
    import os

    import torch

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    for name, batches in {"vgg": (64, 128, 192, 256), "mlp": (1536, 3072, 4096)}.items():
        for batch in batches:
            print(f"{name} batch {batch}: {compute_ms(name, batch):.0f} ms", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    _main()
