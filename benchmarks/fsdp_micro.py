"""Lockstep micro-batches under FSDP2, measured: a 2-process ``fully_shard`` job on gloo.

Under FSDP every micro-batch all-gathers the parameters and reduce-scatters the gradients,
so the ranks run micro-batch ``k`` together and a step lasts ``sum_k max_r C[r, k]``. The
job runs the FSDP2 recipe's model and loss (``examples/recipes/fsdp2_micro.py``: a decoder
over flat packed rows, attention per document) on the same global batches three ways, the
ranks of a method running equally many micro-batches:

``torch``
    torch's ``DistributedSampler`` (no shuffle) deals each global batch's documents to the
    ranks (``r, r + W, ...``); each rank's share is cut into as many micro-batches as
    ``micro`` plans, of equal document count, as a trainer with gradient accumulation does.
``rank``
    ``chronica.plan_step(..., Packing(max_tokens, balance="rank"), cost=fitted)``: every
    rank's *sum* balanced (DDP's objective).
``micro``
    The same with ``balance="micro"``: ``sum_k max_r`` minimised (FSDP's objective).

The cost model is fitted to this machine on micro-batches like the measured ones:
``calibration`` other global batches, drawn like the steps and cut the same three ways (the
chronica plans made with a prior model, tokens + L²/1024), run on both ranks as the steps
are. ``benchmarks.measured_cost.fit`` fits ``overhead + a·n + b·ΣL + c·ΣL²`` (a fixed cost
per micro-batch: the collectives and the launch; ``chronica.CostModel(a, b, c)`` per
document) to every rank's micro-batches. A first pass over the calibration batches gives the
*planning* model, which plans the measured steps; then the calibration batches run again, in
turn with the steps, every repeat, and the model fitted on them (none of the steps'
micro-batches) gives the *point* step ``sum_k max_r p[r, k]``, ``p = overhead + C``: a
model calibrated under the load the steps ran under, which the planning model, minutes
older on a shared machine, is not (the result reports that drift). Measured times are
noisy, and a max over ranks of noisy times exceeds the max of their expectations, most
where a plan makes the ranks' micro-batches equal; the *predicted* step
``sum_k E[max_r p[r, k]·(1 + e_r)]`` (``benchmarks.measured_cost.noisy_lockstep``) takes
``e`` over the model's relative errors on the calibration micro-batches, the ranks' errors
on one micro-batch together: the noise measured in the same run, none of it on the steps.

Measured: each rank's compute per micro-batch, the CPU time of its training thread over the
forward and backward pass (``time.thread_time``), which neither waiting for the other rank
in a collective nor other processes on a shared machine stretch; every micro-batch's time
is its median over the repeats, and the lockstep step is ``sum_k max_r t[r, k]``, summed
over the steps. The methods run interleaved, step by step, so the machine's noise falls on
all alike. Each rank is pinned to its own core, and glibc keeps freed memory (no page
faults in a micro-batch: their cost grew with the largest tensor, not with the model's
features). The model's attention runs torch's fused CPU kernel (the recipe passes 4-D
tensors to ``scaled_dot_product_attention``), whose cost is ``b·L + c·L²`` per document; the
math kernel it replaced materialised L x L scores and grew faster than L² past the caches.

    python -m benchmarks --only fsdp_micro [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from benchmarks.measured_cost import (
    features,
    fit,
    lockstep,
    noisy_lockstep,
    predicted,
    rank_step,
    relative_errors,
)
from chronica import CostModel, Packing, plan_step

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPE = ROOT / "examples" / "recipes" / "fsdp2_micro.py"
REPRODUCE = "python -m benchmarks --only fsdp_micro"
METHODS = {
    "torch": "torch `DistributedSampler`, equal document counts per micro-batch",
    "rank": 'chronica `plan_step`, `balance="rank"`',
    "micro": 'chronica `plan_step`, `balance="micro"`',
}
SEED = 2026
# Other runs of this benchmark, for how far its figures move from run to run (the page's
# own figures are the recorded result's).
PREVIOUS = (
    "Three other runs show how far these figures move on this machine, in the order torch, "
    "rank, micro (measured over predicted). Two runs of the same code while other work ran "
    "(1-minute load average about 12, and 7 to 17): 0.976, 0.998, 1.000 and 0.997, 1.015, "
    "1.000; torch's mean part was -1.8% in the first and -0.6% in the second. The run before "
    "them (5 repeats, 4 calibration batches, its measurements analysed the same way): 1.002, "
    "1.000, 1.011, mean parts +0.9%, +0.3%, -0.1%. torch's mean part changes sign from run to "
    "run: the machine's noise, not an effect of the plan."
)


@dataclass(frozen=True)
class Settings:
    """One run: ``calibration`` global batches to fit the cost model on, then ``steps``
    global batches planned with it, every batch of ``documents`` documents and measured
    ``repeats`` times per method."""

    steps: int
    repeats: int
    calibration: int
    documents: int = 32
    max_tokens: int = 4096
    row: int = 2048
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    world: int = 2


QUICK = Settings(
    steps=2, repeats=2, calibration=2, documents=12, max_tokens=1024, row=512, hidden=64
)
FULL = Settings(steps=6, repeats=7, calibration=6)
# The plans of the calibration batches: any sensible cost will do, they only need to look
# like the measured steps' micro-batches.
PRIOR = CostModel(0.0, 1.0, 1.0 / 1024)
# glibc keeps freed memory instead of returning it and faulting it in again.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
    "MALLOC_TOP_PAD_": str(1 << 28),
}


def recipe() -> ModuleType:
    """The FSDP2 recipe, imported from ``examples/recipes`` (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("fsdp2_micro_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_lengths(settings: Settings, calibration: bool = False) -> np.ndarray:
    """``(batches, documents)`` token counts, lognormal(6, 1) clipped to ``[16, row]``: the
    measured steps, or (``calibration``) the batches the cost model is fitted on."""
    rng = np.random.default_rng(SEED + calibration)
    count = settings.calibration if calibration else settings.steps
    raw = rng.lognormal(6.0, 1.0, (count, settings.documents))
    return np.clip(raw, 16, settings.row).astype(np.int64)


def torch_micro_batches(documents: int, world: int, num_micro: int) -> list[list[np.ndarray]]:
    """Per rank, torch's ``DistributedSampler`` share of a global batch cut into
    ``num_micro`` micro-batches of (as nearly as possible) equal document counts."""
    from torch.utils.data import DistributedSampler

    shares = [
        np.array(list(DistributedSampler(range(documents), world, r, shuffle=False)))
        for r in range(world)
    ]
    return [np.array_split(share, num_micro) for share in shares]


def layouts(
    lengths: np.ndarray, settings: Settings, model: CostModel
) -> dict[str, list[list[np.ndarray]]]:
    """Each method's micro-batches of one global batch, per rank."""
    plans = {
        balance: plan_step(
            lengths, settings.world, Packing(settings.max_tokens, balance=balance), cost=model
        )
        for balance in ("rank", "micro")
    }
    count = plans["micro"].num_micro
    out = {"torch": torch_micro_batches(len(lengths), settings.world, count)}
    out.update({b: [p.micro_batches(r) for r in range(settings.world)] for b, p in plans.items()})
    return out


def measured_rows(
    lengths: np.ndarray,
    layouts: list[dict[str, Any]],
    record: list[dict[str, list]],
    repeats: int,
    batches: list[int],
) -> np.ndarray:
    """Rows ``(documents, tokens, squares, seconds)`` of every rank's micro-batches of the
    given batches, every method's, each micro-batch's seconds its median over the repeats.

    Args:
        lengths: ``(batches, documents)`` token counts.
        layouts: per batch, every method's layout (document indices per rank and micro-batch).
        record: per rank, per method, ``repeats * len(layouts)`` lists of micro-batch seconds.
        repeats: how many times every batch ran.
        batches: which batches' rows.
    """
    rows = []
    for method in METHODS:
        for step in batches:
            times = median_times(record, method, step, len(layouts), repeats)
            shape = features(layouts[step][method], lengths[step])
            rows.append(np.column_stack([shape, times.ravel()]))
    return np.concatenate(rows)


def run_order(
    settings: Settings,
    calibration: np.ndarray,
    calibration_plans: list[dict[str, Any]],
    model: CostModel,
) -> tuple[list[bool], np.ndarray, list[dict[str, Any]]]:
    """The measured run: the steps (planned with the fitted ``model``) in turn with the
    calibration batches again, so that the model that predicts the steps is fitted on
    batches measured under the same load. ``(is_step, lengths, layouts)`` in run order.

    Args:
        settings: the run's settings.
        calibration: ``(calibration, documents)`` token counts of the calibration batches.
        calibration_plans: their layouts per method (as ``layouts`` makes them).
        model: the cost the steps are planned with.
    """
    steps = step_lengths(settings)
    plans = [layouts(n, settings, model) for n in steps]
    is_step = interleaved(len(calibration), len(steps))
    sources = {
        False: (iter(calibration), iter(calibration_plans)),
        True: (iter(steps), iter(plans)),
    }
    run_lengths = np.array([next(sources[s][0]) for s in is_step])
    return is_step, run_lengths, [next(sources[s][1]) for s in is_step]


def interleaved(first: int, second: int) -> list[bool]:
    """The order in which ``first`` batches of one kind and ``second`` of another run:
    ``False`` for the first kind, ``True`` for the second, each spread evenly over the run."""
    spots = np.concatenate([np.linspace(0, 1, first + 2)[1:-1], np.linspace(0, 1, second)])
    return (np.argsort(spots, kind="stable") >= first).tolist()


def repeat_times(
    record: list[dict[str, list]], method: str, step: int, steps: int, repeats: int
) -> np.ndarray:
    """``(repeats, world, micro-batches)`` seconds of ``method`` on batch ``step``, every
    repeat's.

    Args:
        record: per rank, per method, ``repeats * steps`` lists of micro-batch seconds.
        method: one of ``METHODS``.
        step: the batch, in run order.
        steps: how many batches a repeat runs.
        repeats: how many repeats.
    """
    runs = [[rank[method][r * steps + step] for rank in record] for r in range(repeats)]
    return np.array(runs, dtype=np.float64)


def median_times(
    record: list[dict[str, list]], method: str, step: int, steps: int, repeats: int
) -> np.ndarray:
    """``(world, micro-batches)`` seconds of ``method`` on batch ``step``: every micro-batch's
    median over the repeats (a max over ranks of noisy times would favour unbalanced plans).
    Arguments as ``repeat_times``'."""
    return np.median(repeat_times(record, method, step, steps, repeats), axis=0)


def noise_figures(cells: list[np.ndarray], errors: np.ndarray) -> dict[str, Any]:
    """How noisy the calibration's measurements are, and what the noise adds to a lockstep
    step whose ranks' micro-batches are equal (the max over ranks above their mean).

    ``single_sd``: one timing's relative deviation from its micro-batch's mean (pooled,
    unbiased). ``median_sd`` and ``median_lift``: the same for the median over the repeats,
    resampling a micro-batch's repeats (the ranks' timings of one repeat kept together;
    a fixed seed), and ``E[maxᵣ - meanᵣ]`` of those medians' relative deviations. The fit's
    relative errors on the calibration micro-batches (``errors``, noise and misfit):
    ``error_mean`` and ``error_sd`` per rank, the ranks' ``error_correlation`` (mean over
    pairs), and ``balanced_lift`` ``E[maxᵣ eᵣ - meanᵣ eᵣ]``: what ``noisy_lockstep`` adds
    to an exactly balanced micro-batch, as a share of it.

    Args:
        cells: per calibration batch and method, its ``repeat_times``.
        errors: ``(micro-batches, world)`` relative errors of the fit on those batches.
    """
    rng = np.random.default_rng(SEED)
    squares, freedom, medians = 0.0, 0, []
    for times in cells:
        repeats = len(times)
        squares += float(np.sum((times / times.mean(axis=0) - 1) ** 2))
        freedom += (repeats - 1) * times[0].size
        picks = rng.integers(0, repeats, (200, repeats))
        resampled = np.median(times[picks], axis=1) / np.median(times, axis=0) - 1
        medians.append(resampled.transpose(0, 2, 1).reshape(-1, times.shape[1]))
    median = np.concatenate(medians)
    correlation = np.corrcoef(errors.T) if errors.shape[1] > 1 else np.ones((1, 1))
    pairs = correlation[np.triu_indices(len(correlation), 1)]
    return {
        "single_sd": float(np.sqrt(squares / max(freedom, 1))),
        "median_sd": float(median.std()),
        "median_lift": float(np.mean(median.max(axis=1) - median.mean(axis=1))),
        "error_mean": errors.mean(axis=0).tolist(),
        "error_sd": errors.std(axis=0).tolist(),
        "error_correlation": float(pairs.mean()) if len(pairs) else 1.0,
        "balanced_lift": float(np.mean(errors.max(axis=1) - errors.mean(axis=1))),
        "error_rows": len(errors),
    }


# -- one rank ---------------------------------------------------------------------------------


def _pin(rank: int) -> list[int]:
    """Pin this process to one core of those it may use (rank ``r`` to the ``r``-th), so the
    ranks never share a core or move between them; the cores it may use after."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    return sorted(os.sched_getaffinity(0))


def _worker(rank: int, port: int, config_path: str, out_path: str) -> int:
    import resource

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cores = _pin(rank)
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    settings = Settings(**json.loads(Path(config_path).read_text()))
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=settings.world, timeout=timedelta(seconds=600)
    )
    lm = recipe()
    model = lm.TinyLM(
        hidden=settings.hidden, heads=settings.heads, layers=settings.layers, row=settings.row
    )
    mesh = init_device_mesh("cpu", (settings.world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    generator = torch.Generator().manual_seed(SEED)

    def documents(lengths: np.ndarray) -> list[torch.Tensor]:
        return [torch.randint(0, lm.VOCAB, (int(n),), generator=generator) for n in lengths]

    def seconds(docs: list[torch.Tensor]) -> float:
        start = time.thread_time()
        loss = lm.token_loss_sum(model, docs) / max(1, sum(len(d) - 1 for d in docs))
        loss.backward()
        took = time.thread_time() - start
        model.zero_grad(set_to_none=True)
        return took

    def measure(
        lengths: np.ndarray, plans: list[dict[str, Any]], repeats: int
    ) -> list[dict[str, list]]:
        """Every rank's record: per method, ``repeats * batches`` lists of micro-batch
        seconds, the methods interleaved batch by batch."""
        batches = [documents(n) for n in lengths]
        record: dict[str, list] = {m: [] for m in METHODS}
        for repeat in range(repeats):
            for step, batch in enumerate(batches):
                for method in _turn(repeat + step):
                    dist.barrier()
                    micro = plans[step][method][rank]
                    record[method].append([seconds([batch[i] for i in docs]) for docs in micro])
        everyone: list[Any] = [None] * settings.world
        dist.all_gather_object(everyone, record)
        return everyone

    try:
        calibration = step_lengths(settings, calibration=True)
        calibration_plans = [layouts(n, settings, PRIOR) for n in calibration]
        warm = documents(calibration[0])
        for method in METHODS:  # warm-up: the allocator's pools, the kernels' first calls
            for docs in calibration_plans[0][method][rank]:
                seconds([warm[i] for i in docs])
        planning_record = measure(calibration, calibration_plans, 1)
        every = list(range(settings.calibration))
        planning_rows = measured_rows(calibration, calibration_plans, planning_record, 1, every)
        overhead, cost = fit(planning_rows)
        is_step, run_lengths, run_plans = run_order(settings, calibration, calibration_plans, cost)
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        record = measure(run_lengths, run_plans, settings.repeats)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        faults: list[Any] = [None] * settings.world
        dist.all_gather_object(
            faults,
            {
                "cores": cores,
                "minor_faults": after.ru_minflt - usage.ru_minflt,
                "system_s": after.ru_stime - usage.ru_stime,
                "user_s": after.ru_utime - usage.ru_utime,
            },
        )
        if rank == 0:

            def listed(plan_list: list[dict[str, Any]]) -> dict[str, list]:
                return {
                    m: [[[d.tolist() for d in r] for r in plan[m]] for plan in plan_list]
                    for m in METHODS
                }

            result = {
                "calibration_lengths": calibration.tolist(),
                "calibration_layouts": listed(calibration_plans),
                "planning_measured": planning_record,
                "overhead": overhead,
                "cost": list(cost.to_tuple()),
                "is_step": is_step,
                "lengths": run_lengths.tolist(),
                "layouts": listed(run_plans),
                "measured": record,
                "ranks": faults,
            }
            Path(out_path).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _launch(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Run the ranks; rank 0's record."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        **MALLOC_ENV,
    }
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="chronica-fsdp-micro-") as tmp:
        config, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config.write_text(json.dumps(asdict(settings)))
        command = [sys.executable, "-m", "benchmarks.fsdp_micro", "--worker"]
        procs = [
            subprocess.Popen([*command, str(r), str(store.port), str(config), str(out)], env=env)
            for r in range(settings.world)
        ]
        try:
            codes, load = _wait(procs, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes) and not out.exists():
            raise RuntimeError(f"fsdp_micro ranks exited with codes {codes}")
        if any(codes):  # after rank 0 wrote every rank's record: gloo's teardown
            print(f"fsdp_micro: ranks exited with codes {codes} after the results were written")
        return {**json.loads(out.read_text()), "load": load}


def _wait(procs: list[subprocess.Popen], timeout_s: float) -> tuple[list[int], list[float]]:
    """The ranks' exit codes, and the machine's 1-minute load average every 15 s while they
    ran (the other jobs on a shared machine, and the ranks themselves)."""
    deadline, load = time.monotonic() + timeout_s, [os.getloadavg()[0]]
    for proc in procs:
        while True:
            try:
                proc.wait(timeout=max(0.0, min(15.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                load.append(os.getloadavg()[0])
    return [proc.returncode for proc in procs], load


# -- analysis ---------------------------------------------------------------------------------


def analyse(settings: Settings, raw: dict[str, Any], sensitivity: bool = True) -> dict[str, Any]:
    """Per method: the measured and predicted lockstep step and slowest rank's sum (seconds,
    summed over the steps), their ratios, every micro-batch's error and each rank's, the
    planning model's and the in-sample refit's ratios; the fits' errors and the drift between
    the planning calibration and the run; with ``sensitivity`` (and 3 repeats or more), the
    range of the lockstep ratio over every choice of all repeats but two."""
    lengths, repeats, record = np.array(raw["lengths"]), settings.repeats, raw["measured"]
    total = len(lengths)
    plans = _per_batch(raw["layouts"], total)
    steps = [i for i, is_step in enumerate(raw["is_step"]) if is_step]
    others = [i for i, is_step in enumerate(raw["is_step"]) if not is_step]
    calibration = measured_rows(lengths, plans, record, repeats, others)
    overhead, cost = fit(calibration)
    # The fit's errors on its own calibration micro-batches (rank by rank, as they ran
    # together): the noise that the max over ranks of the steps' measured times takes.
    calibration_errors = {
        m: relative_errors(
            [median_times(record, m, i, total, repeats) for i in others],
            [predicted(plans[i][m], lengths[i], overhead, cost) for i in others],
        )
        for m in METHODS
    }
    noise = np.concatenate(list(calibration_errors.values()))
    models = {
        "predicted": (overhead, cost),
        "planning": (raw["overhead"], CostModel(*raw["cost"])),
        "refit": fit(measured_rows(lengths, plans, record, repeats, steps)),
    }
    methods: dict[str, Any] = {}
    for method in METHODS:
        measured = [median_times(record, method, i, total, repeats) for i in steps]
        runs = [repeat_times(record, method, i, total, repeats) for i in steps]
        forecasts = {
            name: [predicted(plans[i][method], lengths[i], *model) for i in steps]
            for name, model in models.items()
        }
        forecast = forecasts["predicted"]
        flat = np.concatenate([t.ravel() for t in measured])
        error = flat / np.concatenate([p.ravel() for p in forecast]) - 1
        spread = np.concatenate([(np.ptp(r, axis=0) / np.median(r, axis=0)).ravel() for r in runs])
        m: dict[str, Any] = {
            "measured_lockstep": sum(lockstep(t) for t in measured),
            "measured_rank": sum(rank_step(t) for t in measured),
            "predicted_rank": sum(rank_step(p) for p in forecast),
            **{f"{n}_lockstep": sum(lockstep(p) for p in f) for n, f in forecasts.items()},
            "point_lockstep": sum(lockstep(p) for p in forecast),
            "predicted_lockstep": sum(noisy_lockstep(p, noise) for p in forecast),
            "measured_mean": sum(float(t.mean(axis=0).sum()) for t in measured),
            "predicted_mean": sum(float(p.mean(axis=0).sum()) for p in forecast),
            "calibration_error_mean": float(calibration_errors[method].mean()),
            "micro_error_median": float(np.median(np.abs(error))),
            "micro_error_max": float(np.max(np.abs(error))),
            "rank_ratio": [
                float(sum(t[r].sum() for t in measured) / sum(p[r].sum() for p in forecast))
                for r in range(settings.world)
            ],
            "repeat_spread_median": float(np.median(spread)),
            "num_micro": [len(plans[i][method][0]) for i in steps],
            "max_tokens": int(
                max(
                    lengths[i][np.asarray(d, dtype=np.int64)].sum()
                    for i in steps
                    for r in plans[i][method]
                    for d in r
                )
            ),
        }
        m["ratio"] = m["measured_lockstep"] / m["predicted_lockstep"]
        m["point_ratio"] = m["measured_lockstep"] / m["point_lockstep"]
        m["rank_step_ratio"] = m["measured_rank"] / m["predicted_rank"]
        m["planning_ratio"] = m["measured_lockstep"] / m["planning_lockstep"]
        m["refit_ratio"] = m["measured_lockstep"] / m["refit_lockstep"]
        methods[method] = m
    for m in methods.values():
        m["vs_torch"] = m["measured_lockstep"] / methods["torch"]["measured_lockstep"]
        m["predicted_vs_torch"] = m["predicted_lockstep"] / methods["torch"]["predicted_lockstep"]
    model_seconds = overhead + calibration[:, :3] @ np.array(cost.to_tuple())
    errors = np.abs(model_seconds / calibration[:, 3] - 1)
    first = measured_rows(
        np.array(raw["calibration_lengths"]),
        _per_batch(raw["calibration_layouts"], settings.calibration),
        raw["planning_measured"],
        1,
        list(range(settings.calibration)),
    )
    if sensitivity and repeats >= 3:
        for name, low, high in _repeat_sensitivity(settings, raw):
            methods[name]["ratio_range"] = [low, high]
    return {
        "settings": asdict(settings),
        "overhead": overhead,
        "cost": list(cost.to_tuple()),
        "planning_overhead": raw["overhead"],
        "planning_cost": raw["cost"],
        "calibration_micro_batches": len(calibration),
        "fit_error_median": float(np.median(errors)),
        "fit_error_max": float(errors.max()),
        "drift": float(calibration[:, 3].sum() / first[:, 3].sum()),
        "noise": noise_figures(
            [repeat_times(record, m, i, total, repeats) for m in METHODS for i in others], noise
        ),
        "refit_overhead": models["refit"][0],
        "refit_cost": list(models["refit"][1].to_tuple()),
        "ranks": raw["ranks"],
        "load": raw.get("load", []),
        "methods": methods,
        "raw": raw,
    }


def _repeat_sensitivity(settings: Settings, raw: dict[str, Any]) -> list[tuple[str, float, float]]:
    """Per method, the lowest and highest lockstep ratio (measured over predicted) when the
    run keeps only ``repeats - 2`` of its repeats, over every such choice: how much the
    figure moves with the noise of the repeats."""
    total, kept = len(raw["lengths"]), settings.repeats - 2
    ratios: dict[str, list[float]] = {m: [] for m in METHODS}
    for chosen in itertools.combinations(range(settings.repeats), kept):
        record = [
            {m: [rank[m][r * total + i] for r in chosen for i in range(total)] for m in METHODS}
            for rank in raw["measured"]
        ]
        part = analyse(replace(settings, repeats=kept), {**raw, "measured": record}, False)
        for m in METHODS:
            ratios[m].append(part["methods"][m]["ratio"])
    return [(m, min(r), max(r)) for m, r in ratios.items()]


def _turn(shift: int) -> list[str]:
    """The methods in the order they run: each one first in turn, so that no method always
    follows the same one."""
    names = list(METHODS)
    return names[shift % len(names) :] + names[: shift % len(names)]


def _per_batch(layouts: dict[str, list], batches: int) -> list[dict[str, Any]]:
    """``layouts[method][batch]`` (as stored) as ``[batch][method]``."""
    return [{m: layouts[m][b] for m in METHODS} for b in range(batches)]


def run(quick: bool) -> dict[str, Any]:
    """Measure the three methods on 2 FSDP2 ranks (``QUICK`` or ``FULL`` settings)."""
    import torch

    settings = QUICK if quick else FULL
    result = analyse(settings, _launch(settings, timeout_s=600 if quick else 3000))
    result["torch"] = torch.__version__
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'method':8}{'micro':>7}{'lockstep s':>12}{'predicted':>11}{'ratio':>8}"
        f"{'point':>9}{'ratio':>8}{'rank s':>9}{'ratio':>8}{'|err| mb':>10}{'per rank':>14}"
        f"{'vs torch':>10}{'max tokens':>12}"
    ]
    for name, m in result["methods"].items():
        per_rank = "/".join(f"{x:.3f}" for x in m["rank_ratio"])
        lines.append(
            f"{name:8}{sum(m['num_micro']):>7}{m['measured_lockstep']:12.3f}"
            f"{m['predicted_lockstep']:11.3f}{m['ratio']:8.3f}{m['point_lockstep']:9.3f}"
            f"{m['point_ratio']:8.3f}{m['measured_rank']:9.3f}{m['rank_step_ratio']:8.3f}"
            f"{100 * m['micro_error_median']:9.1f}%{per_rank:>14}"
            f"{m['vs_torch']:10.3f}{m['max_tokens']:12}"
        )
    a, b, c = result["cost"]
    noise = result["noise"]
    lines.append(
        f"cost fit: {1e3 * result['overhead']:.2f} ms + {a:.3g}·n + {b:.3g}·ΣL + {c:.3g}·ΣL² s; "
        f"median error {100 * result['fit_error_median']:.1f}%, worst "
        f"{100 * result['fit_error_max']:.1f}% over {result['calibration_micro_batches']} "
        f"calibration micro-batches; drift since planning {result['drift']:.3f}; "
        "point ratio of the planning model "
        + ", ".join(f"{n} {m['planning_ratio']:.3f}" for n, m in result["methods"].items())
        + ", of the refit "
        + ", ".join(f"{n} {m['refit_ratio']:.3f}" for n, m in result["methods"].items())
    )
    lines.append(
        f"noise (calibration): one timing {100 * noise['single_sd']:.1f}% sd, a median "
        f"{100 * noise['median_sd']:.1f}%, lifting an equal pair's max by "
        f"{100 * noise['median_lift']:.2f}%; the fit's errors sd "
        + "/".join(f"{100 * x:.1f}%" for x in noise["error_sd"])
        + f", correlated {noise['error_correlation']:.2f} across ranks, lifting a balanced "
        f"micro-batch by {100 * noise['balanced_lift']:.2f}%"
    )
    ranges = {n: m["ratio_range"] for n, m in result["methods"].items() if "ratio_range" in m}
    if ranges:
        lines.append(
            "lockstep ratio over every choice of all repeats but two: "
            + ", ".join(f"{n} {low:.3f}-{high:.3f}" for n, (low, high) in ranges.items())
        )
    if result.get("load"):
        lines.append(f"load average (1 min) during the run: {_load(result['load'])}")
    lines.append(f"ranks: {result['ranks']}")
    return "\n".join(lines)


def _load(samples: list[float]) -> str:
    """The 1-minute load averages sampled during a run: median and range."""
    return f"median {np.median(samples):.1f}, {min(samples):.1f} to {max(samples):.1f}"


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md."""
    del img_dir
    s, methods, noise = result["settings"], result["methods"], result["noise"]
    a, b, c = result["cost"]
    torch_, rank, micro = methods["torch"], methods["rank"], methods["micro"]
    predicted_gain = micro["predicted_lockstep"] / rank["predicted_lockstep"]
    measured_gain = micro["measured_lockstep"] / rank["measured_lockstep"]
    ratios = [m["ratio"] for m in methods.values()]
    faults = ", ".join(
        f"rank {r}: core {p['cores']}, {p['minor_faults']} page faults, "
        f"{p['system_s']:.2f} s system of {p['user_s']:.1f} s user"
        for r, p in enumerate(result["ranks"])
    )
    per_rank = max(abs(x - 1) for m in methods.values() for x in m["rank_ratio"])
    ranges = [m["ratio_range"] for m in methods.values() if "ratio_range" in m]
    moves = (
        f" (kept {s['repeats'] - 2} of the {s['repeats']} repeats, every choice: "
        f"{min(r[0] for r in ranges):.3f} to {max(r[1] for r in ranges):.3f})"
        if ranges
        else ""
    )
    shared = (
        f"; the run took {result['wall_seconds']:.0f} s of wall time for "
        f"{max(p['user_s'] for p in result['ranks']):.0f} s of CPU per rank"
        if "wall_seconds" in result and result["ranks"]
        else ""
    )
    if result.get("load"):
        shared += (
            f"; 1-minute load average of the machine's 2 cores {_load(result['load'])} "
            "(the run's own two ranks make about 2)"
        )

    def lift(m: dict[str, Any], key: str, mean: str) -> str:
        return f"{100 * (m[key] - m[mean]) / m[key]:.1f}%"

    lines = [
        "## Lockstep micro-batches under FSDP2",
        "",
        f"Two processes train the FSDP2 recipe's decoder (`examples/recipes/fsdp2_micro.py`, "
        f"hidden {s['hidden']}, {s['layers']} layers, attention per document with torch's "
        f"fused CPU kernel) with `fully_shard` on gloo (torch {result['torch']}, one CPU "
        "thread per rank, each rank pinned to its own core, glibc keeping freed memory), on "
        f"{s['steps']} global batches of {s['documents']} documents (lognormal(6, 1) tokens "
        f"in [16, {s['row']}]), cap {s['max_tokens']} tokens per micro-batch, each batch "
        "cut three ways (equal micro-batch counts on the ranks of each). Measured: every "
        "micro-batch's forward and backward CPU time (`time.thread_time`) on each rank, "
        f"median over {s['repeats']} repeats; the lockstep step is Σₖ maxᵣ t[r, k], summed "
        "over the batches. The cost model comes from "
        f"{s['calibration']} other global batches drawn the same way and cut the same "
        "three ways: measured once first to plan the steps with (the *planning* model), "
        "then again in turn with the steps, every repeat. Fitted on those "
        f"({result['calibration_micro_batches']} micro-batches, none of the steps'): "
        f"{1e3 * result['overhead']:.2f} ms per micro-batch + {1e3 * a:.3g} ms per document "
        f"+ {b:.3g}·L + {c:.3g}·L² seconds (median error "
        f"{100 * result['fit_error_median']:.1f}%, worst "
        f"{100 * result['fit_error_max']:.1f}% on its own micro-batches). The *point* "
        "figure is Σₖ maxᵣ p[r, k] of that model's times p; the *predicted* one is "
        "Σₖ E[maxᵣ p[r, k]·(1 + eᵣ)] (`benchmarks.measured_cost.noisy_lockstep`), e the "
        "relative errors the model makes on the calibration micro-batches' medians, the "
        f"two ranks' errors on one micro-batch taken together ({noise['error_rows']} pairs, "
        "each in turn): the noise that the max over ranks of measured times takes, measured "
        "in the same run, none of it on the steps.",
        "",
        "| method | micro-batches | lockstep (s) | predicted (s) | measured / predicted "
        "| point (s) | measured / point | slowest rank's sum (s) | measured / point "
        "| vs torch | most tokens in a micro-batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in methods.items():
        lines.append(
            f"| {METHODS[name]} | {sum(m['num_micro'])} | {m['measured_lockstep']:.3f} "
            f"| {m['predicted_lockstep']:.3f} | {m['ratio']:.3f} | {m['point_lockstep']:.3f} "
            f"| {m['point_ratio']:.3f} | {m['measured_rank']:.3f} "
            f"| {m['rank_step_ratio']:.3f} | {m['vs_torch']:.3f} | {m['max_tokens']} |"
        )
    lines += [
        "",
        f"Measured over predicted, lockstep: {min(ratios):.3f} to {max(ratios):.3f}{moves}. "
        "The point figure of the same layouts under the *planning* model (the plans were "
        "made with it): "
        + ", ".join(f"{n} {m['planning_ratio']:.3f}" for n, m in methods.items())
        + f" (the machine's load moved CPU times by {100 * (result['drift'] - 1):+.1f}% "
        "between that pass and the run: the calibration batches' summed time, run against "
        "first pass); under a model *refitted* on the steps' own micro-batches (in-sample, "
        "the best the model's form can do): "
        + ", ".join(f"{n} {m['refit_ratio']:.3f}" for n, m in methods.items())
        + ". Per micro-batch the point prediction's error is "
        + ", ".join(
            f"{n} {100 * m['micro_error_median']:.1f}% (median)" for n, m in methods.items()
        )
        + "; the repeats of one micro-batch spread by "
        + ", ".join(f"{100 * m['repeat_spread_median']:.1f}%" for m in methods.values())
        + f" (median range over the repeats). {faults}{shared}. torch's baseline ignores "
        "the cap (its largest micro-batch is in the last column).",
        "",
        "**What the point figure misses is the noise in the max over ranks.** A lockstep "
        "step is Σₖ meanᵣ t[r, k] (which the model predicts the same for every cut of a "
        "batch into equally many micro-batches: "
        f"{micro['predicted_mean']:.3f} s for each method) plus the lift of each "
        "micro-batch's slowest rank above the ranks' mean. "
        "The mean parts are measured at "
        + ", ".join(
            f"{n} {m['measured_mean'] / m['predicted_mean']:.3f}" for n, m in methods.items()
        )
        + " of the prediction, and each rank's summed micro-batches within "
        f"{100 * per_rank:.1f}% (every method, every rank). The lifts, as a share of the "
        f"step: measured torch {lift(torch_, 'measured_lockstep', 'measured_mean')}, rank "
        f"{lift(rank, 'measured_lockstep', 'measured_mean')}, micro "
        f"{lift(micro, 'measured_lockstep', 'measured_mean')}; point "
        f"{lift(torch_, 'point_lockstep', 'predicted_mean')}, "
        f"{lift(rank, 'point_lockstep', 'predicted_mean')}, "
        f"{lift(micro, 'point_lockstep', 'predicted_mean')}; predicted "
        f"{lift(torch_, 'predicted_lockstep', 'predicted_mean')}, "
        f"{lift(rank, 'predicted_lockstep', 'predicted_mean')}, "
        f"{lift(micro, 'predicted_lockstep', 'predicted_mean')}. The point figure has "
        "little lift where a plan makes the ranks' micro-batches equal, but their "
        "measured times are not equal: on the calibration batches one timing deviates from "
        f"its micro-batch's mean by {100 * noise['single_sd']:.1f}% (sd), the median of "
        f"{s['repeats']} by "
        f"{100 * noise['median_sd']:.1f}% (its repeats resampled), so the max of two equal "
        f"micro-batches' medians exceeds their mean by {100 * noise['median_lift']:.1f}% "
        "from the repeats' noise alone; the model's errors on the calibration micro-batches "
        "(noise and misfit) have sd "
        + " and ".join(f"{100 * x:.1f}%" for x in noise["error_sd"])
        + " on the two ranks, their means "
        + " and ".join(f"{100 * x:+.1f}%" for x in noise["error_mean"])
        + f" (the cores are not equally fast), correlated {noise['error_correlation']:.2f} "
        "(the same load slows both), and lift a balanced micro-batch by "
        f"{100 * noise['balanced_lift']:.1f}%: the figure the *predicted* column adds, "
        "largest for the balanced plans and least for torch's unequal micro-batches. More "
        "repeats shrink it (the median's noise falls as one over the square root of their "
        "number), a quieter machine more.",
        "",
        "What the predicted figure leaves is in the mean part: the model's error on a whole "
        "method's micro-batches, which does not cancel within a run. On the calibration "
        "batches themselves the model misses each method's micro-batches by "
        + ", ".join(f"{n} {100 * m['calibration_error_mean']:+.1f}%" for n, m in methods.items())
        + " on average, on the steps their mean parts by "
        + ", ".join(
            f"{n} {100 * (m['measured_mean'] / m['predicted_mean'] - 1):+.1f}%"
            for n, m in methods.items()
        )
        + ": the model's errors on single micro-batches, which do not cancel over one "
        "method's micro-batches of one run. " + PREVIOUS,
        "",
        "Where the 10-12% gap of the first version of this benchmark came from (each "
        "measured on this machine, one process, one thread): the recipe passed 3-D tensors "
        "to `scaled_dot_product_attention`, which sends them to the math kernel: it "
        "materialises every document's L x L scores and grew faster than L² past the "
        "caches (a 2048-token document's forward and backward: 780 ms, against 176 ms at "
        "1024; the fused kernel takes 242 and 87 ms), so a + b·L + c·L² fitted with b = 0 "
        "and mispredicted long documents; its calibration micro-batches were filled to a "
        "random token target, which kept out the long documents that overshoot it (the "
        "planned ones held up to 7068 tokens, the calibration ones at most 3594); freed "
        "memory went back to the system and came back as page faults (system time 45 ms of "
        "548 ms for two 2048-token documents, 1 ms for 64 short ones: a cost of the largest "
        "tensor, not of the model's features); and the calibration ran minutes before the "
        "steps on a machine whose load kept changing.",
        "",
        f'Against `balance="rank"`, `balance="micro"`\'s lockstep step is predicted '
        f"{100 * (predicted_gain - 1):+.1f}% and measured {100 * (measured_gain - 1):+.1f}%. "
        "With 2 ranks and 32 documents a step the two plans differ by little; "
        "both cut torch's lockstep step, by "
        f"{100 * (1 - rank['vs_torch']):.0f}% and {100 * (1 - micro['vs_torch']):.0f}%.",
    ]
    lines += ["", f"Reproduce: `{REPRODUCE}`.", ""]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=4, metavar=("RANK", "PORT", "CONFIG", "OUT"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        rank, port, config, out = args.worker
        return _worker(int(rank), int(port), config, out)
    print(format_table(run(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
