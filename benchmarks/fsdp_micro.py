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

First the cost model is fitted to this machine: the same calibration micro-batches (drawn
like the steps' documents) run on both ranks, and ``chronica.CostModel.fit`` fits
``a + b·L + c·L²`` per document to their measured seconds, beside a fixed cost per
micro-batch (the collectives and the launch), ``overhead``; the plans are made with the
fitted model, and their predicted step is ``sum_k max_r (overhead + C[r, k])``.

Measured: each rank's compute per micro-batch, the CPU time of its training thread over the
forward and backward pass (``time.thread_time``), which neither waiting for the other rank
in a collective nor other processes on a shared machine stretch; every micro-batch's time
is its median over the repeats, and the lockstep step is ``sum_k max_r t[r, k]``, summed
over the steps. The methods run
interleaved, step by step, so the machine's noise falls on all alike.

    python -m benchmarks --only fsdp_micro [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

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


@dataclass(frozen=True)
class Settings:
    """One run: ``steps`` global batches of ``documents`` documents, each measured
    ``repeats`` times per method; calibration micro-batches measured ``repeats`` times."""

    steps: int
    repeats: int
    documents: int = 32
    max_tokens: int = 4096
    row: int = 2048
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    calibration: int = 24
    world: int = 2


QUICK = Settings(steps=2, repeats=2, documents=12, max_tokens=1024, row=512, hidden=64)
FULL = Settings(steps=6, repeats=3, calibration=32)


def recipe() -> ModuleType:
    """The FSDP2 recipe, imported from ``examples/recipes`` (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("fsdp2_micro_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_lengths(settings: Settings) -> np.ndarray:
    """``(steps, documents)`` token counts, lognormal(6, 1) clipped to ``[16, row]``."""
    rng = np.random.default_rng(SEED)
    raw = rng.lognormal(6.0, 1.0, (settings.steps, settings.documents))
    return np.clip(raw, 16, settings.row).astype(np.int64)


def calibration_batches(settings: Settings) -> list[np.ndarray]:
    """Micro-batches like the steps': lognormal(6, 1) documents in ``[16, row]`` filled up
    to a token count drawn in ``[max_tokens / 8, max_tokens]``."""
    rng = np.random.default_rng(SEED + 1)
    batches: list[np.ndarray] = []
    while len(batches) < settings.calibration:
        target = rng.integers(settings.max_tokens // 8, settings.max_tokens + 1)
        lengths: list[int] = []
        while True:
            n = int(np.clip(rng.lognormal(6.0, 1.0), 16, settings.row))
            if lengths and sum(lengths) + n > target:
                break
            lengths.append(min(n, settings.max_tokens))
        batches.append(np.array(lengths, dtype=np.int64))
    return batches


def torch_micro_batches(documents: int, world: int, num_micro: int) -> list[list[np.ndarray]]:
    """Per rank, torch's ``DistributedSampler`` share of a global batch cut into
    ``num_micro`` micro-batches of (as nearly as possible) equal document counts."""
    from torch.utils.data import DistributedSampler

    shares = [
        np.array(list(DistributedSampler(range(documents), world, r, shuffle=False)))
        for r in range(world)
    ]
    return [np.array_split(share, num_micro) for share in shares]


def fit(rows: np.ndarray) -> tuple[float, CostModel]:
    """``(overhead, model)`` from calibration rows ``(documents, tokens, squares, seconds)``:
    a least-squares fixed cost per micro-batch, then ``CostModel.fit`` on the rest."""
    counts, tokens, squares, seconds = rows.T
    features = np.column_stack([np.ones_like(counts), counts, tokens, squares])
    overhead = max(0.0, float(np.linalg.lstsq(features, seconds, rcond=None)[0][0]))
    return overhead, CostModel.fit(counts, tokens, squares, seconds - overhead)


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


def predicted(
    layout: list[list[np.ndarray]], lengths: np.ndarray, overhead: float, model: CostModel
) -> np.ndarray:
    """``(world, num_micro)`` predicted seconds of every micro-batch."""
    costs = model(lengths.astype(np.float64))
    return np.array([[overhead + costs[docs].sum() for docs in rank] for rank in layout])


# -- one rank ---------------------------------------------------------------------------------


def _worker(rank: int, port: int, config_path: str, out_path: str) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

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

    try:
        calibration = calibration_batches(settings)
        inputs = [documents(lengths) for lengths in calibration]
        for docs in inputs[:4]:
            seconds(docs)  # warm-up
        timed = np.array([[seconds(docs) for docs in inputs] for _ in range(settings.repeats)])
        mine = np.median(timed, axis=0)
        both: list[Any] = [None] * settings.world
        dist.all_gather_object(both, mine.tolist())
        rows = np.column_stack(
            [
                [len(b) for b in calibration],
                [b.sum() for b in calibration],
                [(b.astype(np.float64) ** 2).sum() for b in calibration],
                np.mean(both, axis=0),
            ]
        )
        overhead, cost = fit(rows)
        steps = step_lengths(settings)
        batches = [documents(lengths) for lengths in steps]
        plans = [layouts(lengths, settings, cost) for lengths in steps]
        record: dict[str, list] = {m: [] for m in METHODS}
        for _ in range(settings.repeats):
            for step, batch in enumerate(batches):
                for method in METHODS:
                    dist.barrier()
                    micro = plans[step][method][rank]
                    record[method].append([seconds([batch[i] for i in docs]) for docs in micro])
        gathered: list[Any] = [None] * settings.world
        dist.all_gather_object(gathered, record)
        if rank == 0:
            result = {
                "calibration": rows.tolist(),
                "overhead": overhead,
                "cost": list(cost.to_tuple()),
                "lengths": steps.tolist(),
                "layouts": {
                    m: [[[d.tolist() for d in r] for r in plan[m]] for plan in plans]
                    for m in METHODS
                },
                "measured": gathered,
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
            codes = [p.wait(timeout=timeout_s) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes) and not out.exists():
            raise RuntimeError(f"fsdp_micro ranks exited with codes {codes}")
        if any(codes):  # after rank 0 wrote every rank's record: gloo's teardown
            print(f"fsdp_micro: ranks exited with codes {codes} after the results were written")
        return json.loads(out.read_text())


# -- analysis ---------------------------------------------------------------------------------


def analyse(settings: Settings, raw: dict[str, Any]) -> dict[str, Any]:
    """Per method: the measured and predicted lockstep step (seconds, summed over the
    steps), their ratio, and the measured and predicted slowest rank's sum."""
    overhead, cost = raw["overhead"], CostModel(*raw["cost"])
    lengths = np.array(raw["lengths"])
    methods: dict[str, Any] = {}
    world, steps = settings.world, settings.steps
    for method in METHODS:
        # measured[rank][method][repeat * steps + step] -> (repeat, step): (world, micro)
        per_repeat = [
            [
                np.array([raw["measured"][r][method][repeat * steps + step] for r in range(world)])
                for step in range(steps)
            ]
            for repeat in range(settings.repeats)
        ]
        # every micro-batch's time is its median over the repeats, then the lockstep step
        # sum_k max_r (a max of noisy times would favour unbalanced plans)
        typical = [np.median([rows[step] for rows in per_repeat], axis=0) for step in range(steps)]
        lockstep = np.array([t.max(axis=0).sum() for t in typical])
        rank_sum = np.array([t.sum(axis=1).max() for t in typical])
        forecast = [
            predicted(
                [[np.array(d) for d in r] for r in raw["layouts"][method][step]],
                lengths[step],
                overhead,
                cost,
            )
            for step in range(settings.steps)
        ]
        methods[method] = {
            "measured_lockstep": float(lockstep.sum()),
            "predicted_lockstep": float(sum(p.max(axis=0).sum() for p in forecast)),
            "measured_rank": float(rank_sum.sum()),
            "predicted_rank": float(sum(p.sum(axis=1).max() for p in forecast)),
            "num_micro": [len(raw["layouts"][method][s][0]) for s in range(settings.steps)],
            "max_tokens": int(
                max(
                    lengths[s][np.array(d, dtype=np.int64)].sum()
                    for s in range(settings.steps)
                    for r in raw["layouts"][method][s]
                    for d in r
                )
            ),
        }
    refit_overhead, refit = _refit(settings, raw)
    for method, m in methods.items():
        forecast = [
            predicted(
                [[np.array(d) for d in r] for r in raw["layouts"][method][step]],
                lengths[step],
                refit_overhead,
                refit,
            )
            for step in range(steps)
        ]
        m["refit_lockstep"] = float(sum(p.max(axis=0).sum() for p in forecast))
        m["refit_ratio"] = m["measured_lockstep"] / m["refit_lockstep"]
    for m in methods.values():
        m["ratio"] = m["measured_lockstep"] / m["predicted_lockstep"]
        m["vs_torch"] = m["measured_lockstep"] / methods["torch"]["measured_lockstep"]
    calibration = np.array(raw["calibration"])
    model_seconds = [
        overhead + float(cost(b.astype(np.float64)).sum()) for b in calibration_batches(settings)
    ]
    errors = np.abs(np.array(model_seconds) / calibration[:, 3] - 1)
    return {
        "settings": asdict(settings),
        "overhead": overhead,
        "cost": raw["cost"],
        "fit_error_median": float(np.median(errors)),
        "fit_error_max": float(errors.max()),
        "refit_overhead": refit_overhead,
        "refit_cost": list(refit.to_tuple()),
        "methods": methods,
        "raw": raw,
    }


def _refit(settings: Settings, raw: dict[str, Any]) -> tuple[float, CostModel]:
    """The cost model fitted again, on every measured micro-batch of the run (each rank's,
    median over the repeats): what a trainer that keeps calibrating on its own steps
    would predict with."""
    lengths = np.array(raw["lengths"])
    rows = []
    for method in METHODS:
        for step in range(settings.steps):
            for r, micro in enumerate(raw["layouts"][method][step]):
                times = [
                    raw["measured"][r][method][repeat * settings.steps + step]
                    for repeat in range(settings.repeats)
                ]
                for k, docs in enumerate(micro):
                    doc_lengths = lengths[step][np.array(docs, dtype=np.int64)].astype(float)
                    seconds = float(np.median([t[k] for t in times]))
                    rows.append([len(docs), doc_lengths.sum(), (doc_lengths**2).sum(), seconds])
    return fit(np.array(rows))


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
        f"{'refit':>8}{'vs torch':>10}{'rank sum s':>12}{'max tokens':>12}"
    ]
    for name, m in result["methods"].items():
        lines.append(
            f"{name:8}{sum(m['num_micro']):>7}{m['measured_lockstep']:12.3f}"
            f"{m['predicted_lockstep']:11.3f}{m['ratio']:8.3f}{m['refit_ratio']:8.3f}"
            f"{m['vs_torch']:10.3f}"
            f"{m['measured_rank']:12.3f}{m['max_tokens']:12}"
        )
    lines.append(
        f"cost fit: median error {100 * result['fit_error_median']:.1f}%, worst "
        f"{100 * result['fit_error_max']:.1f}% over the calibration micro-batches"
    )
    return "\n".join(lines)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md."""
    del img_dir
    s = result["settings"]
    a, b, c = result["cost"]
    rank, micro = result["methods"]["rank"], result["methods"]["micro"]
    predicted_gain = micro["predicted_lockstep"] / rank["predicted_lockstep"]
    measured_gain = micro["measured_lockstep"] / rank["measured_lockstep"]
    lines = [
        "## Lockstep micro-batches under FSDP2",
        "",
        f"Two processes train the FSDP2 recipe's decoder (`examples/recipes/fsdp2_micro.py`, "
        f"hidden {s['hidden']}, {s['layers']} layers, attention per document) with "
        f"`fully_shard` on gloo (torch {result['torch']}, one CPU thread per rank), on "
        f"{s['steps']} global batches of {s['documents']} documents (lognormal(6, 1) tokens "
        f"in [16, {s['row']}]), cap {s['max_tokens']} tokens per micro-batch, each batch "
        "cut three ways (equal micro-batch counts on the ranks of each). The cost model was "
        f"fitted on this machine first: {a:.3g} + {b:.3g}·L + {c:.3g}·L² seconds per "
        f"document plus {result['overhead'] * 1e3:.2f} ms per micro-batch "
        f"(calibration micro-batches: median error {100 * result['fit_error_median']:.1f}%, "
        f"worst {100 * result['fit_error_max']:.1f}%). Measured: every micro-batch's "
        "forward and backward CPU time on each rank, median over "
        f"{s['repeats']} repeats; the lockstep step is Σₖ maxᵣ t[r, k], summed over the "
        "batches.",
        "",
        "| method | micro-batches | lockstep (s) | predicted (s) | measured / predicted "
        "| measured / refitted | vs torch | slowest rank's sum (s) "
        "| most tokens in a micro-batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in result["methods"].items():
        lines.append(
            f"| {METHODS[name]} | {sum(m['num_micro'])} | {m['measured_lockstep']:.3f} "
            f"| {m['predicted_lockstep']:.3f} | {m['ratio']:.3f} | {m['refit_ratio']:.3f} "
            f"| {m['vs_torch']:.3f} | {m['measured_rank']:.3f} | {m['max_tokens']} |"
        )
    lines += [
        "",
        "*predicted*: the plan's figure under the cost model fitted before the run (the plans "
        "were made with it); *refitted*: the same layouts under the model fitted again on "
        "every micro-batch measured in the run (medians over the repeats), as a trainer "
        "that keeps calibrating on its own steps would predict. On a shared machine the "
        "load between calibration and measurement moves CPU times; the refitted ratio "
        "shows how well a + b·L + c·L² per document plus a fixed cost per micro-batch "
        "explains the measured steps. torch's baseline ignores the cap (its largest "
        "micro-batch is in the last column).",
        "",
        f'`balance="micro"` predicts a lockstep step {100 * (1 - predicted_gain):.1f}% below '
        f'`balance="rank"`\'s; measured, it is {100 * (measured_gain - 1):+.1f}% '
        "against it. With 2 ranks and 32 documents a step, the two plans differ by less "
        "than this machine's noise and the fitted model's error; both cut torch's lockstep "
        f"step, by {100 * (1 - rank['vs_torch']):.0f}% and {100 * (1 - micro['vs_torch']):.0f}%.",
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
