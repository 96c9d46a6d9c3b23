"""One worker of a real 2-worker TensorFlow streaming job (``chronica.tf.stream``), started by
tests/adapters/tf/test_tf_streaming.py, not by pytest.

Usage: ``python tests/helpers/tf_stream_worker.py RANK PORT0,PORT1 OUT.json CUT``: a
``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` on 127.0.0.1 (its coordination service
carries the stream's collectives), over the in-memory source without random access (so
samples travel by the all-to-all). It runs one whole pass (a cross-worker all-reduce after
every element: unequal counts would hang), then a second stream for ``CUT`` elements through
a prefetching pipeline, saves ``get_state(delivered=...)``, and resumes a third stream from
it to the end of the pass. Writes every element's signature per run to OUT.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from stream_source import make_source

import chronica.tf
from chronica.core.packing import Packing

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def signature(element: dict) -> dict:
    ids = element["ids"].numpy()
    return {
        "ids": ids[ids >= 0].tolist(),
        "tokens": hashlib.sha256(element["tokens"].numpy().tobytes()).hexdigest(),
        "step": int(element["step"]),
        "micro": int(element["micro"]),
        "num_micro": int(element["num_micro"]),
        "loss_weight": float(element["loss_weight"]),
    }


def main(rank: int, ports: list[str], out: str, cut: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    source = make_source(random_access=False)
    one = tf.constant(1.0)
    full = []
    for element in chronica.tf.stream(source, PACKING, **OPTIONS).dataset:
        full.append(signature(element))
        strategy.reduce("SUM", strategy.run(lambda: one), axis=None)
    part, batches = [], chronica.tf.stream(source, PACKING, **OPTIONS)
    for element in batches.dataset.prefetch(3):
        part.append(signature(element))
        if len(part) == cut:
            state = batches.get_state(delivered=element)
            break
    batches.close()
    resumed = chronica.tf.stream(source, PACKING, **OPTIONS)
    resumed.set_state(json.loads(json.dumps(state)))
    rest = [signature(element) for element in resumed.dataset]
    with open(out, "w") as f:
        json.dump({"full": full, "part": part, "rest": rest, "world": len(ports)}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], int(sys.argv[4]))
