"""The ``tf.data`` plumbing of ``chronica.tf.schedule``: replicas' streams in, steps out.

The schedule decides every step in Python (``chronica.runtime.RankStream``); this module
turns an epoch of the served replicas' streams into rows (``epoch_rows``,
``epoch_micro_batches``) and hands them to ``tf.data`` with as few Python calls as each
kind allows. Static
plans are known per epoch: one generator call hands ``tf.data`` an epoch's whole index table
(``epoch_table``), and the steps are sliced from it in the graph (``static_steps``). Dynamic
plans arrive window by window and follow the replicas' reports, so they are one generator
call per step (``dynamic_steps``). Packed plans are one call per micro-batch, whose rows
``chronica.runtime.rows`` lays out as a flat token index (``packed_steps``). The elements are
then gathered from ``chronica.adapters.tf.store.ExampleStore`` by a ``tf.data`` map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf.store import Row
from chronica.core import Packing
from chronica.runtime import LocalBatch, RankStream
from chronica.runtime.padding import step_longest
from chronica.runtime.rows import row_layout

__all__ = [
    "dynamic_steps",
    "epoch_micro_batches",
    "epoch_rows",
    "epoch_table",
    "packed_steps",
    "static_steps",
]


def epoch_rows(streams: Sequence[RankStream], lengths: np.ndarray, padded: bool) -> Iterator[Row]:
    """The ``Row`` of every step of the streams' current epoch: ``(epoch, step, indices,
    loss_weight, padded lengths)``, the served replicas' batches of a step one after
    another. The padded lengths are the step's longest example over every replica (not
    only those served), per variable-length feature; zeros when not ``padded``.

    Args:
        streams: the streams of the replicas this pipeline serves, at the same epoch.
        lengths: every example's length in each variable-length feature, ``(N, F)``.
        padded: whether variable-length features are padded.

    Example::

        >>> for epoch, step, indices, weight, pads in epoch_rows(streams, lengths, True):
        ...     pass
    """
    lead = streams[0]
    # The plan of every replica's step (for kind="dynamic" the static plan, whose steps
    # hold the same samples): every replica pads to the same length.
    if padded and lengths.shape[1]:
        longest = step_longest(lead.plan(), lengths)
    else:
        longest = np.zeros((lead.num_steps, lengths.shape[1]), dtype=np.int64)
    parts: tuple[LocalBatch, ...]
    for parts in zip(*(stream.batches() for stream in streams), strict=True):
        for part in parts:
            yield part.epoch, part.step, part.indices, part.loss_weight, longest[part.step]


def epoch_micro_batches(
    streams: Sequence[RankStream], packing: Packing, splits: np.ndarray
) -> Iterator[tuple[Any, ...]]:
    """Every packed micro-batch of the streams' current epoch, from the streams' position
    on: epoch, step, micro-batch, micro-batch count, loss weight, and its
    ``chronica.runtime.rows`` layout (the flat token index of every slot, segment ids,
    positions); the served replicas' micro-batches of a step interleaved, micro-batch by
    micro-batch. Every stream advances by one before its micro-batch is handed out.

    Args:
        streams: the streams of the replicas this pipeline serves, at the same position.
        packing: the schedule's ``Packing`` (the rows' shape).
        splits: every example's bounds in the packed store's tokens.

    Example::

        >>> for element in epoch_micro_batches(streams, packing, store.splits):
        ...     pass
    """
    lead = streams[0]
    parts: tuple[LocalBatch, ...]
    for parts in zip(*(stream.batches(whole=False) for stream in streams), strict=True):
        count = len(parts[0].micro)
        for m in range(lead.offset, count):
            for stream, part in zip(streams, parts, strict=True):
                # Counted before it is handed out (get_state() is after it).
                stream.advance(1)
                micro = part.micro[m]
                layout = row_layout(micro, packing.rows, packing.length)
                yield (
                    part.epoch,
                    part.step,
                    m,
                    count,
                    np.float32(micro.loss_weight),
                    layout.token_index(splits),
                    layout.segment_ids,
                    layout.positions,
                )


def static_steps(
    epoch_tables: Callable[[], Iterator[tuple[np.ndarray, ...]]], varying: int
) -> tf.data.Dataset:
    """Every step of ``epoch_tables``'s epochs as a ``Row`` of tensors, in order.

    Args:
        epoch_tables: a generator function yielding one ``epoch_table`` per epoch.
        varying: the number of variable-length features (a row's padded lengths).

    Example::

        >>> steps = static_steps(lambda: iter([epoch_table(rows)]), varying=1)
        >>> epoch, step, indices, weight, pads = next(iter(steps))
    """
    tables = tf.data.Dataset.from_generator(epoch_tables, output_signature=_table_spec(varying))
    return tables.flat_map(_table_steps)


def dynamic_steps(rows: Callable[[], Iterator[Row]], varying: int) -> tf.data.Dataset:
    """Every ``Row`` of ``rows`` as tensors, one generator call per step.

    Args:
        rows: a generator function yielding one ``Row`` per step.
        varying: the number of variable-length features (a row's padded lengths).

    Example::

        >>> steps = dynamic_steps(lambda: iter(rows), varying=0)
    """
    return tf.data.Dataset.from_generator(rows, output_signature=_step_spec(varying))


def packed_steps(
    micro_batches: Callable[[], Iterator[tuple[Any, ...]]], packing: Packing
) -> tf.data.Dataset:
    """Every packed micro-batch of ``micro_batches`` as tensors: epoch, step, micro-batch,
    micro-batch count (int64 scalars), loss weight (float32), flat token index (int64),
    segment ids and positions (int32), the last three ``(rows, row_length)``.

    Args:
        micro_batches: a generator function yielding those eight values per micro-batch.
        packing: the ``Packing`` that sets the rows' shape.

    Example::

        >>> micro = packed_steps(schedule_micro_batches, Packing(max_tokens=1024))
    """
    return tf.data.Dataset.from_generator(micro_batches, output_signature=_micro_spec(packing))


def epoch_table(rows: list[Row]) -> tuple[np.ndarray, ...]:
    """One epoch's rows as flat arrays: epochs, steps, every step's indices concatenated,
    their counts, loss weights, and padded lengths ``(steps, varying)``.

    Args:
        rows: the epoch's rows, in step order (at least one).

    Example::

        >>> epochs, steps, flat, lengths, weights, pads = epoch_table(rows)
    """
    epochs, steps, indices, weights, pads = zip(*rows, strict=True)
    lengths = np.fromiter((len(x) for x in indices), dtype=np.int64, count=len(indices))
    flat = np.concatenate(indices).astype(np.int64, copy=False)
    return (
        np.asarray(epochs, dtype=np.int64),
        np.asarray(steps, dtype=np.int64),
        flat,
        lengths,
        np.asarray(weights, dtype=np.float32),
        np.stack(pads).astype(np.int64, copy=False),
    )


def _step_spec(varying: int) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one ``Row`` (``varying`` variable-length features)."""
    return (
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([], tf.float32),
        tf.TensorSpec([varying], tf.int64),
    )


def _table_spec(varying: int) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one ``epoch_table``."""
    return (
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([None, varying], tf.int64),
    )


def _micro_spec(packing: Packing) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one packed micro-batch."""
    shape = [packing.rows, packing.length]
    return (
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.float32),
        tf.TensorSpec(shape, tf.int64),
        tf.TensorSpec(shape, tf.int32),
        tf.TensorSpec(shape, tf.int32),
    )


def _table_steps(
    epochs: tf.Tensor,
    steps: tf.Tensor,
    flat: tf.Tensor,
    lengths: tf.Tensor,
    weights: tf.Tensor,
    pads: tf.Tensor,
) -> tf.data.Dataset:
    indices = tf.RaggedTensor.from_row_lengths(flat, lengths)
    return tf.data.Dataset.from_tensor_slices((epochs, steps, indices, weights, pads))
