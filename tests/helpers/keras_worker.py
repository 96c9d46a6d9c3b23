"""One TensorFlow worker training with Keras's ``model.fit`` on chronica's batches (run by
tests/adapters/tf/test_keras.py, not by pytest).

Usage: ``python keras_worker.py PHASE RANK PORT0,PORT1 BACKUP_DIR OUT.json``. Every worker
builds its ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` on 127.0.0.1 first, then the
data (``chronica.tf.schedule(x=..., y=...)`` inside ``distribute_datasets_from_function``)
and a small model, and calls ``model.fit(epochs=2)`` with ``chronica.tf.ScheduleCallback``
backing up after every batch. PHASE ``first`` is preempted (an exception on every worker)
before step ``STOP_STEP`` of epoch 1; PHASE ``resume`` is a fresh job on the same backup
directory that runs ``fit`` to the end.

What the training step received is recorded inside it (a ``tf.py_function`` in
``train_step``): the example indices, the padded width, the real tokens and the sample
weights. Before every batch the weights and the optimizer's momentum are recorded, and the
update of every step is checked against the global mean loss's gradient over the step's
examples on every replica (from the plan), computed here without a strategy; OUT.json holds
all of it.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

N, GLOBAL_BATCH, EPOCHS, VOCAB, LR, MOMENTUM = 53, 8, 2, 97, 0.5, 0.9
STOP_EPOCH, STOP_STEP = 1, 4


def lengths() -> np.ndarray:
    return np.random.default_rng(7).integers(1, 30, size=N)


def tokens_of(index: int, length: int) -> np.ndarray:
    """Example ``index``'s tokens: never 0, which is padding."""
    return (1 + (index * 31 + np.arange(length)) % (VOCAB - 1)).astype(np.int32)


class Preempted(Exception):
    """The simulated preemption of PHASE ``first``."""


def main() -> None:
    phase, rank, ports, backup, out = sys.argv[1:6]
    ports_list = ports.split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports_list]},
            "task": {"type": "worker", "index": int(rank)},
        }
    )
    import keras
    import tensorflow as tf

    import chronica.tf

    keras.config.disable_traceback_filtering()
    chronica.tf.patch_keras_multiworker()  # keras-team/keras#20585
    # The strategy first: collective ops must be configured before TensorFlow runs any op.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == len(ports_list)

    sizes = lengths()
    ragged = tf.RaggedTensor.from_row_lengths(
        np.concatenate([tokens_of(i, n) for i, n in enumerate(sizes)]), sizes
    )
    examples = tf.data.Dataset.from_tensor_slices(
        {"idx": np.arange(N), "tok": ragged, "label": (np.arange(N) % 2).astype(np.int32)}
    ).map(lambda e: {"idx": e["idx"], "tok": e["tok"], "label": e["label"]})
    made: list[chronica.tf.Schedule] = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        made.append(
            chronica.tf.schedule(
                size_fn=lambda e: len(e["tok"]),
                global_batch_size=GLOBAL_BATCH,
                input_context=ctx,
                x=["idx", "tok", "tok_mask"],
                y="label",
            )
        )
        return examples.apply(made[-1])

    data = strategy.distribute_datasets_from_function(dataset_fn)
    schedule = made[-1]
    received: list[dict] = []

    def record(idx, width, load, weights):
        received.append(
            {
                "idx": idx.numpy().tolist(),
                "width": int(width),
                "tokens": int(load),
                "weights": weights.numpy().tolist(),
            }
        )
        return 0

    class Probe(keras.Model):
        """Mean of the real tokens' embeddings, then a linear layer."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = keras.layers.Embedding(VOCAB, 4)
            self.head = keras.layers.Dense(2)

        def call(self, x):
            mask = tf.cast(x["tok_mask"], tf.float32)[..., None]
            pooled = tf.reduce_sum(self.embed(x["tok"]) * mask, 1) / tf.reduce_sum(mask, 1)
            return self.head(pooled)

        def train_step(self, data):
            x, _, weights = data
            load = tf.reduce_sum(tf.cast(x["tok_mask"], tf.int64))
            tf.py_function(record, [x["idx"], tf.shape(x["tok"])[1], load, weights], tf.int32)
            return super().train_step(data)

    def build(model: keras.Model) -> None:
        model(
            {
                "idx": tf.zeros([1], tf.int64),
                "tok": tf.ones([1, 1], tf.int32),
                "tok_mask": tf.ones([1, 1], tf.bool),
            }
        )

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = Probe()
        build(model)
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM), loss=loss)

    before: list[dict] = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if phase == "first" and (self.epoch, batch) == (STOP_EPOCH, STOP_STEP):
                raise Preempted
            # SGD keeps one momentum per trainable variable, in the variables' order.
            momentum = self.model.optimizer.momentums
            before.append(
                {
                    "epoch": self.epoch,
                    "batch": batch,
                    "weights": [w.numpy().tolist() for w in self.model.trainable_variables],
                    "momentum": [np.asarray(v.numpy()).tolist() for v in momentum],
                }
            )

    backup_cb = chronica.tf.ScheduleCallback(schedule, backup_dir=backup, save_freq=1)
    history = None
    try:
        history = model.fit(data, epochs=EPOCHS, verbose=0, callbacks=[backup_cb, Recorder()])
    except Preempted:
        pass
    after = [w.numpy().tolist() for w in model.trainable_variables]

    # The update of every step against the global mean loss's gradient over the step's
    # examples on every replica, computed here on one device.
    keras.utils.set_random_seed(3)
    reference = Probe()
    build(reference)
    errors = []
    for k, b in enumerate(before):
        plan = schedule.plan(b["epoch"])
        step = received_step(received[k], plan)
        everyone = np.concatenate([plan.local(step, r) for r in range(plan.num_replicas)])
        width = int(sizes[everyone].max())
        tok = np.zeros((len(everyone), width), np.int32)
        for row, i in enumerate(everyone):
            tok[row, : sizes[i]] = tokens_of(int(i), int(sizes[i]))
        x = {
            "idx": tf.constant(everyone),
            "tok": tf.constant(tok),
            "tok_mask": tf.constant(tok > 0),
        }
        y = tf.constant((everyone % 2).astype(np.int32))
        for var, w in zip(reference.trainable_variables, b["weights"], strict=True):
            var.assign(np.asarray(w, np.float32))
        with tf.GradientTape() as tape:
            mean = loss(y, reference(x))
        grads = tape.gradient(mean, reference.trainable_variables)
        nxt = before[k + 1]["weights"] if k + 1 < len(before) else after
        # Keras's SGD: m <- momentum * m - lr * g, w <- w + m.
        for g, w0, m0, w1 in zip(grads, b["weights"], b["momentum"], nxt, strict=True):
            g = tf.convert_to_tensor(g).numpy()
            want = np.asarray(w0) + MOMENTUM * np.asarray(m0) - LR * g
            errors.append(float(np.abs(np.asarray(w1) - want).max()))

    report = {
        "rank": int(rank),
        "received": received,
        "before": before,
        "after": after,
        "max_update_error": max(errors, default=0.0),
        "epochs_run": None if history is None else len(history.history["loss"]),
        "steps_per_epoch": schedule.steps_per_epoch,
        "backup_left": os.path.exists(os.path.join(backup, "latest.json")),
    }
    with open(out, "w") as f:
        json.dump(report, f)


def received_step(batch: dict, plan) -> int:
    """The step of ``plan`` whose local batch (on some replica) is ``batch``'s indices."""
    for step in range(plan.num_steps):
        for r in range(plan.num_replicas):
            if plan.local(step, r).tolist() == batch["idx"]:
                return step
    raise AssertionError(f"batch {batch['idx']} is no local batch of the plan")


if __name__ == "__main__":
    main()
