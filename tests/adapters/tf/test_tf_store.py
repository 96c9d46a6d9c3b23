"""chronica.adapters.tf.store: the examples of a real tf.data input read once into dense and
ragged tensors (or packed token columns), size_fn called once per example, every refusal by
its class, and the gathers from a step's indices to the output element."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from tf_data import make_dataset  # noqa: E402

from chronica.adapters.tf.keras_output import KerasOutput  # noqa: E402
from chronica.adapters.tf.store import ExampleStore  # noqa: E402

LENGTHS = np.array([3, 1, 4, 1, 5], dtype=np.int64)


def tokens_of(i: int) -> list[int]:
    """Example ``i``'s tokens in ``make_dataset``."""
    return [i * 1000 + j for j in range(LENGTHS[i])]


def counted(ds: tf.data.Dataset, reads: list[int]) -> tf.data.Dataset:
    """``ds`` through a generator that counts how often it is iterated."""

    def examples():
        reads.append(1)
        yield from ds.as_numpy_iterator()

    return tf.data.Dataset.from_generator(examples, output_signature=ds.element_spec)


def test_dense_and_ragged_features_are_read_once_with_sizes():
    reads: list[int] = []
    seen: list[int] = []

    def size_fn(example):
        seen.append(int(example["idx"]))
        return len(example["tok"])

    store = ExampleStore(counted(make_dataset(LENGTHS), reads), size_fn, expected=None)
    assert reads == [1] and seen == list(range(5))  # once, in order, one call per example
    assert store.num_examples == 5 and store.sizes == LENGTHS.tolist()
    assert store.is_dict and store.keys == ["idx", "tok"]
    assert store.ragged == {"idx": False, "tok": True} and store.varying == ["tok"]
    assert store.tensors["idx"].numpy().tolist() == list(range(5))
    assert store.tensors["tok"].to_list() == [tokens_of(i) for i in range(5)]
    assert store.feature_lengths[:, 0].tolist() == LENGTHS.tolist()
    assert store.output_names(padded=True) == ["idx", "tok", "tok_length", "tok_mask"]
    assert store.output_names(padded=False) == ["idx", "tok"]
    assert repr(store) == "ExampleStore(num_examples=5, keys=['idx', 'tok'], varying=['tok'])"


def test_a_tensor_example_is_the_feature_x_and_no_size_fn_keeps_no_sizes():
    ds = tf.data.Dataset.from_tensor_slices(np.arange(12, dtype=np.float32).reshape(4, 3))
    store = ExampleStore(ds, None, expected=4)
    assert not store.is_dict and store.keys == ["x"] and store.sizes is None
    assert store.tensors["x"].shape == (4, 3) and store.varying == []


def test_an_empty_data_set_gives_empty_tensors():
    ds = tf.data.Dataset.from_tensor_slices({"v": np.zeros((0, 2), np.int32)})
    store = ExampleStore(ds, None, expected=None)
    assert store.num_examples == 0 and store.tensors["v"].shape == (0, 2)


def test_refusals_name_the_argument_and_the_fix():
    with pytest.raises(TypeError, match=r"tf\.data\.Dataset, got list"):
        ExampleStore([1, 2], None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="infinite"):
        ExampleStore(make_dataset(LENGTHS).repeat(), None, None)
    pairs = tf.data.Dataset.from_tensor_slices((np.arange(3), np.arange(3)))
    with pytest.raises(ValueError, match=r"flat dict .* dataset\.map"):
        ExampleStore(pairs, None, None)
    ragged = tf.data.Dataset.from_tensor_slices(
        {"r": tf.ragged.constant([[[1], [2]], [[3]]], ragged_rank=1)}
    )
    with pytest.raises(ValueError, match="plain tensor"):
        ExampleStore(ragged, None, None)
    reserved = tf.data.Dataset.from_tensor_slices({"step": np.arange(3)})
    with pytest.raises(ValueError, match="'step' is reserved"):
        ExampleStore(reserved, None, None)

    def grids():
        yield np.zeros((2, 2), np.int32)
        yield np.zeros((2, 3), np.int32)

    varying = tf.data.Dataset.from_generator(
        grids, output_signature=tf.TensorSpec([None, None], tf.int32)
    )
    with pytest.raises(ValueError, match="more than its first dimension"):
        ExampleStore(varying, None, None)


def test_a_data_set_of_unknown_length_is_read_up_to_the_sizes_length():
    ds = make_dataset(LENGTHS).filter(lambda e: True)  # unknown cardinality
    assert int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    assert ExampleStore(ds, None, expected=5).num_examples == 5
    with pytest.raises(ValueError, match=r"more than 3 examples \(len\(sizes\)=3\)"):
        ExampleStore(ds, None, expected=3)


def test_gather_pads_to_the_rows_length_or_keeps_ragged_and_adds_the_position():
    store = ExampleStore(make_dataset(LENGTHS), None, None)
    index = np.array([4, 1], dtype=np.int64)
    # The step's padded length (6) may exceed this batch's own longest example (5).
    row = (np.int64(2), np.int64(7), index, np.float32(0.5), np.array([6], np.int64))
    steps = tf.data.Dataset.from_tensors(row)
    out = next(iter(steps.map(store.gather(padded=True))))
    assert out["idx"].numpy().tolist() == [4, 1]
    assert out["tok"].numpy().tolist() == [tokens_of(4) + [0], tokens_of(1) + [0] * 5]
    assert out["tok_length"].numpy().tolist() == [5, 1]
    assert out["tok_mask"].numpy().sum(axis=1).tolist() == [5, 1]
    assert out["tok_mask"].shape == (2, 6)
    assert float(out["loss_weight"]) == 0.5
    assert (int(out["epoch"]), int(out["step"])) == (2, 7)
    ragged = next(iter(steps.map(store.gather(padded=False))))
    assert ragged["tok"].to_list() == [tokens_of(4), tokens_of(1)]
    assert "tok_mask" not in ragged


def test_gather_with_keras_output_gives_x_y_and_the_weight_per_row():
    store = ExampleStore(make_dataset(LENGTHS), None, None)
    row = (np.int64(0), np.int64(0), np.array([0, 2, 3]), np.float32(1.5), np.array([4]))
    gather = store.gather(padded=True, keras=KerasOutput(x=["tok", "tok_mask"], y="idx"))
    x, y, weights = next(iter(tf.data.Dataset.from_tensors(row).map(gather)))
    assert sorted(x) == ["tok", "tok_mask"] and x["tok"].shape == (3, 4)
    assert y.numpy().tolist() == [0, 2, 3]
    assert weights.numpy().tolist() == [1.5, 1.5, 1.5]


def packed_examples() -> tf.data.Dataset:
    """Dict examples: ``"tok"`` (example ``i``'s tokens) and ``"tgt"`` (each token + 1)."""
    tokens = tf.ragged.constant([tokens_of(i) for i in range(5)], dtype=tf.int64)
    ds = tf.data.Dataset.from_tensor_slices({"tok": tokens, "tgt": tokens + 1})
    return ds.map(lambda e: {"tok": e["tok"], "tgt": e["tgt"]})


def test_the_packed_store_concatenates_tokens_and_gathers_rows_with_zero_padding():
    store = ExampleStore(packed_examples(), None, None, token_field="tok")
    assert store.names == {"tok": "tokens", "tgt": "tgt"}
    assert store.splits.tolist() == [0, 3, 4, 8, 9, 14]
    assert store.lengths.tolist() == LENGTHS.tolist()
    assert store.flat["tok"].numpy().tolist() == [t for i in range(5) for t in tokens_of(i)]
    assert store.flat["tok"].dtype == tf.int32  # tokens are packed as int32
    # One row of 6 slots: example 2's tokens (4 .. 8), then example 1's (3), then padding.
    index = np.array([[4, 5, 6, 7, 3, -1]], np.int64)
    segments = np.array([[1, 1, 1, 1, 2, 0]], np.int32)
    positions = np.array([[0, 1, 2, 3, 0, 0]], np.int32)
    micro = (0, 3, 1, 2, np.float32(0.25), index, segments, positions)
    element = next(iter(tf.data.Dataset.from_tensors(micro).map(store.gather_rows())))
    want = tokens_of(2) + tokens_of(1)
    assert element["tokens"].numpy().tolist() == [want + [0]]
    assert element["tgt"].numpy().tolist() == [[t + 1 for t in want] + [0]]
    assert element["segment_ids"].numpy().tolist() == segments.tolist()
    assert element["positions"].numpy().tolist() == positions.tolist()
    position = [int(element[k]) for k in ("epoch", "step", "micro", "num_micro")]
    assert position == [0, 3, 1, 2] and float(element["loss_weight"]) == 0.25


def test_a_packed_field_must_be_as_long_as_the_tokens():
    ds = tf.data.Dataset.from_tensor_slices(
        {"tok": tf.ragged.constant([[1, 2], [3]]), "other": tf.ragged.constant([[1], [2]])}
    ).map(lambda e: {"tok": e["tok"], "other": e["other"]})
    with pytest.raises(ValueError, match="as long as the tokens"):
        ExampleStore(ds, None, None, token_field="tok")
