"""Data movement, label skew and balance of chronica's shuffle policies.

Movement is ``chronica.core.movement``: the samples (and bytes) every node trains on in an
epoch that it does not hold. Under ``local``/``partial`` a node holds its own partition;
otherwise what it trained on the previous epoch. Measured on epochs 1..3 (median), beside the
analytic figure ``f·N(1-1/W)`` with ``f = 1`` for the policies that reshuffle everything
(``global``, ``block``, ``stratified``), ``f = q`` for ``partial(q)`` and ``f = 0`` for
``local`` and ``none``. Every policy is planned twice: with ``batch_size=None`` (each rank
takes torch's strided share of the order) and balanced (exact mode, ``B = 32·W``).
Balancing moves samples of a global batch between ranks by size, so a heavy sample tends to
land on the same rank epoch after epoch, and the measured movement of ``global`` is a little
below the analytic figure.

Label skew is ``chronica.core.label_skew`` (Jensen–Shannon divergence, base 2) of every
global batch and every node's share against the whole data set, with 10 random classes.

The balance part compares the per-step max/mean rank cost of partitioned data sets
(``local``, one node of 4 ranks or one node per rank) with the unpartitioned ``global``
policy on the same sizes, in exact mode and in pool mode (``exact=False``).

Run alone: ``python -m benchmarks --only movement [--quick]``.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import lognormal_sizes, machine_info
from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy, label_skew, movement

__all__ = ["BALANCE_CASES", "POLICIES", "format_table", "run"]

DATA_SEED = 2024
LABEL_SEED = 7
NUM_CLASSES = 10
BYTES_PER_TOKEN = 4  # tokens stored as int32
PER_RANK_BATCH = 32
EPOCHS = [1, 2, 3]
BALANCE_REPLICAS = 16
RANKS_PER_NODE = 4

# (key, label, policy, analytic fraction of N(1-1/W) moved per epoch).
POLICIES = [
    ("global", "global", ShufflePolicy("global"), 1.0),
    ("block", "block(64)", ShufflePolicy.block(64), 1.0),
    ("stratified", "stratified", ShufflePolicy("stratified"), 1.0),
    ("local", "local (contiguous)", ShufflePolicy.local(partition="contiguous"), 0.0),
    ("partial_0.1", "partial(q=0.1)", ShufflePolicy.partial(0.1), 0.1),
    ("partial_0.5", "partial(q=0.5)", ShufflePolicy.partial(0.5), 0.5),
    ("partial_1.0", "partial(q=1.0)", ShufflePolicy.partial(1.0), 1.0),
    ("none", "none", ShufflePolicy("none"), 0.0),
]

# (key, label, policy, ranks per node or None for one node per rank, exact).
BALANCE_CASES = [
    ("global_exact", "global, unpartitioned, exact", ShufflePolicy("global"), None, True),
    ("global_pool", "global, unpartitioned, pool", ShufflePolicy("global"), None, False),
    ("local_node_exact", "local, 4 ranks per node, exact", ShufflePolicy.local(), 4, True),
    ("local_node_pool", "local, 4 ranks per node, pool", ShufflePolicy.local(), 4, False),
    ("local_rank_exact", "local, one node per rank, exact", ShufflePolicy.local(), None, True),
    ("local_rank_pool", "local, one node per rank, pool", ShufflePolicy.local(), None, False),
]


def _movement_row(sizes, labels, nbytes, w: int, policy, fraction: float, batch) -> dict:
    """Median movement and label skew of one (policy, W, balancing) over ``EPOCHS``."""
    config = ScheduleConfig(num_replicas=w, batch_size=batch, shuffle=policy, seed=0)
    scheduler = Scheduler(sizes, config, labels=labels)
    moved, moved_bytes, batch_skew, node_skew = [], [], [], []
    for epoch in EPOCHS:
        mv = movement(scheduler, epoch, sample_bytes=nbytes)
        sk = label_skew(scheduler, epoch, labels)
        moved.append(mv.total_samples)
        assert mv.total_bytes is not None  # sample_bytes was given
        moved_bytes.append(mv.total_bytes)
        batch_skew.append(sk.batch_mean)
        node_skew.append(sk.node_mean)
    n = sizes.shape[0]
    analytic = fraction * n * (1 - 1 / w)
    samples = float(np.median(moved))
    return {
        "samples": samples,
        "samples_per_epoch": moved,
        "bytes": float(np.median(moved_bytes)),
        "analytic_samples": analytic,
        "analytic_bytes": fraction * float(nbytes.sum()) * (1 - 1 / w),
        "ratio": samples / analytic if analytic else None,
        "batch_skew": float(np.median(batch_skew)),
        "node_skew": float(np.median(node_skew)),
    }


def _balance_rows(sizes: np.ndarray) -> list[dict]:
    """Per-step balance of partitioned and unpartitioned plans, W=16, B=32·W."""
    w = BALANCE_REPLICAS
    rows = []
    for key, label, policy, per_node, exact in BALANCE_CASES:
        groups = None if per_node is None else tuple(r // per_node for r in range(w))
        config = ScheduleConfig(
            num_replicas=w,
            batch_size=PER_RANK_BATCH * w,
            shuffle=policy,
            groups=groups,
            exact=exact,
            seed=0,
        )
        scheduler = Scheduler(sizes, config)
        stats = [scheduler.stats(epoch) for epoch in EPOCHS]
        rows.append(
            {
                "key": key,
                "label": label,
                "mean": float(np.median([s.load_ratio_mean for s in stats])),
                "worst": float(np.median([s.load_ratio_worst for s in stats])),
            }
        )
    return rows


def run(quick: bool) -> dict:
    """Movement, label skew and balance per policy; returns the JSON-ready result."""
    n = 16384 if quick else 65536
    world_sizes = [4, 16] if quick else [4, 16, 64]
    started = time.perf_counter()
    sizes = lognormal_sizes(n, DATA_SEED)
    nbytes = sizes.astype(np.int64) * BYTES_PER_TOKEN
    labels = np.random.default_rng(LABEL_SEED).integers(0, NUM_CLASSES, n)
    cases = []
    for w in world_sizes:
        for key, label, policy, fraction in POLICIES:
            cases.append(
                {
                    "num_replicas": w,
                    "policy": key,
                    "label": label,
                    "unbalanced": _movement_row(sizes, labels, nbytes, w, policy, fraction, None),
                    "balanced": _movement_row(
                        sizes, labels, nbytes, w, policy, fraction, PER_RANK_BATCH * w
                    ),
                }
            )
    return {
        "name": "movement",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "num_samples": n,
        "data_seed": DATA_SEED,
        "label_seed": LABEL_SEED,
        "num_classes": NUM_CLASSES,
        "bytes_per_token": BYTES_PER_TOKEN,
        "per_rank_batch": PER_RANK_BATCH,
        "epochs": EPOCHS,
        "world_sizes": world_sizes,
        "policies": {key: label for key, label, _, _ in POLICIES},
        "cases": cases,
        "balance": {
            "num_replicas": BALANCE_REPLICAS,
            "batch_size": PER_RANK_BATCH * BALANCE_REPLICAS,
            "rows": _balance_rows(sizes),
        },
    }


def format_table(result: dict) -> str:
    """Plain-text tables: movement against the analytic figure, then balance."""
    lines = [
        f"N={result['num_samples']:,}, median over epochs {result['epochs']}; "
        "moved samples: torch split | balanced (B=32·W) | analytic"
    ]
    for case in result["cases"]:
        un, bal = case["unbalanced"], case["balanced"]
        ratio = "" if bal["ratio"] is None else f"  ratio {un['ratio']:.4f} | {bal['ratio']:.4f}"
        lines.append(
            f"  W={case['num_replicas']:<3d} {case['label']:20s} {un['samples']:9.0f} | "
            f"{bal['samples']:9.0f} | {bal['analytic_samples']:9.0f}{ratio}  "
            f"skew batch {bal['batch_skew']:.4f} node {bal['node_skew']:.5f}"
        )
    bal = result["balance"]
    lines.append(f"balance, W={bal['num_replicas']}, B={bal['batch_size']}")
    for row in bal["rows"]:
        lines.append(f"  {row['label']:36s} mean {row['mean']:.5f}  worst {row['worst']:.5f}")
    return "\n".join(lines)
