"""chronica.adapters.tf.delivered: the state after a delivered element resumes with the batch
(or packed micro-batch) after it, from tensors, numpy values or ints; a wrong type is a
TypeError, an element of another iteration a ValueError; and through a real pipeline the
resumed output continues exactly after the element delivered."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from tf_data import make_dataset  # noqa: E402

import chronica.tf  # noqa: E402
from chronica.adapters.tf.delivered import state_after  # noqa: E402

START = {"epoch": 1, "step": 2, "offset": 0, "digest": "d"}  # epoch 1 resumed at step 2
STARTS = {1: START}


def test_the_state_after_a_batch_is_the_next_step_whatever_holds_the_counters():
    for step in (2, np.int64(4), tf.constant(4, tf.int64), (tf.constant(4), np.int32(4))):
        state = state_after({"epoch": tf.constant(1), "step": step}, STARTS, packed=False)
        assert state == {**START, "step": int(np.asarray(tf.nest.flatten(step)[0])) + 1}
    state["digest"] = "changed"
    assert START["digest"] == "d"  # the epoch's start is copied, not shared


def test_the_state_after_a_micro_batch_is_the_next_one_of_its_step_or_the_next_step():
    element = {"epoch": 1, "step": 3, "micro": 0, "num_micro": 2}
    assert state_after(element, STARTS, packed=True) == {**START, "step": 3, "offset": 1}
    last = {**element, "micro": 1}
    assert state_after(last, STARTS, packed=True) == {**START, "step": 4, "offset": 0}


def test_refusals_a_wrong_type_and_elements_of_another_iteration():
    with pytest.raises(TypeError, match=r"delivered= must be .* got list"):
        state_after([1, 3], STARTS, packed=False)
    with pytest.raises(ValueError, match="'epoch' and 'step'"):
        state_after({"step": 3}, STARTS, packed=False)
    with pytest.raises(ValueError, match="epoch 0 step 3, not a batch"):
        state_after({"epoch": 0, "step": 3}, STARTS, packed=False)
    with pytest.raises(ValueError, match="epoch 1 step 1, not a batch"):  # before the start
        state_after({"epoch": 1, "step": 1}, STARTS, packed=False)
    with pytest.raises(ValueError, match="'micro' and 'num_micro'"):
        state_after({"epoch": 1, "step": 3}, STARTS, packed=True)
    with pytest.raises(ValueError, match=r"holds \[3, 4\], not one step counter"):
        state_after({"epoch": 1, "step": (3, 4)}, STARTS, packed=False)


def test_a_resumed_output_continues_after_the_delivered_batch():
    lengths = np.random.default_rng(3).integers(1, 20, size=40)
    kw = {"global_batch_size": 4, "num_replicas": 2, "rank": 1, "epochs": 2}
    whole = chronica.tf.schedule(lengths, **kw)
    every = [b["idx"].numpy().tolist() for b in make_dataset(lengths).apply(whole)]
    first = chronica.tf.schedule(lengths, **kw)
    taken = []
    for batch in make_dataset(lengths).apply(first):  # tf.data prefetches past it
        taken.append(batch)
        if len(taken) == first.steps_per_epoch + 2:
            break
    with pytest.raises(TypeError, match="delivered="):
        first.get_state(delivered=["epoch", "step"])
    state = first.get_state(delivered=taken[-1])
    assert (state["epoch"], state["step"]) == (1, 2)
    resumed = chronica.tf.schedule(lengths, **kw)
    resumed.set_state(state)
    rest = [b["idx"].numpy().tolist() for b in make_dataset(lengths).apply(resumed)]
    assert rest == every[len(taken) :]
