"""The TensorFlow tests' example data set (tests/adapters/tf, and the fresh processes they
start)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def make_dataset(lengths: np.ndarray) -> tf.data.Dataset:
    """Examples {"idx": sample index, "tok": variable-length int32 tokens idx*1000 + j}."""
    n = len(lengths)
    values = np.concatenate(
        [i * 1000 + np.arange(n_i, dtype=np.int32) for i, n_i in enumerate(lengths)]
        or [np.empty(0, np.int32)]
    )
    tokens = tf.RaggedTensor.from_row_lengths(values.astype(np.int32), lengths.astype(np.int64))
    ds = tf.data.Dataset.from_tensor_slices({"idx": tf.range(n, dtype=tf.int64), "tok": tokens})
    return ds.map(lambda e: {"idx": e["idx"], "tok": e["tok"]})
