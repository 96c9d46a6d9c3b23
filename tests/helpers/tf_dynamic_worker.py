"""The kind="dynamic" scenarios of the 2-worker TensorFlow job of
tests/adapters/tf/test_tf.py (the job of dynamic_job.py), run by tf_worker.py in each worker
on its ``MultiWorkerMirroredStrategy`` (whose coordination service carries the ranks'
agreement).

The strategy is fed by ``distribute_datasets_from_function`` with
``chronica.tf.schedule(kind="dynamic", variable_batch=True)``; the last worker is emulated
3x slower in what it reports. Scenario ``train``: two epochs; ``kill``: at step 3 of epoch 0
rank 0 touches ``SYNC/killme`` and both wait for ``SYNC/killed`` (the test kills the
standalone coordinator in between). Every step, each replica's loss-weighted gradient of
its local mean loss is averaged over the replicas (``strategy.reduce`` MEAN) and compared
with the gradient of the mean loss over the static plan's samples of that step. Writes
``SYNC/<scenario>.rank<R>.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from dynamic_job import KILL_AT, PER_RANK, WINDOW, N, kill_point, sizes, static_plan
from workers import scaled

import chronica.tf
from chronica.runtime import DynamicOptions

EPOCHS, SLOW = 2, 3.0
W = np.array([0.1, -0.2, 0.3, 0.05])


def features(index):
    """Fixed float64 inputs and targets per sample index (TensorFlow or numpy)."""
    i = tf.cast(index, tf.float64)
    x = tf.stack([tf.sin(i), tf.cos(i * 0.7), i / N, tf.ones_like(i)], 1)
    return x, tf.tanh(i * 0.01)


def mean_loss_grad(index) -> tf.Tensor:
    w = tf.constant(W)
    with tf.GradientTape() as tape:
        tape.watch(w)
        x, y = features(index)
        loss = tf.reduce_mean((tf.linalg.matvec(x, w) - y) ** 2)
    return tape.gradient(loss, w)


def dynamic(
    strategy: tf.distribute.Strategy, rank: int, port: int, scenario: str, sync: Path
) -> None:
    """Run ``scenario`` on ``strategy`` as worker ``rank``, chronica's coordinator on
    ``port`` (unless ``CHRONICA_COORDINATOR`` names a standalone one), the kill handshake's
    files and the result in ``sync``."""
    world = strategy.num_replicas_in_sync
    lengths = sizes()
    examples = tf.data.Dataset.from_tensor_slices({"idx": tf.range(N, dtype=tf.int64)})
    made: list[chronica.tf.Schedule] = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        made.append(
            chronica.tf.schedule(
                lengths,
                global_batch_size=PER_RANK * world,
                kind="dynamic",
                variable_batch=True,
                window=WINDOW,
                dynamic=DynamicOptions(port=port, timeout=scaled(3.0)),
                epochs=EPOCHS,
                input_context=ctx,
            )
        )
        return examples.apply(made[-1])

    batches = strategy.distribute_datasets_from_function(dataset_fn)
    schedule = made[-1]

    @tf.function(input_signature=[batches.element_spec])
    def weighted_grad(batch):
        def replica(b):
            return tf.cast(b["loss_weight"], tf.float64) * mean_loss_grad(b["idx"])

        return strategy.reduce("MEAN", strategy.run(replica, args=(batch,)), axis=None)

    plans = [static_plan(world, epoch) for epoch in range(EPOCHS)]
    slow = SLOW if rank == world - 1 else 1.0
    epochs: list[list[list[int]]] = [[] for _ in range(EPOCHS)]
    weights: list[list[float]] = [[] for _ in range(EPOCHS)]
    grad_error = 0.0
    last = None
    for last in batches:
        batch = {k: strategy.experimental_local_results(v)[0] for k, v in last.items()}
        epoch, step = int(batch["epoch"]), int(batch["step"])
        assert step == len(epochs[epoch]), (epoch, step)
        if scenario == "kill" and (epoch, step) == KILL_AT:
            kill_point(sync, rank, timeout=120.0)
        local = batch["idx"].numpy()
        epochs[epoch].append(local.tolist())
        weights[epoch].append(float(batch["loss_weight"]))
        plan = plans[epoch]
        whole = plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]]
        got = weighted_grad(last).numpy()
        grad_error = max(grad_error, float(np.abs(got - mean_loss_grad(whole).numpy()).max()))
        schedule.report(float(lengths[local].sum()) * 1e-6 * slow)
    session = schedule.stream.session
    # The distributed element itself says where training stands: after the last step.
    final = schedule.get_state(delivered=last)
    assert (final["epoch"], final["step"]) == (EPOCHS - 1, len(epochs[-1])), final
    result = {
        "rank": rank,
        "epochs": epochs,
        "weights": weights,
        "grad_error": grad_error,
        "dynamic_windows": session.windows_dynamic,
        "static_windows": session.windows_static,
    }
    (sync / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
    # A last collective: neither worker leaves while the other still needs it.
    tf.function(lambda: strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), None))()
    schedule.close()
