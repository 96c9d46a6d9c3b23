"""The demo's table: measured and predicted balance, epoch time, loss and speed-up."""

from __future__ import annotations

from typing import Any

import numpy as np

from chronica.demo.config import DemoConfig

__all__ = ["format_report"]


def _ratios(loads: np.ndarray) -> np.ndarray:
    """Per-step max/mean over ranks; steps without load count as balanced."""
    mean = loads.mean(axis=1)
    return np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)


def format_report(config: DemoConfig, results: dict[str, Any], elapsed_s: float) -> str:
    """The demo's table: measured and predicted per-step max/mean rank load, epoch time,
    final-epoch loss and accuracy for each sampler, and the measured speed-up."""
    world, b = config.world_size, config.batch_size
    lengths = np.asarray(config.lengths)
    first = next(iter(results.values()))
    lines = [
        f"chronica demo: {world} processes (torch.distributed, gloo, 1 thread each), "
        f"{len(lengths)} samples, global batch {b} ({b // world} per rank), "
        f"{first['steps_per_epoch']} steps x {config.epochs} epochs, kind={config.kind}, "
        f"cost={config.cost}, rank speeds {config.speeds}",
        f"token lengths: {config.lengths_source}; mean {lengths.mean():.0f}, max {lengths.max()}",
        "",
        f"{'':10}{'per-step max/mean rank load':^30}",
        f"{'sampler':10}{'measured':^15}{'predicted':^15}{'epoch time':>12}"
        f"{'loss':>8}{'accuracy':>10}{'cpu share':>11}",
        f"{'':10}{'mean':>7}{'worst':>8}{'mean':>7}{'worst':>8}",
    ]
    epoch_time: dict[str, float] = {}
    lowest_share = 1.0
    for name, record in results.items():
        compute = np.asarray(record["compute"])
        measured = _ratios(compute)
        predicted = _ratios(np.asarray(record["predicted"]))
        native = float(np.sum(record["compute_native"]))
        share = float(np.sum(record["compute_cpu"]) / max(native, 1e-12))
        lowest_share = min(lowest_share, share)
        epoch_time[name] = float(np.mean(record["epoch_times"]))
        lines.append(
            f"{name:10}{measured.mean():7.2f}{measured.max():8.2f}"
            f"{predicted.mean():7.2f}{predicted.max():8.2f}"
            f"{epoch_time[name]:10.2f} s{record['loss']:8.3f}{record['accuracy']:9.1%}"
            f"{share:10.0%}"
        )
    lines.append("")
    for name in ("chronica", "dynamic"):
        if "torch" in epoch_time and name in epoch_time:
            speedup = epoch_time["torch"] / epoch_time[name]
            lines.append(
                f"speed-up of {name} (torch epoch time / {name} epoch time, measured in this "
                f"run): {speedup:.2f}x"
            )
    chronica = results.get("chronica", {})
    if "bound_mean" in chronica:
        lines.append(
            f"best any equal-count split of chronica's steps could predict: mean "
            f"{chronica['bound_mean']:.2f}, worst {chronica['bound_worst']:.2f} "
            f"(a step cannot beat its largest sample)"
        )
    lines.append(
        f"measured load = each rank's own forward+backward time per step (times its emulated "
        f"slowdown); epoch time = rank 0 wall clock, mean of {config.epochs}; cpu share = CPU "
        f"time / wall time while computing; dynamic = kind='dynamic', variable_batch=True"
    )
    if lowest_share < 0.9:
        lines.append(
            f"note: ranks got only {lowest_share:.0%} of a core while computing (other processes, "
            f"or more ranks than cores, competed for the CPUs), so these timings are noisy"
        )
    lines.append(f"whole demo: {elapsed_s:.0f} s")
    return "\n".join(lines)
