"""chronica.adapters.tf.keras_output: the names of Keras's x and y (TypeError for a wrong
type, ValueError for a wrong value), the options model.fit cannot train, the
(x, y, sample_weight) elements of a real tf.data pipeline, and an iteration that is always
one whole epoch."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from tf_data import make_dataset  # noqa: E402

import chronica.tf  # noqa: E402
from chronica.adapters.tf.keras_output import KerasOutput  # noqa: E402

FINE = {"packed": False, "padded": True, "dynamic": False, "epochs": 1, "served": 1}


def test_names_are_one_string_or_distinct_strings():
    assert KerasOutput("tok", "idx") == KerasOutput(x="tok", y="idx")
    output = KerasOutput(["tok", "tok_mask"], ("idx",))
    assert output.x == ("tok", "tok_mask") and output.y == ("idx",)
    assert repr(output) == "KerasOutput(x=('tok', 'tok_mask'), y=('idx',))"
    with pytest.raises(TypeError, match=r"x=3 must name an output feature \(a string"):
        KerasOutput(3, "idx")
    with pytest.raises(TypeError, match="y="):
        KerasOutput("tok", ["idx", 2])
    with pytest.raises(ValueError, match=r"x=\[\] must name at least one"):
        KerasOutput([], "idx")
    with pytest.raises(ValueError, match="each once"):
        KerasOutput("tok", ["idx", "idx"])


def test_of_refuses_what_model_fit_cannot_train_naming_each():
    assert KerasOutput.of(None, None, **FINE) is None
    assert KerasOutput.of("tok", "idx", **FINE) == KerasOutput("tok", "idx")
    for given in ({"x": "tok", "y": None}, {"x": None, "y": "idx"}):
        with pytest.raises(ValueError, match="go together"):
            KerasOutput.of(**given, **FINE)
    bad = {"packed": True, "padded": False, "dynamic": True, "epochs": 2, "served": 2}
    with pytest.raises(ValueError) as refused:
        KerasOutput.of("tok", "idx", **bad)
    for named in ("packing=", "padded=False", "kind='dynamic'", "epochs=2", "serving 2"):
        assert named in str(refused.value)
    for option, value in bad.items():
        with pytest.raises(ValueError, match="cannot be combined with"):
            KerasOutput.of("tok", "idx", **{**FINE, option: value})
    with pytest.raises(TypeError, match="x="):  # the names are checked first
        KerasOutput.of(1, "idx", **bad)


def test_check_features_names_the_missing_ones_and_the_available():
    KerasOutput(["tok", "tok_mask"], "idx").check_features(["idx", "tok", "tok_mask"])
    with pytest.raises(ValueError, match=r"\['label'\], which the output lacks; .*\['idx'\]"):
        KerasOutput("idx", "label").check_features(["idx"])


def test_elements_of_a_real_pipeline_carry_the_loss_weight_on_every_row():
    ds = tf.data.Dataset.from_tensor_slices(
        {"a": np.arange(6.0).reshape(3, 2), "b": np.arange(3), "c": np.ones(3)}
    ).batch(3)
    output = KerasOutput(["a", "c"], "b")
    mapped = ds.map(lambda out: output.element(out, out["b"], tf.constant(0.25)))
    x, y, weights = next(iter(mapped))
    assert sorted(x) == ["a", "c"] and x["a"].shape == (3, 2)
    assert y.numpy().tolist() == [0, 1, 2]
    assert weights.dtype == tf.float32 and weights.numpy().tolist() == [0.25] * 3


def test_whole_epoch_fills_with_empty_steps_and_refuses_more_than_an_epoch():
    rows = [(3, s, np.array([s]), 1.0, np.zeros(2, np.int64)) for s in range(2, 5)]
    filled = KerasOutput.whole_epoch(rows, epoch=3, steps=5, varying=2)
    assert filled[:3] == rows and len(filled) == 5
    for epoch, step, indices, weight, pads in filled[3:]:
        assert (epoch, step, len(indices), weight, pads.tolist()) == (3, -1, 0, 0.0, [0, 0])
    assert KerasOutput.whole_epoch(rows, epoch=3, steps=3, varying=2) == rows
    with pytest.raises(ValueError, match="resumed epoch 3 has 3 steps left"):
        KerasOutput.whole_epoch(rows, epoch=3, steps=2, varying=2)


def test_repeated_names_the_callback():
    error = KerasOutput.repeated("the output is iterated again")
    assert isinstance(error, ValueError)
    assert str(error).startswith("the output is iterated again. Keras's model.fit")
    assert "ScheduleCallback" in str(error)


def test_a_resumed_keras_epoch_keeps_the_epochs_cardinality_with_empty_steps_last():
    lengths = np.random.default_rng(2).integers(1, 9, size=24)
    kw = {"global_batch_size": 4, "num_replicas": 1, "rank": 0, "x": "tok", "y": "idx"}
    first = chronica.tf.schedule(lengths, **kw)
    whole = list(make_dataset(lengths).apply(first))
    steps = first.steps_per_epoch
    assert len(whole) == steps == 6 and all(w.shape == (4,) for _, _, w in whole)
    state = first.get_state(delivered={"epoch": 0, "step": 1})  # after two steps
    resumed = chronica.tf.schedule(lengths, **kw)
    resumed.set_state(state)
    data = make_dataset(lengths).apply(resumed)
    assert int(data.cardinality()) == steps
    got = list(data)
    assert len(got) == steps
    for (_, y, _), (_, want, _) in zip(got[: steps - 2], whole[2:], strict=True):
        assert y.numpy().tolist() == want.numpy().tolist()
    assert [int(tf.size(y)) for _, y, _ in got[steps - 2 :]] == [0, 0]
