"""Presenting a simulation: the printed table and the PNG plots (matplotlib, loaded lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chronica.sim.engine import SimulationResult

__all__ = ["format_table", "plot"]


def format_table(result: SimulationResult) -> str:
    """The comparison as fixed-width text: one line per configuration, torch's first."""
    o = result.options
    ar = o.allreduce
    steps = result.results[0].steps
    lines = [
        f"chronica simulate: N={result.num_samples:,} samples (mean size "
        f"{result.sizes_mean:.4g}, max {result.sizes_max:.4g}), W={o.world} ranks, global "
        f"batch {o.global_batch} ({o.global_batch // o.world} per rank), {steps} steps in "
        f"{o.epochs} epoch(s), cost {_cost(o.cost.to_tuple())}, speeds {o.speeds}",
        f"per step: all-reduce {1e3 * result.allreduce_s:.3g} ms ({ar.algorithm}, "
        f"{ar.grad_bytes:.3g} B of gradients, {ar.bandwidth:.3g} B/s, latency "
        f"{1e6 * ar.latency_s:.3g} us); compute {o.compute.seconds_per_cost:.3g} s per cost "
        f"unit, fixed {o.compute.fixed_s:.3g} s, overhead {o.compute.overhead_s:.3g} s, "
        f"noise sigma {o.compute.noise:g}",
        "",
        f"{'config':28}{'step ms':>9}{'total s':>10}{'speed-up':>10}{'idle':>7}"
        f"{'max/mean':>10}{'padding':>9}{'moved/epoch':>13}",
    ]
    for r in result.results:
        lines.append(
            f"{r.label[:27]:28}{1e3 * r.mean_step_s:9.2f}{r.total_s:10.3f}{r.speedup:9.3f}x"
            f"{r.idle_fraction:7.1%}{r.load_ratio:10.3f}{r.padding:9.1%}"
            f"{r.moved_per_epoch:13,.0f}"
        )
    delayed = [r for r in result.results if r.delay]
    if delayed:
        lines += [
            "",
            f"{'outlier delay':28}{'max/mean worst':>16}{'delay mean':>12}{'p99':>6}{'max':>6}",
        ]
        lines += [
            f"{r.label[:27]:28}{r.load_ratio_worst:16.3f}{r.delay['mean']:12.2f}"
            f"{r.delay['p99']:6.0f}{r.delay['max']:6.0f}"
            for r in delayed
        ]
    lines += [
        "",
        "speed-up: torch's total time / the config's; idle: share of rank compute time spent "
        "waiting for the slowest rank; max/mean: per-step rank load (predicted cost); "
        "padding: padded tokens / real tokens (each local batch padded to its longest "
        "sample); moved/epoch: samples nodes fetch that they do not hold",
        f"simulated in {result.wall_s:.1f} s",
    ]
    return "\n".join(lines)


def plot(result: SimulationResult, path: str | Path) -> Path:
    """Write a PNG with four panels: speed-up vs torch, idle fraction, padding (bars per
    configuration) and the step time over the run (a line per configuration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = [r.label for r in result.results]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(labels))]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = (
        (axes[0, 0], [r.speedup for r in result.results], "speed-up vs torch (×)"),
        (axes[0, 1], [100 * r.idle_fraction for r in result.results], "idle rank time (%)"),
        (axes[1, 0], [100 * r.padding for r in result.results], "padding / real tokens (%)"),
    )
    y = np.arange(len(labels))
    for ax, values, title in panels:
        ax.barh(y, values, color=colors)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.3g}", va="center", fontsize=8)
    ax = axes[1, 1]
    for r, color in zip(result.results, colors, strict=True):
        ax.plot(1e3 * r.step_s, color=color, lw=1, label=r.label)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("step time over the run")
    ax.legend(fontsize=7)
    o = result.options
    fig.suptitle(
        f"chronica simulate: N={result.num_samples:,}, W={o.world}, global batch "
        f"{o.batch_size}, speeds {o.speeds}, cost {_cost(o.cost.to_tuple())}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cost(coefficients: tuple[float, float, float]) -> str:
    a, b, c = coefficients
    if (a, b, c) == (0.0, 1.0, 0.0):
        return "linear"
    return f"{a:g}+{b:g}*s+{c:g}*s^2"
