"""Balanced tf.data input for a two-worker TensorFlow job: ``chronica.tf.schedule``.

    python examples/tf_multiworker.py

starts 2 TensorFlow worker processes on 127.0.0.1 (``MultiWorkerMirroredStrategy``,
``TF_CONFIG``, CPU, one replica each) and trains a tiny classifier on variable-length token
sequences with a custom training loop, for 2 epochs; it runs in well under a minute on CPU.
The input pipeline is one line of chronica inside ``distribute_datasets_from_function``:

    def dataset_fn(ctx):
        return examples.apply(chronica.tf.schedule(
            size_fn=lambda ex: len(ex["tokens"]),     # what an example costs
            global_batch_size=GLOBAL_BATCH, input_context=ctx, epochs=EPOCHS))

Every step, each replica gets ``GLOBAL_BATCH // 2`` examples, padded per batch, with a
``tokens_mask`` and a ``loss_weight``; the two replicas' token loads are balanced. Worker 0
prints the loss per epoch and the per-step max/mean load of the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

try:
    import chronica.tf
except ModuleNotFoundError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import chronica.tf
from chronica.comm.ports import free_port

WORKERS, N, VOCAB, DIM, GLOBAL_BATCH, EPOCHS, LR = 2, 512, 64, 16, 32, 2, 0.5


def make_examples() -> tf.data.Dataset:
    """Sequences of lognormal length; the label says whether the mean token is high."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3.0, 0.8, size=N).astype(np.int64), 1, 400)
    tokens = rng.integers(0, VOCAB, size=int(lengths.sum())).astype(np.int32)
    ragged = tf.RaggedTensor.from_row_lengths(tokens, lengths)
    labels = (tf.reduce_mean(tf.cast(ragged, tf.float32), axis=1) >= VOCAB / 2 - 0.5).numpy()
    ds = tf.data.Dataset.from_tensor_slices({"tokens": ragged, "label": labels.astype(np.int32)})
    return ds.map(lambda ex: {"tokens": ex["tokens"], "label": ex["label"]})


def worker(rank: int, ports: list[str]) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    examples = make_examples()
    schedules: list[chronica.tf.Schedule] = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        schedules.append(
            chronica.tf.schedule(
                size_fn=lambda ex: len(ex["tokens"]),
                global_batch_size=GLOBAL_BATCH,
                input_context=ctx,
                epochs=EPOCHS,
            )
        )
        return examples.apply(schedules[-1])

    batches = strategy.distribute_datasets_from_function(dataset_fn)
    first = tf.VariableAggregation.ONLY_FIRST_REPLICA
    with strategy.scope():
        embed = tf.Variable(tf.random.stateless_normal([VOCAB, DIM], [1, 2]), aggregation=first)
        head = tf.Variable(tf.random.stateless_normal([DIM, 2], [3, 4]) * 0.1, aggregation=first)
    params = [embed, head]

    def replica_step(batch: dict) -> tf.Tensor:
        mask = tf.cast(batch["tokens_mask"], tf.float32)[:, :, None]
        with tf.GradientTape() as tape:
            vectors = tf.gather(embed, batch["tokens"]) * mask
            pooled = tf.reduce_sum(vectors, 1) / tf.reduce_sum(mask, 1)
            logits = pooled @ head
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], logits)
            # local mean x loss_weight / replicas: the all-reduced sum is the global mean
            loss = tf.reduce_mean(losses) * batch["loss_weight"] / strategy.num_replicas_in_sync
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, params)]
        grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
        for p, g in zip(params, grads, strict=True):
            p.assign_sub(LR * g)
        return loss

    @tf.function(input_signature=[batches.element_spec])  # padded length varies per step
    def train_step(batch: dict) -> tf.Tensor:
        per_replica = strategy.run(replica_step, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    schedule = None
    steps_per_epoch = 0
    epoch_loss, step = 0.0, 0
    for batch in batches:
        schedule = schedule or schedules[-1]
        steps_per_epoch = steps_per_epoch or schedule.plan(0).num_steps
        epoch_loss += float(train_step(batch))
        step += 1
        if step % steps_per_epoch == 0 and rank == 0:
            epoch = step // steps_per_epoch - 1
            stats = schedule.scheduler.stats(epoch)
            print(
                f"epoch {epoch}: mean loss {epoch_loss / steps_per_epoch:.4f}, "
                f"{steps_per_epoch} steps, per-step max/mean token load "
                f"{stats.load_ratio_mean:.3f} (worst {stats.load_ratio_worst:.3f})",
                flush=True,
            )
            epoch_loss = 0.0
    # A last collective as a barrier; then the coordination leader (worker 0) lingers a moment
    # so the other worker's shutdown does not find it gone.
    tf.function(lambda: strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), None))()
    if rank == 0:
        time.sleep(1.0)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3].split(","))
        return
    ports = ",".join(str(free_port()) for _ in range(WORKERS))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(r), ports], env=env)
        for r in range(WORKERS)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        raise SystemExit(f"worker exit codes {codes}")
    print("tf multiworker: done")


if __name__ == "__main__":
    main()
