"""On one GPU: the lockstep plans' micro-batches timed with the real attention kernel, the
cost model fitted to those times, and predicted against measured step time, for chronica
and its peers.

For every case (lengths, ``W`` ranks, the token cap of a micro-batch), one process plays
every rank in turn: it times the forward and backward pass of a tiny Llama-style decoder
(``benchmarks/device/llama.py``: flash attention over ``cu_seqlens`` where the GPU has it)
on each rank's planned micro-batches, cell by cell. From those cell times ``t[r, k]``:

* **lockstep step** ``sum_k max_r t[r, k]`` (FSDP, ZeRO-3, experts: every micro-batch ends
  in a collective), **rank-sum step** ``max_r sum_k t[r, k]`` (DDP), and each rank's sum;
* the same figures **predicted** by the fitted model ``overhead + sum(a + b·L + c·L²)`` of
  each cell, and their relative error.

The model (``benchmarks.measured_cost.fit``: a fixed cost per micro-batch and
``chronica.CostModel``'s three terms, fitted jointly, none below zero) is fitted first to
calibration micro-batches drawn apart from the plans (random documents of the case's
lengths filled to a random share of the cap), and every method plans with it (the peers that
balance a cost get the same costs). Then every cell of every plan, the calibration set again
and chronica micro's plan a second time are timed in one shuffled order, so that a drift of
the GPU's clocks falls on all alike; the model fitted to that pass's calibration times makes
the prediction, and the two timings of one plan give the noise figure no prediction can
beat. Methods: chronica ``plan_step`` with ``balance="micro"`` and ``"rank"``, verl, NeMo-RL
and the lockstep LPT reference (``benchmarks/lockstep_peers.py``).

    python -m benchmarks.device.attention_cost              # a CUDA machine, < 8 minutes
    python -m benchmarks.device.attention_cost --dry-run    # CPU, tiny model, a minute

A run writes ``benchmarks/results/device.attention_cost.json`` (``--json``); the page's
section is rebuilt from it by ``python -m benchmarks.report``. Cases that would start after
``--budget-s`` seconds are left out and listed, so the run ends in time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import lockstep_peers as peers
from benchmarks.common import machine_info
from benchmarks.device.llama import (
    LlamaConfig,
    TinyLlama,
    packed_batch,
    parameters_millions,
    pick_attention,
)
from benchmarks.lockstep import DATA, docs_per_rank
from benchmarks.measured_cost import fit, lockstep, rank_step
from benchmarks.packing import default_data_dir
from benchmarks.packing_peers import MicroBatches
from chronica import CostModel, Packing, plan_step

__all__ = ["DRY_RUN", "FULL", "Settings", "format_table", "render_markdown", "run"]

HERE = Path(__file__).resolve().parent
RESULT = HERE.parent / "results" / "device.attention_cost.json"
REPRODUCE = "python -m benchmarks.device.attention_cost --data-dir ../shared/data"
SEED = 2031
METHODS = {
    "micro": 'chronica plan_step, balance="micro"',
    "rank": 'chronica plan_step, balance="rank"',
    "verl": "verl (KK equal counts + rearrange_micro_batches)",
    "nemo_rl": "NeMo-RL first-fit decreasing",
    "lpt": "lockstep LPT reference",
}


@dataclass(frozen=True)
class Settings:
    """One run.

    Args:
        cases: ``(data, W, cap)`` triples; ``data`` a key of ``benchmarks.lockstep.DATA``.
        steps: global batches planned per case.
        repeats: timings per micro-batch (the median is kept).
        calibration: calibration micro-batches per case.
        model: the decoder's shape.
        budget_s: no case starts after this many seconds.
    """

    cases: tuple[tuple[str, int, int], ...]
    steps: int
    repeats: int
    calibration: int
    model: LlamaConfig
    budget_s: float


FULL = Settings(
    cases=(("ln7-1.5", 8, 16384), ("head500", 8, 8192), ("ln6-1.5", 16, 8192)),
    steps=2,
    repeats=3,
    calibration=48,
    model=LlamaConfig(),
    budget_s=250.0,
)
DRY_RUN = Settings(
    cases=(("ln6-1.0", 2, 2048), ("ln6-1.5", 4, 2048)),
    steps=1,
    repeats=1,
    calibration=12,
    model=LlamaConfig(vocab=128, hidden=32, layers=1, heads=2, ffn=64),
    budget_s=600.0,
)


class Timer:
    """Times ``model``'s forward and backward pass on packed micro-batches: CUDA events
    on a GPU, ``perf_counter`` elsewhere; the median of ``repeats``.

    Args:
        model: the decoder, on its device.
        repeats: timings per micro-batch.
    """

    def __init__(self, model: TinyLlama, repeats: int) -> None:
        self.model, self.repeats = model, repeats
        self.device = next(model.parameters()).device
        self.calls = 0

    def __call__(self, lengths: np.ndarray) -> float:
        if lengths.shape[0] == 0:
            return 0.0  # an empty cell computes nothing
        self.calls += 1
        batch = packed_batch(lengths, self.model.config.vocab, self.device, SEED + self.calls)
        times = [self._once(batch) for _ in range(self.repeats)]
        return float(np.median(times))

    def _once(self, batch) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.model(batch).backward()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            begin = time.perf_counter()
            self.model(batch).backward()
            seconds = time.perf_counter() - begin
        self.model.zero_grad(set_to_none=True)
        return seconds


class Lengths:
    """Document lengths of one data set of ``benchmarks.lockstep.DATA``, cut to the cap:
    its file sampled with replacement, or its lognormal.

    Args:
        key: the data set.
        data_dir: where its file lives (a lognormal needs none).
    """

    def __init__(self, key: str, data_dir: Path) -> None:
        self.data = DATA[key]
        self.pool = None
        if self.data.file is not None:
            self.pool = np.loadtxt(data_dir / self.data.file, dtype=np.int64, ndmin=1)

    def draw(self, n: int, cap: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` lengths in ``[1, cap]``."""
        if self.pool is None:
            raw = rng.lognormal(self.data.mu, self.data.sigma, n)
        else:
            raw = self.pool[rng.integers(0, self.pool.size, n)].astype(np.float64)
        return np.clip(np.rint(raw), 1, cap).astype(np.int64)


def calibration_batches(
    source: Lengths, cap: int, count: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``count`` micro-batches of the case's lengths, each filled up to a token count drawn
    in ``[cap/8, cap]`` (one document at least), so the fit sees few and many documents,
    short and long."""
    batches = []
    for _ in range(count):
        target = int(rng.integers(cap // 8, cap + 1))
        lengths: list[int] = []
        while True:
            n = int(source.draw(1, cap, rng)[0])
            if lengths and sum(lengths) + n > target:
                break
            lengths.append(n)
        batches.append(np.array(lengths, dtype=np.int64))
    return batches


def plan(key: str, lengths: np.ndarray, model: CostModel, w: int, cap: int) -> MicroBatches:
    """Method ``key``'s micro-batches of one step, planned with ``model``."""
    if key in ("micro", "rank"):
        step = plan_step(lengths, w, Packing(max_tokens=cap, balance=key), cost=model)
        return MicroBatches(step.rank, step.micro, step.num_micro, lengths.astype(np.float64))
    if key == "nemo_rl":
        return peers.nemo_rl(lengths, w, cap)
    return getattr(peers, key)(lengths, model(lengths), w, cap)  # verl, lpt: by cost


def cells(mb: MicroBatches, lengths: np.ndarray, w: int) -> list[list[np.ndarray]]:
    """Per rank, per micro-batch in execution order: the lengths of its documents."""
    return [
        [lengths[(mb.rank == r) & (mb.micro == k)] for k in range(mb.num_micro)] for r in range(w)
    ]


def step_figures(times: np.ndarray) -> dict[str, Any]:
    """Lockstep step, rank-sum step and per-rank sums of a ``(W, micro-batches)`` table."""
    sums = times.sum(axis=1)
    return {
        "lockstep": lockstep(times),
        "ranksum": rank_step(times),
        "mean": float(sums.mean()),
        "ranks": [float(s) for s in sums],
    }


def _relative(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else 0.0


def _features(batches: list[np.ndarray]) -> np.ndarray:
    """``(documents, tokens, squared tokens)`` of every micro-batch."""
    return np.array([[b.size, b.sum(), np.square(b.astype(np.float64)).sum()] for b in batches])


def _method_figures(table, measured: np.ndarray, predicted: np.ndarray, cap: int) -> dict:
    m, p = step_figures(measured), step_figures(predicted)
    return {
        "micro": len(table[0]),
        "over_cap": int(sum(c.sum() > cap for rank in table for c in rank)),
        "measured": m,
        "predicted": p,
        "error": {
            "lockstep": _relative(p["lockstep"], m["lockstep"]),
            "ranksum": _relative(p["ranksum"], m["ranksum"]),
            "rank_worst": max(
                abs(_relative(x, y)) for x, y in zip(p["ranks"], m["ranks"], strict=True)
            ),
        },
    }


def _case(
    settings: Settings,
    case: tuple[str, int, int],
    timer: Callable[[np.ndarray], float],
    data_dir: Path,
) -> dict:
    """Plan with a first fit, then time every cell of every plan, the calibration set again
    and micro's plan a second time, all in one shuffled order (so that a drift of the GPU's
    clocks falls on all alike); fit again on the second calibration times and predict."""
    data_key, w, cap = case
    source = Lengths(data_key, data_dir)
    rng = np.random.default_rng([SEED, w, cap])
    calibration = calibration_batches(source, cap, settings.calibration, rng)
    first = np.array([timer(b) for b in calibration])
    planning_overhead, planning_model = fit(np.column_stack([_features(calibration), first]))
    n = docs_per_rank(source.data, source.pool, cap, w) * w
    steps = [source.draw(n, cap, rng) for _ in range(settings.steps)]
    tables = {
        (i, key): cells(plan(key, lengths, planning_model, w, cap), lengths, w)
        for i, lengths in enumerate(steps)
        for key in METHODS
    }
    # Every timing, as (what, step, method, rank, micro-batch) -> lengths.
    jobs = [(("calibration", 0, "", j, 0), b) for j, b in enumerate(calibration)]
    for (i, key), table in tables.items():
        for r, rank in enumerate(table):
            for k, c in enumerate(rank):
                jobs.append((("plan", i, key, r, k), c))
                if key == "micro":
                    jobs.append((("again", i, key, r, k), c))
    times = {}
    for j in rng.permutation(len(jobs)):
        times[jobs[j][0]] = timer(jobs[j][1])
    second = np.array([times["calibration", 0, "", j, 0] for j in range(len(calibration))])
    overhead, model = fit(np.column_stack([_features(calibration), second]))
    out_steps = []
    for i, lengths in enumerate(steps):
        methods = {}
        for key in METHODS:
            table = tables[i, key]
            shape = (w, len(table[0]))
            measured = np.array([times[("plan", i, key, *rk)] for rk in np.ndindex(shape)])
            predicted = np.array(
                [
                    overhead + float(model(table[r][k]).sum()) if table[r][k].size else 0.0
                    for r, k in np.ndindex(shape)
                ]
            )
            methods[key] = _method_figures(
                table, measured.reshape(shape), predicted.reshape(shape), cap
            )
            methods[key]["cells"] = {
                "tokens": [int(table[r][k].sum()) for r, k in np.ndindex(shape)],
                "measured": measured.tolist(),
                "predicted": predicted.tolist(),
            }
        shape = (w, len(tables[i, "micro"][0]))
        again = np.array([times[("again", i, "micro", *rk)] for rk in np.ndindex(shape)])
        first_pass = np.array(methods["micro"]["cells"]["measured"]).reshape(shape)
        # The same plan timed twice: how far apart two measurements of it are.
        noise = _method_figures(tables[i, "micro"], first_pass, again.reshape(shape), cap)
        out_steps.append(
            {
                "documents": int(n),
                "tokens": int(lengths.sum()),
                "methods": methods,
                "noise": noise["error"],
            }
        )
    return {
        "data": data_key,
        "label": DATA[data_key].label,
        "world": w,
        "max_tokens": cap,
        "fit": {"overhead": overhead, "model": list(model.to_tuple())},
        "planning_fit": {"overhead": planning_overhead, "model": list(planning_model.to_tuple())},
        "calibration_drift": float(np.median(second / first) - 1),
        "steps": out_steps,
        "summary": _summary(out_steps),
        "noise": {
            name: max(abs(s["noise"][name]) for s in out_steps)
            for name in ("lockstep", "ranksum", "rank_worst")
        },
    }


def _summary(steps: list[dict]) -> dict:
    """Per method, over the steps: mean measured lockstep and rank-sum step (seconds), each
    against chronica micro's, and the worst absolute prediction errors."""
    out = {}
    base = np.mean([s["methods"]["micro"]["measured"]["lockstep"] for s in steps])
    for key in METHODS:
        rows = [s["methods"][key] for s in steps]
        lockstep = float(np.mean([r["measured"]["lockstep"] for r in rows]))
        out[key] = {
            "lockstep_s": lockstep,
            "ranksum_s": float(np.mean([r["measured"]["ranksum"] for r in rows])),
            "vs_micro": lockstep / base if base else 1.0,
            "error_lockstep": max(abs(r["error"]["lockstep"]) for r in rows),
            "error_ranksum": max(abs(r["error"]["ranksum"]) for r in rows),
            "error_rank": max(r["error"]["rank_worst"] for r in rows),
            "over_cap": int(sum(r["over_cap"] for r in rows)),
        }
    return out


def run(
    settings: Settings,
    data_dir: Path | None = None,
    out: Path | None = None,
    timer: Callable[[np.ndarray], float] | None = None,
) -> dict:
    """Run the cases (module docstring); the result as a dict, also written to ``out``
    after every case, so a run cut short keeps what it measured.

    Args:
        settings: the cases and the model.
        data_dir: where the length files are (default ``../shared/data``).
        out: the JSON file to write.
        timer: seconds of one micro-batch from its documents' lengths (default: the
            decoder's forward and backward on this machine, ``Timer``); a given one makes
            the run a check of the arithmetic, with known times.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    began = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(SEED)
    kernel, attend, why = pick_attention(device, dtype)
    model = TinyLlama(settings.model, attend).to(device, dtype)
    if timer is None:
        timer = Timer(model, settings.repeats)
        largest = max(cap for _, _, cap in settings.cases)
        for _ in range(3):  # warm the kernels and the clocks at the largest micro-batch
            timer(np.array([largest // 2, largest // 4, largest // 4], dtype=np.int64))
    result: dict[str, Any] = {
        "mode": "full" if cuda else "quick",
        "command": REPRODUCE,
        "machine": machine_info(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "attention": {"kernel": kernel, "why": why},
        "settings": asdict(settings),
        "parameters_m": parameters_millions(model),
        "methods": METHODS,
        "cases": [],
        "left_out": [],
    }
    for case in settings.cases:
        file = DATA[case[0]].file
        if time.perf_counter() - began > settings.budget_s:
            result["left_out"].append({"case": list(case), "why": "time budget"})
            continue
        if file is not None and not (data_dir / file).is_file():
            result["left_out"].append({"case": list(case), "why": f"no {data_dir / file}"})
            continue
        result["cases"].append(_case(settings, case, timer, data_dir))
        result["wall_seconds"] = time.perf_counter() - began
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
        print(format_table({**result, "cases": result["cases"][-1:]}), flush=True)
    return result


def format_table(result: dict) -> str:
    """One line per case and method: measured steps, the ratio to chronica micro, the
    prediction's errors."""
    lines = [
        f"{'case':<22} {'method':<8} {'lockstep ms':>11} {'vs micro':>8} {'ranksum ms':>10} "
        f"{'err lock':>8} {'err sum':>8} {'err rank':>8} {'over cap':>8}"
    ]
    for case in result["cases"]:
        name = f"{case['data']}-W{case['world']}-{case['max_tokens'] // 1024}k"
        noise = case["noise"]
        lines.append(
            f"{name:<22} {'again':<8} (same plan twice: lockstep {100 * noise['lockstep']:.2f}%, "
            f"rank-sum {100 * noise['ranksum']:.2f}%, rank {100 * noise['rank_worst']:.2f}%; "
            f"drift {100 * case['calibration_drift']:+.2f}%)"
        )
        for key, s in case["summary"].items():
            lines.append(
                f"{name:<22} {key:<8} {1e3 * s['lockstep_s']:>11.2f} {s['vs_micro']:>8.3f} "
                f"{1e3 * s['ranksum_s']:>10.2f} {100 * s['error_lockstep']:>7.2f}% "
                f"{100 * s['error_ranksum']:>7.2f}% {100 * s['error_rank']:>7.2f}% "
                f"{s['over_cap']:>8}"
            )
    return "\n".join(lines)


def render_markdown(result: dict, img_dir: Path) -> str:
    """The page's section: where it ran, the kernel, one table per case."""
    del img_dir  # tables only
    settings = result["settings"]
    model = settings["model"]
    lines = [
        "## On one GPU: predicted against measured micro-batch time",
        "",
        f"`benchmarks/device/attention_cost.py` on {result['device']} ({result['dtype']}): a "
        f"Llama-style decoder of {result['parameters_m']:.0f} M parameters (width "
        f"{model['hidden']}, {model['layers']} blocks, {model['heads']} heads, vocabulary "
        f"{model['vocab']}), attention kernel `{result['attention']['kernel']}` "
        f"({result['attention']['why']}). Each rank's planned micro-batches are timed one after "
        f"another on the one GPU (forward and backward, median of {settings['repeats']}); the "
        f"methods plan with a cost model fitted to {settings['calibration']} calibration "
        f"micro-batches per case (not the plans'); then every cell of every plan, the "
        f"calibration set again and chronica micro's plan a second time are timed in one "
        f"shuffled pass, and the model fitted to that pass's calibration times predicts the "
        f"plans (its fixed cost and cost per document separate only where calibration "
        f"micro-batches hold different numbers of documents). Lockstep step = "
        f"Σₖ maxᵣ t[r, k], rank-sum step = maxᵣ Σₖ t[r, k], both in ms, the mean over "
        f"{settings['steps']} steps; the errors are the worst over the steps of predicted "
        f"against measured (per rank: the worst rank).",
        "",
        "Reproduce on a CUDA machine: `python -m benchmarks.device.attention_cost` "
        "(`--dry-run` runs it on a CPU with a tiny model; the tests run it with known times).",
        "",
    ]
    for case in result["cases"]:
        a, b, c = case["fit"]["model"]
        lines += [
            f"### {case['label']}, W = {case['world']}, cap {case['max_tokens']} tokens",
            "",
            f"Fitted: {1e3 * case['fit']['overhead']:.3f} ms per micro-batch + "
            f"{1e6 * a:.2f} µs per document + {1e9 * b:.3f} ns per token + "
            f"{1e12 * c:.4f} ps per token².",
            "",
            "| method | lockstep step (ms) | vs micro | rank-sum step (ms) | error lockstep "
            "| error rank-sum | error per rank | micro-batches over cap |",
            "|---|---|---|---|---|---|---|---|",
        ]
        noise = case["noise"]
        lines[-2:-2] = [
            f"The same plan timed twice (chronica micro's, in the same shuffled pass) differs by "
            f"up to {100 * noise['lockstep']:.2f}% in the lockstep step, "
            f"{100 * noise['ranksum']:.2f}% in the rank-sum step and "
            f"{100 * noise['rank_worst']:.2f}% for one rank: no prediction can be closer. The "
            f"calibration set's median time moved {100 * case['calibration_drift']:+.2f}% "
            f"between its first timing and the shuffled pass.",
            "",
        ]
        for key, s in case["summary"].items():
            lines.append(
                f"| {result['methods'][key]} | {1e3 * s['lockstep_s']:.2f} | {s['vs_micro']:.3f} "
                f"| {1e3 * s['ranksum_s']:.2f} | {100 * s['error_lockstep']:.2f}% "
                f"| {100 * s['error_ranksum']:.2f}% | {100 * s['error_rank']:.2f}% "
                f"| {s['over_cap']} |"
            )
        lines += ["", _reading(case), ""]
    for left in result["left_out"]:
        lines.append(f"- Left out: {left['case']} ({left['why']}).")
    return "\n".join(lines) + "\n"


def _reading(case: dict) -> str:
    """What the case's figures say, and whether its noise lets them say it."""
    noise = case["noise"]["lockstep"]
    cells = [t for s in case["steps"] for t in s["methods"]["micro"]["cells"]["measured"] if t > 0]
    fixed = case["fit"]["overhead"] / float(np.mean(cells))
    summary = case["summary"]
    best = min(summary, key=lambda key: summary[key]["lockstep_s"])
    if noise > 0.05:
        return (
            f"Reading: two timings of one plan differ by {100 * noise:.1f}%, so neither the "
            f"prediction nor the order of the methods can be read here. A micro-batch of this "
            f"size is {100 * fixed:.0f}% fixed cost (time that does not grow with its tokens, "
            f"most likely the host launching kernels), so its timing follows the host's."
        )
    lead = (
        "chronica micro's lockstep step is the shortest measured"
        if best == "micro"
        else f"the shortest lockstep step measured is {METHODS[best]}'s, "
        f"{summary['micro']['vs_micro'] / summary[best]['vs_micro']:.3f}× shorter than micro's"
    )
    error = summary["micro"]["error_lockstep"]
    return (
        f"Reading: {lead}; its predicted lockstep step is within {100 * error:.1f}% of the "
        f"measured one, where two timings of the plan differ by {100 * noise:.1f}%; "
        f"{100 * fixed:.0f}% of a micro-batch is fixed cost."
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--dry-run``, ``--json PATH``, ``--data-dir DIR``, ``--budget-s S``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, a minute")
    parser.add_argument("--json", type=Path, default=None, help=f"default: {RESULT}")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=None)
    args = parser.parse_args(argv)
    settings = DRY_RUN if args.dry_run else FULL
    if args.budget_s is not None:
        settings = replace(settings, budget_s=args.budget_s)
    out = args.json or (None if args.dry_run else RESULT)
    result = run(settings, args.data_dir, out)
    print(
        f"{len(result['cases'])} cases in {result.get('wall_seconds', 0):.0f} s; "
        f"left out: {result['left_out']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
