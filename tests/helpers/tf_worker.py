"""One TensorFlow worker of the multi-process test (run by tests/test_tf.py, not by pytest).

Usage: ``python tests/tf_worker.py MODE RANK PORT0,PORT1 OUT.json``. MODE ``multiworker``
builds a ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` on 127.0.0.1 and feeds it with
``strategy.distribute_datasets_from_function``; MODE ``plain`` runs a per-process pipeline
with explicit ``rank``/``num_replicas``. Either way it writes the sample indices it consumed,
per epoch and step, to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import chronica.tf

N, GLOBAL_BATCH, EPOCHS = 53, 8, 2


def examples() -> tf.data.Dataset:
    lengths = np.random.default_rng(7).integers(1, 30, size=N)
    tokens = tf.RaggedTensor.from_row_lengths(tf.range(int(lengths.sum()), dtype=tf.int32), lengths)
    ds = tf.data.Dataset.from_tensor_slices({"idx": tf.range(N, dtype=tf.int64), "tok": tokens})
    return ds.map(lambda e: {"idx": e["idx"], "tok": e["tok"]})


def main() -> None:
    mode, rank, ports, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
    world = len(ports)
    lengths_fn = lambda e: len(e["tok"])  # noqa: E731
    steps: list[list[int]] = []
    if mode == "multiworker":
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                "task": {"type": "worker", "index": rank},
            }
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        assert strategy.num_replicas_in_sync == world
        source = examples()
        transform: dict[str, chronica.tf.Schedule] = {}

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            transform["t"] = chronica.tf.schedule(
                size_fn=lengths_fn,
                global_batch_size=GLOBAL_BATCH,
                input_context=ctx,
                epochs=EPOCHS,
            )
            return source.apply(transform["t"])

        dist = strategy.distribute_datasets_from_function(dataset_fn)

        @tf.function
        def count(batch: dict) -> tf.Tensor:
            return strategy.run(lambda b: tf.shape(b["idx"])[0], args=(batch,))

        total = 0
        for batch in dist:
            local = strategy.experimental_local_results(batch["idx"])
            steps.extend(x.numpy().tolist() for x in local)
            total += int(strategy.reduce(tf.distribute.ReduceOp.SUM, count(batch), axis=None))
        report = {"rank": rank, "steps": steps, "reduced_total": total, "mode": mode}
    else:
        transform = chronica.tf.schedule(
            size_fn=lengths_fn,
            global_batch_size=GLOBAL_BATCH,
            num_replicas=world,
            rank=rank,
            epochs=EPOCHS,
        )
        for batch in examples().apply(transform):
            steps.append(batch["idx"].numpy().tolist())
        report = {"rank": rank, "steps": steps, "mode": mode}
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
