"""Keras's ``model.fit`` on ``chronica.tf.schedule(x=..., y=...)`` with
``chronica.tf.ScheduleCallback``: two real TensorFlow workers (``MultiWorkerMirroredStrategy``
on 127.0.0.1), preempted mid-epoch and resumed from the backup; plus the guards against the
silent mistakes (no callback, ``steps_per_epoch``, re-iterated outputs) in one process."""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import keras_worker as job  # noqa: E402
from tf_data import make_dataset  # noqa: E402
from workers import HELPERS, ROOT, base_env, free_port, run_workers  # noqa: E402

import chronica.tf  # noqa: E402
from chronica.core import ScheduleConfig, Scheduler, as_cost_model, as_shuffle_policy  # noqa: E402

# Seconds a two-worker phase may take; CHRONICA_TEST_TIME_SCALE stretches it on slow machines.
PHASE_TIMEOUT = 150 * float(os.environ.get("CHRONICA_TEST_TIME_SCALE", "1"))


def plan_of(epoch: int):
    config = ScheduleConfig(
        num_replicas=2,
        batch_size=job.GLOBAL_BATCH,
        shuffle=as_shuffle_policy(True),
        cost=as_cost_model(None),
    )
    return Scheduler(job.lengths(), config).plan_epoch(epoch)


def run_phase(tmp_path, phase: str) -> list[dict]:
    ports = ",".join(str(free_port()) for _ in range(2))
    env = base_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    worker = str(HELPERS / "keras_worker.py")
    backup = str(tmp_path / "backup")
    outs = [tmp_path / f"{phase}{r}.json" for r in range(2)]
    commands = [
        [sys.executable, worker, phase, str(r), ports, backup, str(outs[r])] for r in range(2)
    ]
    run_workers(commands, env, timeout=PHASE_TIMEOUT)
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Both phases: preempted before step STOP_STEP of epoch STOP_EPOCH, then resumed."""
    tmp = tmp_path_factory.mktemp("keras")
    return run_phase(tmp, "first"), run_phase(tmp, "resume")


def trained(first, resumed, rank):
    """What rank ``rank``'s training step received over the whole (resumed) job, by epoch."""
    batches = first[rank]["received"] + resumed[rank]["received"]
    steps = first[rank]["steps_per_epoch"]
    return [batches[e * steps : (e + 1) * steps] for e in range(job.EPOCHS)]


def test_fit_trains_every_example_once_per_epoch_in_plan_order(two_workers):
    first, resumed = two_workers
    steps = plan_of(0).num_steps
    assert len(first[0]["received"]) == steps + job.STOP_STEP  # preempted where planned
    assert len(resumed[0]["received"]) == steps - job.STOP_STEP  # only the epoch's rest
    for epoch in range(job.EPOCHS):
        plan = plan_of(epoch)
        seen = []
        for rank in range(2):
            got = [b["idx"] for b in trained(first, resumed, rank)[epoch]]
            assert got == [plan.local(s, rank).tolist() for s in range(steps)]
            seen += [i for b in got for i in b]
        # drop_last=False pads 53 examples to 54 (one repeat, as torch does); others once.
        assert sorted(set(seen)) == list(range(job.N)) and len(seen) == job.N + plan.num_padded
    orders = [[i for b in trained(first, resumed, 0)[e] for i in b["idx"]] for e in range(2)]
    assert orders[0] != orders[1]  # every Keras epoch is the next chronica epoch


def test_every_replica_of_a_step_receives_the_planned_balanced_batch(two_workers):
    first, resumed = two_workers
    sizes = job.lengths()
    for epoch in range(job.EPOCHS):
        plan = plan_of(epoch)
        per_rank = [trained(first, resumed, r)[epoch] for r in range(2)]
        ratios, naive = [], []
        for step, batches in enumerate(zip(*per_rank, strict=True)):
            # One padded width per step, the step's longest example over both replicas.
            everyone = np.concatenate([plan.local(step, r) for r in range(2)])
            assert {b["width"] for b in batches} == {int(sizes[everyone].max())}
            loads = [b["tokens"] for b in batches]
            assert loads == [int(sizes[b["idx"]].sum()) for b in batches]
            ratios.append(max(loads) / np.mean(loads))
            # The same global batch split as plain data parallelism splits it.
            halves = [sizes[h].sum() for h in np.array_split(np.sort(everyone), 2)]
            naive.append(max(halves) / np.mean(halves))
            assert all(w == 1.0 for b in batches for w in b["weights"])
        assert np.mean(ratios) < 1.05 and np.mean(ratios) < np.mean(naive)


def test_keras_update_is_the_global_mean_gradient_over_the_step(two_workers):
    """sample_weight makes Keras's per-replica mean (divided by the replicas, gradients
    summed) the mean over the step's global batch, the partial last step included."""
    first, resumed = two_workers
    for report in first + resumed:
        assert report["max_update_error"] < 1e-6


def test_resume_from_the_backup_is_exact(two_workers):
    first, resumed = two_workers
    for rank in range(2):
        # The preempted run left its backup; the resumed run deleted it when fit completed.
        assert first[rank]["backup_left"] and not resumed[rank]["backup_left"]
        assert first[rank]["epochs_run"] is None and resumed[rank]["epochs_run"] == 1
        # The resumed run starts from the weights and the momentum after the last batch.
        start = resumed[rank]["before"][0]
        assert start["epoch"] == job.STOP_EPOCH and start["batch"] == 0
        assert start["weights"] == first[rank]["after"]
        # SGD's w <- w + m: the momentum after the last batch is that batch's update.
        last = first[rank]["before"][-1]["weights"]
        for m, w0, w1 in zip(start["momentum"], last, first[rank]["after"], strict=True):
            np.testing.assert_allclose(m, np.subtract(w1, w0), atol=1e-6)
    # Both workers hold the same weights throughout.
    assert resumed[0]["after"] == resumed[1]["after"]


# -- guards, in one process (no strategy) ------------------------------------------------------


def keras_data(epochs=1, **kw):
    lengths = np.random.default_rng(5).integers(1, 12, size=24)
    examples = make_dataset(lengths).map(
        lambda e: {"idx": e["idx"], "tok": e["tok"] % 50, "label": tf.cast(e["idx"] % 2, tf.int32)}
    )
    schedule = chronica.tf.schedule(
        lengths, global_batch_size=4, num_replicas=1, rank=0, x="tok", y="label", **kw
    )
    return schedule, examples.apply(schedule)


def small_model():
    model = keras.Sequential(
        [
            keras.layers.Embedding(50, 4),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_fit_without_the_callback_fails_naming_it():
    schedule, data = keras_data()
    assert data.cardinality() == schedule.steps_per_epoch == 6
    with pytest.raises(Exception, match="ScheduleCallback"):
        small_model().fit(data, epochs=2, verbose=0)


def test_steps_per_epoch_is_refused_and_the_callback_runs_one_epoch_per_fit_epoch():
    schedule, data = keras_data()
    callback = chronica.tf.ScheduleCallback(schedule)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        small_model().fit(data, epochs=2, steps_per_epoch=3, verbose=0, callbacks=[callback])
    schedule, data = keras_data()
    history = small_model().fit(
        data, epochs=3, verbose=0, callbacks=[chronica.tf.ScheduleCallback(schedule)]
    )
    assert len(history.history["loss"]) == 3
    # A later fit starts at the next epoch (the callback selected it).
    assert schedule._next_iteration() == (3, 0, schedule.steps_per_epoch)


def test_fit_continues_where_set_state_put_the_schedule():
    schedule, data = keras_data()
    model = small_model()
    callback = chronica.tf.ScheduleCallback(schedule)
    saved = {}

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == (1, 3):  # a checkpoint of the user's, then a crash
                saved.update(callback.state())
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.fit(data, epochs=2, verbose=0, callbacks=[callback, Stop()])
    assert (saved["epoch"], saved["step"]) == (1, 3)
    schedule.set_state(saved)
    callback = chronica.tf.ScheduleCallback(schedule)
    trained = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            trained.append(callback.state()["step"])

    history = model.fit(data, epochs=2, verbose=0, callbacks=[callback, Count()])
    # Epoch 1 from step 3 on only: fit's epochs are chronica's.
    assert len(history.history["loss"]) == 1
    assert trained == list(range(4, schedule.steps_per_epoch + 1))


def test_keras_elements_and_bad_arguments():
    _, data = keras_data()
    x, y, w = next(iter(data))
    assert x.shape[0] == y.shape[0] == w.shape[0] == 4 and w.dtype == tf.float32
    kw = {"global_batch_size": 4, "num_replicas": 1, "rank": 0}
    sizes = np.ones(8)
    with pytest.raises(ValueError, match="go together"):
        chronica.tf.schedule(sizes, x="tok", **kw)
    with pytest.raises(ValueError, match="epochs"):
        chronica.tf.schedule(sizes, x="tok", y="label", epochs=2, **kw)
    with pytest.raises(ValueError, match="padded"):
        chronica.tf.schedule(sizes, x="tok", y="label", padded=False, **kw)
    with pytest.raises(ValueError, match="dynamic"):
        chronica.tf.schedule(sizes, x="tok", y="label", kind="dynamic", **kw)
    with pytest.raises(TypeError, match="x=3 must name an output feature"):
        chronica.tf.schedule(sizes, x=3, y="label", **kw)
    with pytest.raises(ValueError, match=r"y=\[\] must name at least one"):
        chronica.tf.schedule(sizes, x="tok", y=[], **kw)
    with pytest.raises(ValueError, match="lacks"):
        make_dataset(np.ones(8, np.int64)).apply(
            chronica.tf.schedule(sizes, x="tokens", y="label", **kw)
        )
    with pytest.raises(ValueError, match=r"needs the .* without x=/y="):
        chronica.tf.ScheduleCallback(chronica.tf.schedule(sizes, **kw))
    with pytest.raises(TypeError, match=r"needs the .* got dict"):
        chronica.tf.ScheduleCallback({"x": "tok"})
    keras_schedule = chronica.tf.schedule(sizes, x="tok", y="label", **kw)
    for save_freq, error in ((0, ValueError), ("batch", ValueError), (True, TypeError)):
        with pytest.raises(error, match="save_freq="):
            chronica.tf.ScheduleCallback(keras_schedule, save_freq=save_freq)
    with pytest.raises(TypeError, match="backup_dir=3"):
        chronica.tf.ScheduleCallback(keras_schedule, backup_dir=3)
    callback = chronica.tf.ScheduleCallback(keras_schedule, backup_dir="b", save_freq=2)
    assert repr(callback).startswith(
        "chronica.tf.ScheduleCallback(backup_dir='b', save_freq=2, delete_checkpoint=True, "
        "schedule=chronica.tf.Schedule(ranks=[0], num_replicas=1, "
    )


def test_a_dict_output_iterated_again_without_set_epoch_warns(caplog):
    lengths = np.random.default_rng(1).integers(1, 9, size=12)
    schedule = chronica.tf.schedule(lengths, global_batch_size=4, num_replicas=1, rank=0)
    out = make_dataset(lengths).apply(schedule)
    with caplog.at_level(logging.WARNING, logger="chronica"):
        list(out)
        assert "set_epoch" not in caplog.text
        list(out)
        assert "repeats the same epochs" in caplog.text
