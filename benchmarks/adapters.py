"""What the adapters cost: one epoch of input through chronica vs the framework's own way.

For each framework, the time to produce one rank's epoch of local batches (indices, or padded
arrays) with chronica and with the usual baseline, in the same run, median over repeats:

- torch: iterating ``chronica.torch.utils.data.DistributedSampler`` (planning the epoch
  included) vs ``torch.utils.data.DistributedSampler``;
- TensorFlow: ``ds.apply(chronica.tf.schedule(...))`` vs ``ds.padded_batch(B // W)``;
- JAX: ``chronica.jax.iterator`` (padded numpy batches, static shapes) vs slicing the same
  samples into batches and padding them with numpy.

    python -m benchmarks --only adapters
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import median_seconds

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "python -m benchmarks --only adapters"
W, B = 8, 256


def _lengths(n: int) -> np.ndarray:
    return np.clip(np.random.default_rng(0).lognormal(4, 1, n), 1, 1024).astype(np.int64)


def _torch(n: int, repeats: int) -> dict[str, float]:
    import torch.utils.data as tud

    from chronica.torch.utils.data import DistributedSampler

    sizes = _lengths(n)
    data = range(n)
    ours = DistributedSampler(data, num_replicas=W, rank=0, batch_size=B, sizes=sizes)
    theirs = tud.DistributedSampler(data, num_replicas=W, rank=0)
    ours.stats(0)  # compile the kernels outside the timing

    def run_ours(repeat: int) -> None:
        ours.set_epoch(repeat + 1)  # a new epoch each time: planning is included
        for _ in ours:
            pass

    def run_theirs(repeat: int) -> None:
        theirs.set_epoch(repeat + 1)
        for _ in theirs:
            pass

    return {
        "chronica": median_seconds(run_ours, repeats, first=0)[0],
        "baseline": median_seconds(run_theirs, repeats, first=0)[0],
    }


def _tf(n: int, repeats: int) -> dict[str, float]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import chronica.tf

    lengths = _lengths(n)
    tokens = np.arange(int(lengths.sum()), dtype=np.int32) % 1000
    ragged = tf.RaggedTensor.from_row_lengths(tokens, lengths)
    ds = tf.data.Dataset.from_tensor_slices({"tokens": ragged}).map(
        lambda ex: {"tokens": ex["tokens"]}
    )

    # Both pipelines are built once, as in training (chronica's store is filled then), and
    # consumed for ``repeats`` epochs back to back after a first (tracing) epoch: the time per
    # epoch is what each further epoch costs, background prefetching included for both.
    steps = -(-n // B)
    ours = ds.apply(
        chronica.tf.schedule(
            sizes=lengths, global_batch_size=B, num_replicas=W, rank=0, epochs=repeats + 1
        )
    )
    theirs = ds.shard(W, 0).shuffle(n // W, seed=0).padded_batch(B // W).repeat(repeats + 1)
    return {
        "chronica": _per_epoch(ours, steps, repeats),
        "baseline": _per_epoch(theirs, steps, repeats),
    }


def _per_epoch(pipeline: Any, steps: int, repeats: int) -> float:
    batches = iter(pipeline)
    for _ in range(steps):
        next(batches)
    started = time.perf_counter()
    for _ in range(steps * repeats):
        next(batches)
    return (time.perf_counter() - started) / repeats


def _jax(n: int, repeats: int) -> dict[str, float]:
    import chronica.jax

    lengths = _lengths(n)
    data = [np.arange(k, dtype=np.int32) for k in lengths]
    rows = B // W

    it = chronica.jax.iterator(data, global_batch_size=B, num_replicas=W, rank=0, epochs=None)
    steps = it.steps_per_epoch
    for _ in range(steps):  # the first epoch: planning compiled, buffers warm
        next(it)

    def run_ours(repeat: int) -> None:
        for _ in range(steps):
            next(it)

    def run_theirs(repeat: int) -> None:
        order = np.random.default_rng(repeat).permutation(n)[0::W]
        for start in range(0, order.shape[0], rows):
            batch = [data[i] for i in order[start : start + rows]]
            out = np.zeros((rows, max(len(b) for b in batch)), np.int32)
            for i, b in enumerate(batch):
                out[i, : len(b)] = b

    return {
        "chronica": median_seconds(run_ours, repeats, first=0)[0],
        "baseline": median_seconds(run_theirs, repeats, first=0)[0],
    }


def run(quick: bool) -> dict[str, Any]:
    """Epoch time per adapter and baseline; ``n`` samples, 8 ranks, global batch 256."""
    repeats = 3 if quick else 7
    cases = {
        "torch": (_torch, 100_000 if quick else 1_000_000),
        "tensorflow": (_tf, 8_192 if quick else 32_768),
        "jax": (_jax, 8_192 if quick else 32_768),
    }
    result: dict[str, Any] = {"ranks": W, "global_batch": B, "repeats": repeats, "cases": {}}
    for name, (measure, n) in cases.items():
        times = measure(n, repeats)
        result["cases"][name] = {"n": n, **times, "ratio": times["chronica"] / times["baseline"]}
    return result


_BASELINES = {
    "torch": "torch.utils.data.DistributedSampler",
    "tensorflow": "ds.shard(W, r).shuffle(...).padded_batch(B // W)",
    "jax": "numpy permutation, slicing and padding",
}


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'adapter':12}{'n':>10}{'chronica s':>12}{'baseline s':>12}{'ratio':>8}"]
    for name, case in result["cases"].items():
        lines.append(
            f"{name:12}{case['n']:>10}{case['chronica']:12.3f}{case['baseline']:12.3f}"
            f"{case['ratio']:7.2f}x"
        )
    return "\n".join(lines)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md."""
    del img_dir
    lines = [
        "## Adapter overhead",
        "",
        f"One rank's epoch of input ({result['ranks']} ranks, global batch "
        f"{result['global_batch']}, lognormal lengths), chronica's adapter against the "
        f"framework's usual way, same run, median of {result['repeats']} epochs. chronica's "
        "time includes planning the epoch (balancing every step for all ranks); the baselines "
        "do no balancing. TensorFlow and JAX pipelines are built once and timed per epoch, as "
        "in training (building the TensorFlow store reads the data set once).",
        "",
        "| adapter | samples | chronica (s) | baseline | baseline (s) | ratio |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for name, case in result["cases"].items():
        lines.append(
            f"| {name} | {case['n']:,} | {case['chronica']:.3f} | {_BASELINES[name]} | "
            f"{case['baseline']:.3f} | {case['ratio']:.2f}× |"
        )
    lines += ["", f"Reproduce: `{REPRODUCE}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(run(quick=True)))
