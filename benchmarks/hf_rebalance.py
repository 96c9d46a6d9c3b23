"""chronica against transformers' own ``BatchRebalanceSampler`` (``TrainingArguments(
train_sampling_strategy="batch_rebalance")``), the real class, on the same data.

Both split every global batch of ``B`` samples between ``W`` ranks (one micro-batch per rank
and step: ``gradient_accumulation_steps=1``); what they balance differs:

- transformers: a *padded* cost per micro-batch, ``n·L + 0.001·n·L²`` (``n`` samples padded to
  the longest, ``L``), by moving the cut points of the global batch sorted by length, so ranks
  get unequal sample counts (long samples in small micro-batches);
- chronica: a cost per *sample* (``a + b·s + c·s²``), summed per rank, with equal counts
  (``exact=True``): the gradient stays the plain mean over the step. Three configurations:
  ``linear`` (tokens, what variable-length / packed attention costs), ``quadratic`` with
  transformers' coefficients (``s + 0.001·s²``), and ``kind="guided"`` (samples of similar
  length share a step, as ``group_by_length`` does, each step balanced).

Every method is scored on both metrics, per step: the slowest rank's cost over the mean rank
cost, with the cost of a rank (1) its tokens and (2) transformers' padded cost; plus the
ranks' sample counts (max/min) and the padding share. torch's ``DistributedSampler`` (no
balancing) is the reference. Lengths: lognormal(5, 1) tokens, and the same with 1% of the
samples ten times longer (long documents). Planning time: one epoch, all ranks (transformers
computes every rank's split on every rank; the time shown is one rank's).

    python -m benchmarks --only hf_rebalance
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "python -m benchmarks --only hf_rebalance"
W, B = 8, 256
QUADRATIC = 0.001  # transformers' BatchRebalanceSampler.QUADRATIC_COST_COEF
METHODS = {
    "torch": "torch `DistributedSampler` (no balancing)",
    "transformers": 'transformers `BatchRebalanceSampler` ("batch_rebalance")',
    "chronica_linear": 'chronica, `cost="linear"` (tokens)',
    "chronica_quadratic": f"chronica, `cost=(0, 1, {QUADRATIC})` (s + {QUADRATIC}·s²)",
    "chronica_guided": 'chronica, `kind="guided"` (similar lengths share a step)',
}


def _lengths(n: int, long_share: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.rint(rng.lognormal(5, 1, n))).astype(np.int64)
    if long_share:
        long = rng.choice(n, size=int(long_share * n), replace=False)
        lengths[long] *= 10
    return lengths


def _transformers(lengths: np.ndarray) -> tuple[list[list[np.ndarray]], float]:
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    per_rank = []
    seconds = 0.0
    for rank in range(W):
        sampler = BatchRebalanceSampler(
            lengths.tolist(), effective_batch_size=B, dp_size=W, grad_accum=1, rank=rank, seed=0
        )
        started = time.perf_counter()
        per_rank.append([np.asarray(b, dtype=np.int64) for b in sampler])
        seconds += time.perf_counter() - started
    steps = [[per_rank[r][s] for r in range(W)] for s in range(len(per_rank[0]))]
    return steps, seconds / W


def _chronica(
    lengths: np.ndarray, cost: Any, kind: str = "static"
) -> tuple[list[list[np.ndarray]], float]:
    from chronica.torch.utils.data import DistributedSampler

    sampler = DistributedSampler(
        range(len(lengths)),
        W,
        0,
        batch_size=B,
        sizes=lengths,
        cost=cost,
        kind=kind,
        drop_last=True,
    )
    sampler.set_epoch(1)
    sampler.plan(0)  # compile the kernels outside the timing
    started = time.perf_counter()
    plan = sampler.plan()
    seconds = time.perf_counter() - started
    steps = [[plan.local(s, r) for r in range(W)] for s in range(plan.num_steps)]
    return steps, seconds


def _torch(lengths: np.ndarray) -> tuple[list[list[np.ndarray]], float]:
    import torch.utils.data as tud

    local = B // W
    started = time.perf_counter()
    streams = []
    for rank in range(W):
        sampler = tud.DistributedSampler(range(len(lengths)), W, rank, seed=0, drop_last=True)
        streams.append(np.fromiter(sampler, dtype=np.int64))
    seconds = (time.perf_counter() - started) / W
    count = len(streams[0]) // local
    steps = [[s[i * local : (i + 1) * local] for s in streams] for i in range(count)]
    return steps, seconds


def _score(steps: list[list[np.ndarray]], lengths: np.ndarray, seconds: float) -> dict:
    tokens = np.array([[lengths[b].sum() for b in step] for step in steps], dtype=np.float64)
    longest = np.array([[lengths[b].max(initial=0) for b in step] for step in steps], float)
    counts = np.array([[len(b) for b in step] for step in steps], dtype=np.float64)
    padded = counts * longest + QUADRATIC * counts * longest**2

    def ratio(loads: np.ndarray) -> np.ndarray:
        return loads.max(axis=1) / loads.mean(axis=1)

    token_ratio, padded_ratio = ratio(tokens), ratio(padded)
    seen = np.concatenate([b for step in steps for b in step])
    return {
        "steps": len(steps),
        "samples": int(seen.shape[0]),
        "unique": int(np.unique(seen).shape[0]),
        "tokens_mean": float(token_ratio.mean()),
        "tokens_worst": float(token_ratio.max()),
        "padded_mean": float(padded_ratio.mean()),
        "padded_worst": float(padded_ratio.max()),
        "count_spread_mean": float((counts.max(axis=1) / np.maximum(counts.min(axis=1), 1)).mean()),
        "count_min": int(counts.min()),
        "count_max": int(counts.max()),
        "padding_fraction": float(1.0 - tokens.sum() / (counts * longest).sum()),
        "plan_seconds": seconds,
    }


def run(quick: bool) -> dict[str, Any]:
    """Balance of each method on two length distributions; ``n`` samples, 8 ranks, global
    batch 256, one epoch."""
    import transformers

    n = 16_384 if quick else 131_072
    result: dict[str, Any] = {
        "ranks": W,
        "global_batch": B,
        "n": n,
        "transformers": transformers.__version__,
        "methods": METHODS,
        "cases": {},
    }
    for case, share in (("lognormal", 0.0), ("lognormal + 1% 10x long", 0.01)):
        lengths = _lengths(n, share)
        runs = {
            "torch": _torch(lengths),
            "transformers": _transformers(lengths),
            "chronica_linear": _chronica(lengths, "linear"),
            "chronica_quadratic": _chronica(lengths, (0.0, 1.0, QUADRATIC)),
            "chronica_guided": _chronica(lengths, "linear", kind="guided"),
        }
        result["cases"][case] = {
            name: _score(steps, lengths, seconds) for name, (steps, seconds) in runs.items()
        }
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'case':26}{'method':20}{'tokens':>14}{'padded':>14}{'counts':>10}{'pad %':>7}"
        f"{'plan s':>8}"
    ]
    for case, methods in result["cases"].items():
        for name, m in methods.items():
            lines.append(
                f"{case:26}{name:20}{m['tokens_mean']:7.4f}/{m['tokens_worst']:<6.3f}"
                f"{m['padded_mean']:7.4f}/{m['padded_worst']:<6.3f}"
                f"{m['count_min']:>4}-{m['count_max']:<5}{100 * m['padding_fraction']:6.1f}"
                f"{m['plan_seconds']:8.3f}"
            )
    return "\n".join(lines)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md."""
    del img_dir
    lines = [
        "## transformers' batch_rebalance",
        "",
        f"transformers {result['transformers']} ships its own balancing sampler, "
        '`TrainingArguments(train_sampling_strategy="batch_rebalance")` '
        "(`transformers.trainer_pt_utils.BatchRebalanceSampler`). The real class and "
        f"chronica split the same global batches of {result['global_batch']} samples "
        f"between {result['ranks']} ranks ({result['n']:,} lognormal(5, 1) token lengths, "
        "one epoch, one micro-batch per rank and step). They balance different things: "
        "transformers a padded cost per micro-batch (n·L + 0.001·n·L², every sample padded "
        "to the longest, L) by giving ranks unequal sample counts; chronica a per-sample "
        "cost summed per rank, with equal counts, so the gradient stays the step's plain "
        "mean. Each is scored on both: the slowest rank over the mean rank, per step "
        "(mean / worst), with a rank's cost its tokens (variable-length or packed "
        "attention) or transformers' padded cost (padded batches).",
        "",
        "| lengths | method | tokens: max/mean | padded cost: max/mean | samples per rank "
        "| padding | plan (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, methods in result["cases"].items():
        for name, m in methods.items():
            lines.append(
                f"| {case} | {result['methods'][name]} | {m['tokens_mean']:.4f} / "
                f"{m['tokens_worst']:.3f} | {m['padded_mean']:.4f} / {m['padded_worst']:.3f} "
                f"| {m['count_min']}–{m['count_max']} | {100 * m['padding_fraction']:.1f}% | "
                f"{m['plan_seconds']:.3f} |"
            )
    first = next(iter(result["cases"].values()))
    hf, linear, guided = first["transformers"], first["chronica_linear"], first["chronica_guided"]
    lines += [
        "",
        "Each method does best on the cost it balances. On tokens, chronica's default "
        f"reaches {linear['tokens_mean']:.4f} on average where transformers stays at "
        f"{hf['tokens_mean']:.2f} (about torch's: it does not balance tokens). On the padded "
        f"cost, transformers reaches {hf['padded_mean']:.2f} by moving samples between ranks "
        f"({hf['count_min']} to {hf['count_max']} per rank instead of "
        f"{result['global_batch'] // result['ranks']}; the loss must then be normalised by "
        "the global number of items, as transformers does for token losses), while "
        "chronica's exact mode keeps torch's random global batches and equal counts: the "
        "rank holding a step's longest sample pads all of its samples to it, whatever the "
        'split (the `quadratic` cost cannot change that). `kind="guided"` lets samples of '
        "similar length share a step, as `group_by_length` does: "
        f"{guided['tokens_mean']:.4f} on tokens and {guided['padded_mean']:.2f} on the "
        f"padded cost, with {100 * guided['padding_fraction']:.0f}% padding (transformers "
        f"{100 * hf['padding_fraction']:.0f}%), at the price of less random steps. With "
        "packed or variable-length batches the token balance is the one that counts; with "
        "padded batches, use `guided` or packing (`Packing`). Plan time: one epoch; "
        "chronica's covers all ranks in one call (numba), transformers' is one rank's pass "
        "(pure Python, repeated on every rank).",
        "",
        f"Reproduce: `{REPRODUCE}`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(run(quick=True)))
