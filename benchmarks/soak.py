"""Soak: the coordinator serving 1024 ranks on loopback for a bounded time.

The plan-delivery measurement of ``dynamic.py`` (a real ``Coordinator`` in this process, W
real ``PlanClient`` s as threads of two further processes, driven as ``DynamicSession``
drives them: ``plan()`` per window, ``prefetch()`` at mid-window, one ``report()`` per step,
ranks in lock-step) at W = 1024 for about two minutes (30 s in quick mode). Reported: plan
delivery latency (p50/p99/max), the coordinator process's resident memory over time (the
planner keeps two epochs, so it levels off after the second) and its slope over the second
half of the run, PUB messages a rank missed
(gaps, recovered by fetch) and windows a rank never received (fallbacks: dropped even after
recovery; must be 0). Then the coordinator alone, in a fresh process, for 30 epochs (10 in
quick mode): its resident memory after each epoch, without ZeroMQ queues for lagging ranks.

    python -m benchmarks --only soak
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import dynamic
from benchmarks.common import rss_bytes
from chronica.comm.coordinator import Coordinator

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "python -m benchmarks --only soak"
WORLD = 1024
STEPS = 32  # per epoch; windows of dynamic.DELIVERY_WINDOW steps
STEP_SECONDS = 0.5  # 1024 reports per step: about 2,000 messages a second into the coordinator


def _coordinator_alone(epochs: int, out: Any) -> None:
    """The coordinator's own state over many epochs, without clients or sockets traffic:
    every window planned and published (to no subscriber), every rank's report of every
    step observed; this process's RSS after each epoch."""
    scheduler = dynamic.delivery_scheduler(WORLD, STEPS)
    coordinator = Coordinator(scheduler, "127.0.0.1", 0).start()
    rss = []
    try:
        for epoch in range(epochs):
            for first in range(0, STEPS, dynamic.DELIVERY_WINDOW):
                coordinator._ensure(epoch, first)
                for step in range(first, first + dynamic.DELIVERY_WINDOW):
                    for rank in range(WORLD):
                        coordinator.planner.observe(rank, step, 100.0, 0.01 * (1 + rank % 3))
            rss.append(rss_bytes() / 2**20)
    finally:
        coordinator.close()
    out.put(rss)


def _alone(epochs: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    process = ctx.Process(target=_coordinator_alone, args=(epochs, out), daemon=True)
    process.start()
    rss = out.get(timeout=600)
    process.join(30)
    half = np.asarray(rss[len(rss) // 2 :])
    return {
        "epochs": epochs,
        "rss_mib": [round(v, 1) for v in rss],
        "second_half_min_max": [float(half.min()), float(half.max())],
        "second_half_mib_per_epoch": float(np.polyfit(np.arange(half.size), half, 1)[0]),
    }


def run(quick: bool) -> dict[str, Any]:
    """One soak at W=1024: about 30 s (quick) or 2 min (full) of lock-step training; then
    the coordinator alone over 10 (quick) or 30 epochs."""
    epochs = 2 if quick else 7
    case = dynamic._delivery(WORLD, epochs, STEPS, STEP_SECONDS)
    # Only what the page shows: the per-(rank, window) samples run to 10^5 values.
    case.pop("samples_ms")
    case["alone"] = _alone(10 if quick else 30)
    return case


def format_table(result: dict[str, Any]) -> str:
    """The figures as text."""
    pub, req = result["publish_to_rank"], result["request_to_rank"]
    mem = result["memory"]
    return "\n".join(
        [
            f"soak: {result['world']} ranks, {result['epochs']} epochs x "
            f"{result['steps_per_epoch']} steps of {result['step_seconds']} s, "
            f"{result['seconds']:.0f} s in all, finished={result['finished']}",
            f"  publish -> rank p50/p99/max: {1e3 * pub['p50']:.1f} / {1e3 * pub['p99']:.1f} / "
            f"{1e3 * pub['max']:.1f} ms over {pub['n']} deliveries",
            f"  request -> rank p50/p99: {1e3 * req['p50']:.1f} / {1e3 * req['p99']:.1f} ms",
            f"  coordinator RSS: start {mem['start_mib']:.0f} MiB, half-way "
            f"{mem['half_mib']:.0f}, end {mem['end_mib']:.0f}, peak {mem['peak_mib']:.0f}; "
            f"second half {mem['second_half_mib_per_min']:+.2f} MiB/min",
            f"  coordinator alone over {result['alone']['epochs']} epochs: RSS "
            f"{result['alone']['second_half_min_max'][0]:.0f}-"
            f"{result['alone']['second_half_min_max'][1]:.0f} MiB in the second half, "
            f"{result['alone']['second_half_mib_per_epoch']:+.2f} MiB/epoch",
            f"  gaps (PUB missed, fetched): {result['gaps']}; windows never received "
            f"(fallbacks): {result['fallbacks']}; coordinator: {result['coordinator']}",
        ]
    )


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, mib = zip(*result["memory"]["samples"], strict=True)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(t, mib, lw=1.2)
    ax.set_xlabel("seconds into the soak")
    ax.set_ylabel("coordinator process RSS (MiB)")
    ax.set_ylim(0, max(mib) * 1.15)
    ax.set_title(f"Coordinator memory serving {result['world']} ranks on loopback")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The page's soak section, with its memory plot."""
    _plot(result, img_dir / "soak_memory.png")
    img = img_dir.name
    pub, req, wait = result["publish_to_rank"], result["request_to_rank"], result["step_wait"]
    mem, alone = result["memory"], result["alone"]
    return "\n".join(
        [
            "## Soak: the coordinator serving 1024 ranks",
            "",
            f"A real `Coordinator` (ZeroMQ ROUTER + PUB on 127.0.0.1, a thread of the "
            f"benchmark's process) and {result['world']} real `PlanClient`s, threads of "
            f"{result['client_processes']} further processes on this 2-core machine, driven "
            f"as in training (see *Plan delivery* above: `plan()` per window, `prefetch()` at "
            f"mid-window, one `report()` per step, ranks in lock-step) for "
            f"{result['epochs']} epochs of {result['steps_per_epoch']} steps of "
            f"{1e3 * result['step_seconds']:.0f} ms ({result['seconds']:.0f} s with set-up), "
            f"global batch {result['global_batch']}, {result['window']} steps per window. "
            f"Every rank's plan and report go through the one coordinator thread: "
            f"{result['coordinator']['reports']} reports, {result['coordinator']['fetches']} "
            f"fetches and {result['coordinator']['windows']} windows of "
            f"{result['world']} messages each. Nothing is injected: faults are covered by the "
            f"tests (`tests/adapters/torch/test_faults.py`). The process's memory also holds "
            f"ZeroMQ's queues for ranks that lag behind (up to the p99 below), so it is "
            f"measured a second way: the coordinator alone in a fresh process for "
            f"{alone['epochs']} epochs, "
            f"every window planned and published and every rank's report of every step "
            f"taken, with no client connected.",
            "",
            "| figure | value |",
            "|---|---:|",
            f"| publish → rank p50 / p99 / max (ms) | {1e3 * pub['p50']:.1f} / "
            f"{1e3 * pub['p99']:.1f} / {1e3 * pub['max']:.1f} |",
            f"| request → rank p50 / p99 (ms) | {1e3 * req['p50']:.1f} / {1e3 * req['p99']:.1f} |",
            f"| step wait for its plan p50 / p99 (ms) | {1e3 * wait['p50']:.2f} / "
            f"{1e3 * wait['p99']:.2f} |",
            f"| plan in hand before its window | {result['in_hand']:.1%} |",
            f"| coordinator RSS start / half-way / end / peak (MiB) | {mem['start_mib']:.0f} / "
            f"{mem['half_mib']:.0f} / {mem['end_mib']:.0f} / {mem['peak_mib']:.0f} |",
            f"| RSS slope over the second half (MiB/min) | {mem['second_half_mib_per_min']:+.2f} |",
            f"| coordinator alone, {alone['epochs']} epochs: RSS over the second half "
            f"(MiB), trend | {alone['second_half_min_max'][0]:.0f}–"
            f"{alone['second_half_min_max'][1]:.0f}, "
            f"{alone['second_half_mib_per_epoch']:+.2f} per epoch |",
            f"| PUB messages missed, recovered by fetch (gaps) | {result['gaps']} |",
            f"| windows a rank never received (dropped after recovery) | {result['fallbacks']} |",
            f"| every rank finished | {'yes' if result['finished'] else 'no'} |",
            "",
            f"![coordinator memory]({img}/soak_memory.png)",
            "",
            f"Reproduce: `{REPRODUCE}` (`--quick`: 2 epochs instead of 7).",
            "",
        ]
    )
