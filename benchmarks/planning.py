"""Planning speed and memory: one epoch's plan next to ``numpy.argsort`` of the same sizes.

N lognormal sizes (10,000,000; 1,000,000 with ``--quick``), W=1024 ranks, global batch
B=65,536. After a warm-up call per variant (numba kernels loaded or compiled), the variants
run in rounds, one call of each per round (interleaved, so a load on the shared machine hits
all of them alike), and every figure is the median over the rounds. Rows:

* ``numpy.argsort(sizes)``: the yardstick;
* chronica's torch sampler, ``chronica.torch.utils.data.DistributedSampler(dataset,
  num_replicas=W, rank=0, batch_size=B, sizes=sizes)``, ``set_epoch(e)`` and its first
  index: construction
  (validation, costs, digest) and the epoch's plan, as a training job pays them;
* ``Scheduler(sizes, config).plan_epoch(e)`` for exact, guided and pool: construct + plan
  with a fresh scheduler; *plan only*: ``plan_epoch(e)`` of a new epoch on one scheduler;
* torch's own ``DistributedSampler``: ``list(sampler)`` for one rank after ``set_epoch(e)``.

Peak memory: in a fresh process (``--quick``: 10^7 samples, else 10^8), the float64 sizes
are made in place, the kernels warmed up on a small slice and the peak resident set size
reset (``/proc/self/clear_refs``); then one exact scheduler is built and plans epochs 0, 1
and 2 (it keeps the two latest plans; from the third on it is in its steady state).
Reported: the peak above the resident size before construction (the sizes already held),
per sample, after each epoch.

Run alone: ``python -m benchmarks --only planning [--quick]``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import LengthOnly, lognormal_sizes, machine_info, rss_bytes
from chronica.core import EpochPlan, ScheduleConfig, Scheduler

__all__ = ["MODES", "TARGETS", "format_table", "render_markdown", "run"]

NUM_REPLICAS = 1024
BATCH_SIZE = 65_536
DATA_SEED = 7
# (key, kind, exact)
MODES = [("exact", "static", True), ("guided", "guided", True), ("pool", "static", False)]
# Construct + plan over argsort, at most (issue 20); the exact target is met through the
# torch sampler.
TARGETS = {"sampler": 1.5, "guided": 2.0, "pool": 3.0}
MEMORY_TARGET = 24.0  # peak bytes per sample above the sizes, at 10^8
REPRODUCE = "python -m benchmarks --only planning"


def _config(kind: str, exact: bool) -> ScheduleConfig:
    return ScheduleConfig(
        num_replicas=NUM_REPLICAS, batch_size=BATCH_SIZE, kind=kind, exact=exact, seed=0
    )


def _plan_anew(sizes: np.ndarray, config: ScheduleConfig, epoch: int) -> EpochPlan:
    """Construct a scheduler and plan ``epoch``: what a job pays for its first plan."""
    return Scheduler(sizes, config).plan_epoch(epoch)


def _variants(sizes: np.ndarray) -> list[tuple[str, str, Callable[[int], object]]]:
    """``(key, label, fn(epoch))`` for every timed row, in round order."""
    n = sizes.shape[0]
    out: list[tuple[str, str, Callable[[int], object]]] = [
        ("argsort", "numpy.argsort(sizes)", lambda e: np.argsort(sizes))
    ]
    try:
        from torch.utils.data import DistributedSampler as TorchSampler

        from chronica.torch.utils.data import DistributedSampler
    except ImportError:  # no torch: its two rows are left out
        with_torch = False
    else:
        with_torch = True
    if with_torch:

        def sampler(epoch: int) -> int:
            chosen = DistributedSampler(
                LengthOnly(n), num_replicas=NUM_REPLICAS, rank=0, batch_size=BATCH_SIZE, sizes=sizes
            )
            chosen.set_epoch(epoch)
            return next(iter(chosen))

        out.append(
            ("sampler", "chronica.torch DistributedSampler: construct, first index", sampler)
        )
    for key, kind, exact in MODES:
        config = _config(kind, exact)
        out.append(
            (
                key,
                f"chronica {key}: Scheduler(...).plan_epoch(e)",
                functools.partial(_plan_anew, sizes, config),
            )
        )
        one = Scheduler(sizes, config)
        out.append((f"{key}_plan_only", f"chronica {key}: plan_epoch(e) only", one.plan_epoch))
    if with_torch:
        torch_sampler = TorchSampler(LengthOnly(n), num_replicas=NUM_REPLICAS, rank=0, seed=0)

        def one_rank(epoch: int) -> list:
            torch_sampler.set_epoch(epoch)
            return list(torch_sampler)

        out.append(("torch", "torch DistributedSampler, one rank's indices", one_rank))
    return out


def _rounds(
    variants: list[tuple[str, str, Callable[[int], object]]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every variant once per round (epoch = round + 1), after one warm-up call each: the
    wall seconds and this process's CPU seconds (all its threads) of every call."""
    import time

    for _, _, fn in variants:
        fn(0)
    wall: dict[str, list[float]] = {key: [] for key, _, _ in variants}
    cpu: dict[str, list[float]] = {key: [] for key, _, _ in variants}
    for epoch in range(1, repeats + 1):
        for key, _, fn in variants:
            started, started_cpu = time.perf_counter(), time.process_time()
            fn(epoch)
            wall[key].append(time.perf_counter() - started)
            cpu[key].append(time.process_time() - started_cpu)
    return wall, cpu


def _peak_memory(n: int) -> dict[str, Any]:
    """Run this module as a fresh process measuring exact planning's peak memory at ``n``."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.planning", "--peak-memory", str(n)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if done.returncode:
        return {"n": n, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _peak_rss() -> int:
    """The peak resident set size since the last reset (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _memory_child(n: int) -> dict[str, Any]:
    """The peak-memory measurement itself (see the module docstring)."""
    import gc

    config = _config("static", True)
    Scheduler(lognormal_sizes(4 * BATCH_SIZE, DATA_SEED), config).plan_epoch(0)
    gc.collect()
    start = rss_bytes()
    sizes = np.random.default_rng(DATA_SEED).lognormal(5.0, 1.0, n)
    np.rint(sizes, out=sizes)  # lognormal_sizes' values, made without temporaries
    np.maximum(sizes, 1.0, out=sizes)
    base = rss_bytes()
    _reset_peak()
    scheduler = Scheduler(sizes, config)
    scheduler.plan_epoch(0)
    first = _peak_rss()
    scheduler.plan_epoch(1)
    second = _peak_rss()
    scheduler.plan_epoch(2)
    third = _peak_rss()
    return {
        "n": n,
        "sizes_bytes": base - start,
        "first_epoch_bytes_per_sample": (first - base) / n,
        "second_epoch_bytes_per_sample": (second - base) / n,
        "third_epoch_bytes_per_sample": (third - base) / n,
        "with_sizes_bytes_per_sample": (third - start) / n,
    }


def run(quick: bool) -> dict:
    """Time every row and measure the peak memory (see the module docstring)."""
    n = 1_000_000 if quick else 10_000_000
    repeats = 3 if quick else 5
    sizes = lognormal_sizes(n, DATA_SEED)
    variants = _variants(sizes)
    load_before = os.getloadavg()[0]
    times, cpu = _rounds(variants, repeats)
    load_after = os.getloadavg()[0]
    medians = {key: float(np.median(values)) for key, values in times.items()}
    cpu_medians = {key: float(np.median(values)) for key, values in cpu.items()}
    rows: list[dict[str, Any]] = [
        {
            "key": key,
            "label": label,
            "seconds": medians[key],
            "all": times[key],
            "ratio_to_argsort": medians[key] / medians["argsort"],
            "cpu_seconds": cpu_medians[key],
            "cpu_all": cpu[key],
            "cpu_ratio_to_argsort": cpu_medians[key] / cpu_medians["argsort"],
        }
        for key, label, _ in variants
    ]
    for row in rows:
        if row["key"] in TARGETS:
            row["target"] = TARGETS[row["key"]]
            row["meets_target"] = row["ratio_to_argsort"] <= row["target"]
    del variants, sizes
    memory = _peak_memory(10**7 if quick else 10**8)
    return {
        "name": "planning",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "command": REPRODUCE + (" --quick" if quick else ""),
        "num_samples": n,
        "num_replicas": NUM_REPLICAS,
        "batch_size": BATCH_SIZE,
        "repeats": repeats,
        "data_seed": DATA_SEED,
        "steps": -(-n // BATCH_SIZE),
        "rows": rows,
        "load_average": [load_before, load_after],
        "cores": os.cpu_count(),
        "memory": memory,
        "memory_target": MEMORY_TARGET,
    }


def _verdict(row: dict, fail: str) -> str | None:
    """``pass`` or ``fail`` for a row with a target, else ``None``."""
    if "target" not in row:
        return None
    return "pass" if row["meets_target"] else fail


def format_table(result: dict) -> str:
    """A plain-text table of the medians and the peak memory."""
    lines = [
        f"N={result['num_samples']:,}  W={result['num_replicas']}  B={result['batch_size']:,}  "
        f"(median of {result['repeats']} interleaved rounds)"
    ]
    for row in result["rows"]:
        verdict = _verdict(row, "FAIL")
        target = "" if verdict is None else f"  target <= {row['target']}x: {verdict}"
        lines.append(
            f"  {row['label']:58s} {row['seconds']:8.3f} s  "
            f"{row['ratio_to_argsort']:6.2f}x argsort  (CPU {row['cpu_seconds']:.3f} s, "
            f"{row['cpu_ratio_to_argsort']:.2f}x){target}"
        )
    memory = result["memory"]
    if "error" in memory:
        lines.append(f"  peak memory at N={memory['n']:,}: failed: {memory['error']}")
    else:
        lines.append(
            f"  peak memory at N={memory['n']:,}, above the sizes, B/sample after epochs 0, 1, "
            f"2: {memory['first_epoch_bytes_per_sample']:.1f}, "
            f"{memory['second_epoch_bytes_per_sample']:.1f}, "
            f"{memory['third_epoch_bytes_per_sample']:.1f}"
        )
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8.5, 0.5 * len(rows) + 1.4))
    seconds = [row["seconds"] for row in rows]
    colors = ["tab:gray" if row["key"] in ("argsort", "torch") else "tab:blue" for row in rows]
    ax.barh(range(len(rows)), seconds, color=colors, alpha=0.85)
    for i, row in enumerate(rows):
        lo, hi = min(row["all"]), max(row["all"])
        ax.plot([lo, hi], [i, i], color="black", linewidth=1)
        note = f" {row['seconds']:.2f} s ({row['ratio_to_argsort']:.2f}x"
        note += f", target {row['target']}x)" if "target" in row else ")"
        ax.text(hi, i, note, va="center", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([row["label"] for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median; line: range of the rounds)")
    ax.set_xlim(0, max(max(row["all"]) for row in rows) * 1.45)
    ax.set_title(
        f"Planning one epoch: N={result['num_samples']:,}, W={result['num_replicas']}, "
        f"B={result['batch_size']:,}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(result: dict, img_dir: Path) -> str:
    """The page's planning section, with its plot written to ``img_dir``."""
    _plot(result, Path(img_dir) / "planning.png")
    memory = result["memory"]
    out = [
        "## Planning speed",
        "",
        f"Mode `{result['mode']}`: N={result['num_samples']:,} lognormal(5, 1) integer sizes "
        f"(float64), W={result['num_replicas']}, B={result['batch_size']:,} "
        f"({result['steps']} steps). After a warm-up call per row (numba kernels loaded or "
        f"compiled), the rows run in {result['repeats']} interleaved rounds (one call of "
        "each per round, a new epoch every round) and every figure is the median over the "
        "rounds, next to their range (the machine is shared). *× argsort* divides by "
        "`numpy.argsort(sizes)` of the same run. The sampler row is what a torch job pays "
        "before its first batch: `chronica.torch.utils.data.DistributedSampler(dataset, "
        "num_replicas=W, rank=0, batch_size=B, sizes=sizes)`, `set_epoch(e)` and the first "
        "index (construction: validation, costs, digest; then the epoch's exact plan). "
        "*Scheduler* rows: construct + plan with a fresh `Scheduler(sizes, config)`; *plan "
        "only*: `plan_epoch(e)` of a new epoch on one scheduler. torch's own "
        "`DistributedSampler` is `list(sampler)` for one rank after `set_epoch(e)`.",
        "",
        "| what | seconds (median) | range of rounds (s) | × argsort | target | CPU seconds "
        "(median) | CPU × argsort |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for row in result["rows"]:
        verdict = _verdict(row, "**FAIL**")
        target = "–" if verdict is None else f"≤ {row['target']}×: {verdict}"
        out.append(
            f"| {row['label']} | {row['seconds']:.3f} | "
            f"{min(row['all']):.3f}–{max(row['all']):.3f} | {row['ratio_to_argsort']:.2f} | "
            f"{target} | {row['cpu_seconds']:.3f} | {row['cpu_ratio_to_argsort']:.2f} |"
        )
    load = result["load_average"]
    out += [
        "",
        f"The machine ({result['cores']} cores) is shared: its 1-minute load average was "
        f"{load[0]:.1f} when the rounds started and {load[1]:.1f} when they ended. Other "
        "processes slow numpy's single-threaded argsort as much as chronica, or more, so "
        "the CPU columns (this process's CPU time, all its threads) are shown as well: "
        "they count the work, whatever else runs; chronica's balancing runs on up to "
        "min(cores, 8) threads, so on an idle machine its wall time is below its CPU time.",
    ]
    out += ["", "![planning time](img/planning.png)", ""]
    if "error" in memory:
        out += [
            f"Peak memory at N={memory['n']:,}: the measurement failed ({memory['error']}).",
            "",
        ]
    else:
        steady = memory["third_epoch_bytes_per_sample"]
        verdict = "pass" if steady <= result["memory_target"] else "**FAIL**"
        out += [
            f"**Peak memory** (exact, N={memory['n']:,}, same W and B), in a fresh process: "
            "the float64 sizes made in place, the kernels warmed up, the peak resident set "
            "size reset; then one scheduler built and epochs 0, 1 and 2 planned in turn (the "
            "scheduler keeps the two latest plans, int64 indices each, and lets the older one "
            "go when it plans a third). The peak above the resident size before "
            "construction, per sample: "
            f"{memory['first_epoch_bytes_per_sample']:.1f} bytes after epoch 0, "
            f"{memory['second_epoch_bytes_per_sample']:.1f} after epoch 1 and "
            f"**{steady:.1f} from epoch 2 on** (the steady state; target ≤ "
            f"{result['memory_target']:.0f}: {verdict}); "
            f"{memory['with_sizes_bytes_per_sample']:.1f} with the sizes themselves. What "
            "is held: the sizes, which are also the costs under the default linear model; "
            "the epoch's order (int32 below 2^31 samples, padded in place); the cached plan "
            "and the new plan's int64 indices; small per-step buffers of the balancing "
            "threads.",
            "",
        ]
    out += [f"Reproduce: `{result.get('command', REPRODUCE)}`.", ""]
    return "\n".join(out)


if __name__ == "__main__" and sys.argv[1:2] == ["--peak-memory"]:
    print(json.dumps(_memory_child(int(sys.argv[2]))))
