"""One TensorFlow worker of the 2-process job of tests/adapters/tf/test_tf.py (not run by
pytest): one ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` on 127.0.0.1 runs every
scenario in turn, so the two processes import TensorFlow and meet once.

Usage: ``python tests/helpers/tf_worker.py RANK PORT0,PORT1 COORDINATOR_PORT STANDALONE_PORT
OUT``. Scenarios, in this order, each writing ``OUT/<scenario>.rank<R>.json``:

* "cover": ``chronica.tf.schedule`` inside ``strategy.distribute_datasets_from_function``
  for two epochs: the sample indices each step consumed, and the all-reduced count of them;
* "kill" and "train": kind="dynamic" (``tf_dynamic_worker.dynamic``), "kill" against the
  standalone coordinator on ``STANDALONE_PORT`` the test kills mid-epoch, "train" with
  chronica's coordinator on ``COORDINATOR_PORT``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tf_dynamic_worker import dynamic

import chronica.tf

N, GLOBAL_BATCH, EPOCHS = 53, 8, 2


def examples() -> tf.data.Dataset:
    lengths = np.random.default_rng(7).integers(1, 30, size=N)
    tokens = tf.RaggedTensor.from_row_lengths(tf.range(int(lengths.sum()), dtype=tf.int32), lengths)
    ds = tf.data.Dataset.from_tensor_slices({"idx": tf.range(N, dtype=tf.int64), "tok": tokens})
    return ds.map(lambda e: {"idx": e["idx"], "tok": e["tok"]})


def cover(strategy: tf.distribute.Strategy, rank: int) -> dict:
    """Scenario "cover": the indices of every step this worker consumed, both epochs."""
    source = examples()

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return source.apply(
            chronica.tf.schedule(
                size_fn=lambda e: len(e["tok"]),
                global_batch_size=GLOBAL_BATCH,
                input_context=ctx,
                epochs=EPOCHS,
            )
        )

    dist = strategy.distribute_datasets_from_function(dataset_fn)

    @tf.function
    def count(batch: dict) -> tf.Tensor:
        return strategy.run(lambda b: tf.shape(b["idx"])[0], args=(batch,))

    steps: list[list[int]] = []
    total = 0
    for batch in dist:
        local = strategy.experimental_local_results(batch["idx"])
        steps.extend(x.numpy().tolist() for x in local)
        total += int(strategy.reduce(tf.distribute.ReduceOp.SUM, count(batch), axis=None))
    return {"rank": rank, "steps": steps, "reduced_total": total}


def main(rank: int, ports: list[str], port: int, standalone: int, out: Path) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == len(ports)
    (out / f"cover.rank{rank}.json").write_text(json.dumps(cover(strategy, rank)))
    os.environ["CHRONICA_COORDINATOR"] = f"127.0.0.1:{standalone}"
    dynamic(strategy, rank, port, "kill", out)
    del os.environ["CHRONICA_COORDINATOR"]
    dynamic(strategy, rank, port, "train", out)


if __name__ == "__main__":
    rank, ports, port, standalone, out = sys.argv[1:6]
    main(int(rank), ports.split(","), int(port), int(standalone), Path(out))
