"""Training quality by shuffle policy: emulated synchronous data-parallel SGD on digits.

scikit-learn's digits (1,797 8×8 images, 10 classes, shipped with the package) are split
into 1,344 training images (8·168, so every epoch covers every sample exactly once with no
padding) and 453 test images with a fixed seed, then the training set is **sorted by label**:
contiguous partitions of it are label-skewed, which is the case where the shuffle policy
matters. W=8 ranks are emulated: every epoch chronica plans the order
(``ScheduleConfig(num_replicas=8, batch_size=64)``, uniform sizes), and at every step the
union of the 8 local batches (the global batch) updates one model with its mean gradient,
which is what synchronous data-parallel SGD computes. The model is an MLP 64→64→10 trained
with SGD (lr 0.1, momentum 0.9); the seed sets both the initial weights and chronica's seed.

Every epoch's plan is checked to cover every training sample exactly once (a failure
raises). Reported: test accuracy after the last epoch, mean ± std over seeds, and the label
skew of the global batches and of the ranks' epoch shares (``chronica.core.label_skew``).

Run alone: ``python -m benchmarks --only quality [--quick]``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from benchmarks.common import machine_info
from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy, label_skew

__all__ = ["POLICIES", "format_table", "run"]

SPLIT_SEED = 0
NUM_TRAIN = 1344  # 8 ranks × 168: no padding
NUM_REPLICAS = 8
BATCH_SIZE = 64  # global: 8 per rank
HIDDEN = 64
LR = 0.1
MOMENTUM = 0.9

# (key, label, policy): every policy runs on the label-sorted training set.
POLICIES = [
    ("global", "global", ShufflePolicy("global")),
    ("stratified", "stratified", ShufflePolicy("stratified")),
    ("local", "local, contiguous, label-sorted", ShufflePolicy.local()),
    ("local_pre", "local, contiguous, pre_shuffle", ShufflePolicy.local(pre_shuffle=True)),
    ("partial", "partial(q=0.1), label-sorted", ShufflePolicy.partial(0.1)),
    ("none", "none (label-sorted order)", ShufflePolicy("none")),
]


def _data() -> tuple[torch.Tensor, np.ndarray, torch.Tensor, torch.Tensor]:
    """Training features and labels (sorted by label), test features and labels."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, train_size=NUM_TRAIN, random_state=SPLIT_SEED
    )
    order = np.argsort(y_train, kind="stable")
    return (
        torch.tensor(x_train[order], dtype=torch.float32),
        y_train[order],
        torch.tensor(x_test, dtype=torch.float32),
        torch.tensor(y_test),
    )


def _check_coverage(plan, n: int, key: str) -> None:
    """Raise unless the plan trains on every one of the ``n`` samples exactly once."""
    uses = np.bincount(plan.indices, minlength=n)
    if plan.num_padded or uses.shape[0] != n or not np.all(uses == 1):
        raise AssertionError(
            f"{key}, epoch {plan.epoch}: {int((uses == 0).sum())} samples missing, "
            f"{int((uses > 1).sum())} repeated, {plan.num_padded} padded"
        )


def _train(policy: ShufflePolicy, key: str, seed: int, epochs: int, data) -> dict:
    """One training run; the test accuracy after the last epoch and the label skew."""
    x_train, y_train, x_test, y_test = data
    n = y_train.shape[0]
    config = ScheduleConfig(
        num_replicas=NUM_REPLICAS, batch_size=BATCH_SIZE, shuffle=policy, seed=seed
    )
    scheduler = Scheduler(np.ones(n), config, labels=y_train)
    targets = torch.tensor(y_train)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(x_train.shape[1], HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    batch_skew, node_skew = [], []
    for epoch in range(epochs):
        plan = scheduler.plan_epoch(epoch)
        _check_coverage(plan, n, key)
        skew = label_skew(scheduler, epoch, y_train)
        batch_skew.append(skew.batch_mean)
        node_skew.append(skew.node_mean)
        for bounds in plan.bounds:
            batch = torch.tensor(plan.indices[bounds[0] : bounds[-1]])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[batch]), targets[batch])
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return {
        "accuracy": accuracy,
        "batch_skew": float(np.mean(batch_skew)),
        "node_skew": float(np.mean(node_skew)),
    }


def run(quick: bool) -> dict:
    """Train every policy over every seed; returns the JSON-ready result."""
    seeds = list(range(3)) if quick else list(range(10))
    epochs = 6 if quick else 15
    started = time.perf_counter()
    torch.set_num_threads(1)
    data = _data()
    rows = []
    for key, label, policy in POLICIES:
        runs = [_train(policy, key, seed, epochs, data) for seed in seeds]
        accuracy = [r["accuracy"] for r in runs]
        rows.append(
            {
                "key": key,
                "label": label,
                "accuracy": accuracy,
                "mean": float(np.mean(accuracy)),
                "std": float(np.std(accuracy, ddof=1)),
                "batch_skew": float(np.mean([r["batch_skew"] for r in runs])),
                "node_skew": float(np.mean([r["node_skew"] for r in runs])),
            }
        )
    return {
        "name": "quality",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "seconds": time.perf_counter() - started,
        "num_train": NUM_TRAIN,
        "num_test": int(data[3].shape[0]),
        "num_replicas": NUM_REPLICAS,
        "batch_size": BATCH_SIZE,
        "epochs": epochs,
        "seeds": seeds,
        "split_seed": SPLIT_SEED,
        "model": f"MLP 64-{HIDDEN}-10, SGD lr {LR}, momentum {MOMENTUM}",
        "rows": rows,
    }


def format_table(result: dict) -> str:
    """A plain-text table: test accuracy mean ± std and label skew per policy."""
    lines = [
        f"digits, W={result['num_replicas']}, B={result['batch_size']}, "
        f"{result['epochs']} epochs, {len(result['seeds'])} seeds"
    ]
    for row in result["rows"]:
        lines.append(
            f"  {row['label']:36s} accuracy {row['mean']:.4f} ± {row['std']:.4f}  "
            f"skew batch {row['batch_skew']:.4f} rank {row['node_skew']:.4f}"
        )
    return "\n".join(lines)
