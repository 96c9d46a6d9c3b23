"""The demo's summary (``summarize``) and table (``format_report``); no torch here.

Every figure comes from the ranks' per-step records (``chronica.demo.worker``): a rank's
*compute* is the CPU time of its own forward and backward passes in a step (thread CPU time,
which other processes on a shared machine do not stretch, times its emulated slowdown); the
*predicted* load is the same step's samples under the final calibrated cost model.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np

from chronica.demo.config import DemoConfig, plural

__all__ = ["format_report", "noise_floor", "summarize"]


def _ratios(loads: np.ndarray) -> np.ndarray:
    """Per-step max/mean over ranks; steps without load count as balanced."""
    mean = loads.mean(axis=1)
    return np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)


def _noise(records: list[dict[str, Any]]) -> float:
    """Standard deviation of a rank's measured compute around the prediction, within a
    step (log scale, the step's common factor removed): the measurement noise."""
    deviations = []
    for record in records:
        cpu, pred = np.asarray(record["compute_cpu"]), np.asarray(record["predicted"])
        ok = (cpu > 0).all(axis=1) & (pred > 0).all(axis=1)
        if cpu.shape[1] < 2 or not ok.any():
            continue
        log = np.log(cpu[ok] / pred[ok])
        deviations.append((log - log.mean(axis=1, keepdims=True)).ravel())
    if not deviations:
        return float("nan")
    world = np.asarray(records[0]["compute_cpu"]).shape[1]
    d = np.concatenate(deviations)
    return float(np.sqrt(np.mean(d**2) * world / (world - 1)))


def noise_floor(sigma: float, world: int, draws: int = 20_000) -> float:
    """Mean max/mean of ``world`` equally loaded ranks whose measured times carry independent
    lognormal noise ``sigma``: what a perfectly balanced plan measures on average."""
    if not np.isfinite(sigma) or world < 2:
        return 1.0
    times = np.exp(sigma * np.random.default_rng(0).standard_normal((draws, world)))
    return float(_ratios(times).mean())


def summarize(config: DemoConfig, results: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the report, per sampler and against torch's sampler."""
    samplers = [name for name in config.samplers if name in results]
    noise = _noise([results[n] for n in samplers])
    out: dict[str, Any] = {
        "samplers": {},
        "noise": noise,
        "noise_floor": noise_floor(noise, config.world_size),
    }
    runs = config.seeds * config.epochs
    for name in samplers:
        record = results[name]
        cpu, pred = np.asarray(record["compute_cpu"]), np.asarray(record["predicted"])
        measured, predicted = _ratios(cpu), _ratios(pred)
        seeds = record["seeds"]
        out["samplers"][name] = {
            "measured": float(measured.mean()),
            "measured_worst": float(measured.max()),
            "predicted": float(predicted.mean()),
            "slowest_total_s": float(cpu.max(axis=1).sum()),
            "predicted_slowest_total": float(pred.max(axis=1).sum()),
            "slowest_per_epoch_s": float(cpu.max(axis=1).sum()) / runs,
            "wall_total_s": float(np.sum(record["wall"])),
            "wall_per_epoch_s": float(np.sum(record["wall"])) / runs,
            "seed_slowest_s": [
                float(np.asarray(s["compute_cpu"]).max(axis=1).sum()) for s in seeds
            ],
            "loss": [float(s["loss"]) for s in seeds],
            "accuracy": [float(s["accuracy"]) for s in seeds],
        }
    base = out["samplers"].get("torch")
    for name, row in out["samplers"].items():
        if base is None or name == "torch":
            continue
        row["speedup"] = base["slowest_total_s"] / row["slowest_total_s"]
        row["speedup_per_seed"] = [
            t / c for t, c in zip(base["seed_slowest_s"], row["seed_slowest_s"], strict=True)
        ]
        row["speedup_from_balance"] = base["measured"] / row["measured"]
        row["speedup_predicted"] = base["predicted_slowest_total"] / row["predicted_slowest_total"]
        row["speedup_wall"] = base["wall_total_s"] / row["wall_total_s"]
        row["loss_difference"] = [c - t for c, t in zip(row["loss"], base["loss"], strict=True)]
    return out


def _wrap(text: str, indent: str = "") -> str:
    """``text`` wrapped at 100 columns, continuation lines indented two more than ``indent``."""
    return textwrap.fill(
        text, 100, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    )


def _mean_sd(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    v = np.asarray(values) * scale
    if v.shape[0] < 2:
        return f"{v.mean():.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def _cost_line(config: DemoConfig, calibration: dict[str, Any]) -> str:
    final = calibration.get("final", calibration)
    a, b, c = final["coefficients"]
    if not calibration.get("steps"):
        return (
            f"cost model (a priori, --calibration-steps 0; relative units): {a:g} + {b:g}·s + "
            f"{c:g}·s² per sample of s tokens"
        )
    model = f"{a * 1e3:.3g} ms + {b * 1e6:.3g} µs·s + {c * 1e9:.3g} ns·s² per sample of s tokens"
    return (
        f"cost model (CPU seconds): {model}; fitted to {calibration['steps']} calibration steps x "
        f"{config.world_size} ranks, refitted after every epoch to all {final['measurements']} "
        f"measured rank-steps ({100 * final['rms_error']:.1f}% rms error)"
    )


def _projection_lines(projection: list[dict[str, Any]], config: DemoConfig) -> list[str]:
    if not projection:
        return []
    worlds = "".join(f"{row['world']:>8}" for row in projection)
    max_tokens = projection[0]["max_tokens"]

    def line(label: str, key: str, suffix: str = "") -> str:
        values = "".join(f"{f'{row[key]:.2f}{suffix}':>8}" for row in projection)
        return f"  {label:30}{values}"

    return [
        "",
        _wrap(
            f"simulated, not measured (chronica.sim.simulate): this run's fitted cost model and "
            f"length distribution, {config.local_batch} samples per rank, compute only"
        ),
        f"  {'ranks':30}{worlds}",
        line("torch slowest/mean", "torch_ratio"),
        line(f"chronica {config.kind} slowest/mean", "chronica_ratio"),
        line("  speed-up", "chronica_speedup", "x"),
        line("chronica packed slowest/mean", "packed_ratio"),
        line("  speed-up", "packed_speedup", "x"),
        _wrap(
            f"packed: chronica.Packing(max_tokens={max_tokens}) on the same global batches, "
            f"token-capped micro-batches whose counts may differ per rank (not run here); a "
            f"step still lasts at least as long as its largest sample",
            "  ",
        ),
    ]


def _pinning_line(pinned: list[int], world: int) -> str:
    if pinned:
        return (
            f"ranks pinned to cores {', '.join(map(str, pinned))}, one thread each: a rank "
            f"that waits cannot lend its core, so the wall clock shows the balance too (other "
            f"processes on those cores still stretch both samplers' steps alike)"
        )
    return (
        f"ranks not pinned (this machine gives these processes fewer cores than {world} "
        f"ranks, or --no-pin): a waiting rank lends its core, so the wall clock gains less "
        f"than the compute"
    )


def format_report(
    config: DemoConfig,
    results: dict[str, Any],
    elapsed_s: float,
    projection: list[dict[str, Any]] | None = None,
) -> str:
    """The demo's table: per sampler the measured and predicted per-step slowest/mean rank
    compute, the slowest rank's compute and the wall clock per epoch, held-out loss and
    accuracy over the seeds; the speed-ups over torch's sampler; the simulated projection."""
    world, b = config.world_size, config.batch_size
    lengths = np.asarray(config.lengths)
    summary = summarize(config, results)
    rows = summary["samplers"]
    first = next(iter(results[n] for n in config.samplers if n in results))
    model = "with attention (cost ~ s²)" if config.cost == "quadratic" else "per-token (cost ~ s)"
    lines = [
        _wrap(
            f"chronica demo: {world} processes (torch.distributed, gloo, 1 CPU thread each) "
            f"train a sequence classifier {model}; {len(lengths)} samples, global batch {b} "
            f"({config.local_batch} per rank), {first['steps_per_epoch']} steps x "
            f"{plural(config.epochs, 'epoch')}, {plural(config.seeds, 'seed')}, "
            f"kind={config.kind}, rank speeds {config.speeds}"
        ),
        _wrap(
            f"token lengths: {config.lengths_source}; mean {lengths.mean():.0f}, max "
            f"{lengths.max()}"
        ),
        _wrap(
            _cost_line(config, results.get("calibration", {"steps": 0, "coefficients": [0, 1, 0]}))
        ),
        "",
        f"{'':10}{'slowest/mean rank compute per step':^38}{'slowest rank':>13}{'wall clock':>12}"
        f"   held-out, mean ± sd over seeds",
        f"{'sampler':10}{'measured':>10}{'predicted':>11}{'diff':>8}{'worst':>8}"
        f"{'per epoch':>14}{'per epoch':>12}   {'loss':<17}{'accuracy'}",
    ]
    for name, row in rows.items():
        diff = row["measured"] / row["predicted"] - 1.0
        lines.append(
            f"{name:10}{row['measured']:10.3f}{row['predicted']:11.3f}{100 * diff:+7.1f}%"
            f"{row['measured_worst']:8.2f}{row['slowest_per_epoch_s']:12.2f} s"
            f"{row['wall_per_epoch_s']:10.2f} s   {_mean_sd(row['loss']):<17}"
            f"{_mean_sd(row['accuracy'], 100, 1)}%"
        )
    lines.append("")
    torch_row = rows.get("torch")
    for name, row in rows.items():
        if "speedup" not in row or torch_row is None:
            continue
        per_seed = ", ".join(f"{s:.2f}x" for s in row["speedup_per_seed"])
        lines += [
            _wrap(
                f"speed-up of {name}: {row['speedup']:.2f}x in the slowest rank's compute per "
                f"step (CPU time, summed over every step; per seed {per_seed})"
            ),
            _wrap(
                f"its measured balance gives {torch_row['measured']:.3f} / "
                f"{row['measured']:.3f} = {row['speedup_from_balance']:.2f}x; the plans "
                f"predicted {row['speedup_predicted']:.2f}x",
                "  ",
            ),
            f"  wall clock on this machine: {row['speedup_wall']:.2f}x",
        ]
        differences = row["loss_difference"]
        spread = np.std(torch_row["loss"], ddof=1) if len(differences) > 1 else float("nan")
        lines.append(
            _wrap(
                f"held-out loss {name} - torch: {np.mean(differences):+.3f} (per seed "
                + ", ".join(f"{d:+.3f}" for d in differences)
                + (
                    f"); seed-to-seed sd of torch's loss {spread:.3f}; both samplers start "
                    f"from the same initialisation in every seed"
                    if len(differences) > 1
                    else "; one seed: run --seeds 3 to see the seed noise)"
                ),
                "  ",
            )
        )
    if "bound_mean" in results.get("chronica", {}):
        chronica = results["chronica"]
        lines.append(
            _wrap(
                f"best any equal-count split of chronica's steps could predict: mean "
                f"{chronica['bound_mean']:.3f}, worst {chronica['bound_worst']:.3f} (a step "
                f"cannot beat its largest sample)"
            )
        )
    lines += [
        "",
        _wrap(
            f"compute = a rank's CPU time for its forward and backward passes: what a step "
            f"takes when every rank has a processor or device of its own, and what other "
            f"processes on a shared machine do not stretch. predicted = the step's samples "
            f"under the cost model. Measurement noise here: {100 * summary['noise']:.1f}% per "
            f"rank and step, which alone makes equally loaded ranks measure "
            f"{summary['noise_floor']:.3f} on average. wall clock = rank 0's, every step; it "
            f"gains less where ranks share processors with other work, since a rank that "
            f"waits lends its core to the others."
        ),
        _wrap(_pinning_line(results.get("pinned") or [], config.world_size)),
    ]
    if config.speeds != "constant":
        lines.append(
            _wrap(
                "emulated speeds: a rank f times slower sleeps f - 1 times its compute, and its "
                "compute and prediction count f times; dynamic = kind='dynamic', "
                "variable_batch=True"
            )
        )
    lines += _projection_lines(projection or [], config)
    lines.append(f"whole demo: {elapsed_s:.0f} s")
    return "\n".join(lines)
