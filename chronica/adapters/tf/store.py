"""The examples of a finite ``tf.data`` input, held in memory for ``chronica.tf.schedule``.

``ExampleStore(dataset, ...)`` iterates the data set once, eagerly: every feature becomes
one dense tensor (all examples of one shape) or one ``tf.RaggedTensor`` (examples varying
in their first dimension), and ``size_fn``'s result for every example is kept. With packing
(``token_field`` given) every feature's tokens of all examples are concatenated instead,
example ``i`` being ``splits[i] .. splits[i + 1]``. ``gather`` and ``gather_rows`` are the
``tf.data`` maps from a step's indices (a ``Row``) or a packed micro-batch's flat token
index (``chronica.runtime.rows``) to the output element, computed in the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from chronica.runtime.rows import TOKENS, check_field_lengths, packed_dtype, packed_names

if TYPE_CHECKING:
    from chronica.adapters.tf.keras_output import KerasOutput

__all__ = [
    "EPOCH",
    "LOSS_WEIGHT",
    "MICRO",
    "NUM_MICRO",
    "SINGLE_KEY",
    "STEP",
    "ExampleStore",
    "Row",
]

# The feature a non-dict example becomes, and the features chronica adds to an element.
SINGLE_KEY = "x"
LOSS_WEIGHT, EPOCH, STEP = "loss_weight", "epoch", "step"
MICRO, NUM_MICRO = "micro", "num_micro"
_RESERVED = (LOSS_WEIGHT, EPOCH, STEP)
# Examples read from a data set of unknown length before it counts as endless.
_UNKNOWN_LENGTH_LIMIT = 10_000_000

# A step's local batch, as the schedule hands it to tf.data: epoch, step, indices, loss
# weight, and the padded length of every variable-length feature (the step's longest).
Row = tuple[int, int, np.ndarray, float, np.ndarray]


class ExampleStore:
    """Every example of a finite data set, read once; the maps from batches to elements.

    Guarantees: the data set is iterated exactly once, in its order, and ``size_fn`` is
    called exactly once per example (its results in ``sizes``); after construction nothing
    reads the data set again. Without packing, ``tensors[key]`` holds feature ``key`` of
    every example (``ragged[key]``: a ``tf.RaggedTensor`` because its first dimension
    varies), ``varying`` names the ragged features and ``feature_lengths`` (``(N, F)``
    int64) every example's length in each. With packing, ``flat[key]`` holds every
    example's values of feature ``key`` concatenated along the token axis, ``splits`` the
    examples' bounds in it, ``lengths`` every example's token count, and ``names`` the output
    name of each feature (the token feature is ``"tokens"``).

    Args:
        dataset: a finite ``tf.data.Dataset`` whose elements are a tensor or a flat dict of
            tensors (variable-length first dimensions allowed; not ragged or sparse inputs).
        size_fn: called once per example (numpy values, as ``as_numpy_iterator`` yields
            them), returning its size; ``None`` keeps no sizes.
        expected: the number of examples the caller expects (``len(sizes)``), bounding how
            much of a data set of unknown length is read; ``None``: no expectation.
        token_field: with packing, the dict feature holding the tokens (a non-dict example
            is the tokens itself); ``None`` stores the examples unpacked.

    Raises ``TypeError`` when ``dataset`` is not a ``tf.data.Dataset``, ``ValueError`` for
    an infinite data set, an endless one of unknown length, elements of another structure,
    a reserved feature name, or a feature varying beyond its first dimension.

    Example::

        >>> ds = tf.data.Dataset.from_tensor_slices({"idx": tf.range(3)})
        >>> store = ExampleStore(ds, size_fn=lambda ex: 1, expected=3)
        >>> store.num_examples, store.sizes, store.varying
        (3, [1, 1, 1], [])
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        size_fn: Callable[[Any], Any] | None,
        expected: int | None,
        token_field: str | None = None,
    ) -> None:
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"chronica.tf.schedule is applied to a tf.data.Dataset, got "
                f"{type(dataset).__name__}; make one first, e.g. "
                f"tf.data.Dataset.from_tensor_slices(...), and call dataset.apply(schedule)"
            )
        spec = dataset.element_spec
        if isinstance(spec, Mapping):
            self.is_dict = True
            self.keys = list(spec.keys())
            specs = [spec[k] for k in self.keys]
        elif isinstance(spec, tf.TensorSpec):
            self.is_dict = False
            self.keys = [SINGLE_KEY]
            specs = [spec]
        else:
            raise ValueError(
                f"chronica.tf.schedule needs examples that are a tensor or a flat dict of "
                f"tensors, got element_spec {spec!r}; map tuples to a dict first, e.g. "
                f"dataset.map(lambda x, y: {{'x': x, 'y': y}})"
            )
        for key, s in zip(self.keys, specs, strict=True):
            if not isinstance(s, tf.TensorSpec):
                raise ValueError(
                    f"feature {key!r} has spec {s!r}; every feature must be a plain tensor "
                    f"(variable-length 1-D features are fine, ragged/sparse inputs are not)"
                )
            if self.is_dict and key in _RESERVED and token_field is None:
                raise ValueError(
                    f"feature name {key!r} is reserved by chronica (the output adds "
                    f"{', '.join(repr(k) for k in _RESERVED)}); rename it with dataset.map"
                )
        cardinality = int(dataset.cardinality())
        if cardinality == int(tf.data.INFINITE_CARDINALITY):
            raise ValueError(
                "the data set is infinite (e.g. it ends in .repeat()); apply "
                "chronica.tf.schedule to the finite data set and pass epochs= instead of "
                "repeating"
            )
        # A data set of unknown length (from_generator, filter) is read with a bound, so an
        # endless one ends in an error instead of filling memory: the sizes' length plus one
        # when sizes were given, else _UNKNOWN_LENGTH_LIMIT examples.
        limit = None
        if cardinality == int(tf.data.UNKNOWN_CARDINALITY):
            limit = _UNKNOWN_LENGTH_LIMIT if expected is None else expected + 1
        columns: list[list[np.ndarray]] = [[] for _ in self.keys]
        sizes: list[Any] = []
        for count, element in enumerate(dataset.as_numpy_iterator()):
            if limit is not None and count >= limit:
                raise ValueError(
                    f"the data set's length is unknown (e.g. from_generator) and it yielded "
                    f"more than {limit - 1:,} examples"
                    + (f" (len(sizes)={expected})" if expected is not None else "")
                    + "; if it is endless, apply chronica.tf.schedule to a finite one and "
                    "pass epochs=; if it is finite, state its length with "
                    "dataset.apply(tf.data.experimental.assert_cardinality(N))"
                )
            values = [element[k] for k in self.keys] if self.is_dict else [element]
            for column, value in zip(columns, values, strict=True):
                column.append(np.asarray(value))
            if size_fn is not None:
                sizes.append(size_fn(element))
        self.num_examples = len(columns[0])
        self.sizes = sizes if size_fn is not None else None
        self.ragged: dict[str, bool] = {}
        self.tensors: dict[str, tf.Tensor | tf.RaggedTensor] = {}
        self.names: dict[str, str] = {}  # packed feature -> output key
        self.flat: dict[str, tf.Tensor] = {}
        self.splits = np.zeros(1, dtype=np.int64)
        self.varying: list[str] = []
        self.feature_lengths = np.zeros((self.num_examples, 0), dtype=np.int64)
        if token_field is not None:
            self._flatten(token_field, specs, columns)
            return
        for key, s, column in zip(self.keys, specs, columns, strict=True):
            self.tensors[key], self.ragged[key] = self._to_tensor(key, s, column)
        # The variable-length features and every example's length in each, (N, F).
        self.varying = [key for key in self.keys if self.ragged[key]]
        self.feature_lengths = np.zeros((self.num_examples, len(self.varying)), np.int64)
        for f, key in enumerate(self.varying):
            self.feature_lengths[:, f] = self.tensors[key].row_lengths().numpy()

    def __repr__(self) -> str:
        packed = f", packed={sorted(self.flat)}" if self.flat else ""
        return (
            f"ExampleStore(num_examples={self.num_examples}, keys={self.keys}, "
            f"varying={self.varying}{packed})"
        )

    def output_names(self, padded: bool) -> list[str]:
        """The features of an unpacked output element, in order, derived ones included
        (every variable-length feature ``k`` adds ``k + "_length"`` and ``k + "_mask"``
        when padded); chronica's own ``loss_weight``, ``epoch`` and ``step`` are not listed.

        Args:
            padded: whether variable-length features are padded (see ``gather``).

        Example::

            >>> store.output_names(padded=True)  # a store of {"idx", "tok"}, "tok" ragged
            ['idx', 'tok', 'tok_length', 'tok_mask']
        """
        names = list(self.keys)
        if padded:
            for key in self.varying:
                names += [key + "_length", key + "_mask"]
        return names

    def _flatten(
        self, token_field: str, specs: list[tf.TensorSpec], columns: list[list[np.ndarray]]
    ) -> None:
        """The packed store: every feature is a per-token sequence as long as the tokens."""
        if self.is_dict:
            self.names = packed_names(self.keys, token_field, reserved=(EPOCH,))
        else:
            self.names = packed_names(None, SINGLE_KEY)
        token_key = next(k for k, name in self.names.items() if name == TOKENS)
        tokens = columns[self.keys.index(token_key)]
        lengths = np.array([np.shape(a)[0] if np.ndim(a) else -1 for a in tokens], np.int64)
        self.splits = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))]).astype(np.int64)
        self.lengths = lengths
        features = sorted(
            zip(self.keys, specs, columns, strict=True), key=lambda f: f[0] != token_key
        )
        for key, spec, column in features:  # the tokens first
            known = [] if spec.shape.rank is None else [spec.shape.rank]
            rank = min([*known, *(np.ndim(a) for a in column)], default=1)
            dtype = packed_dtype(self.names[key], key, spec.dtype.as_numpy_dtype, rank)
            if key != token_key:
                own = [a.shape[0] for a in column]
                check_field_lengths(key, own, lengths, token_key)
            tail = [d or 0 for d in spec.shape.as_list()[1:]]
            trailing = {a.shape[1:] for a in column}
            if len(trailing) > 1:
                raise ValueError(
                    f"feature {key!r} varies beyond its first dimension (shapes "
                    f"{sorted(trailing)[:3]}...); only the token axis may vary"
                )
            values = np.concatenate(column, axis=0) if column else np.zeros([0, *tail])
            self.flat[key] = tf.constant(values, dtype=dtype)

    @staticmethod
    def _to_tensor(
        key: str, spec: tf.TensorSpec, column: list[np.ndarray]
    ) -> tuple[tf.Tensor | tf.RaggedTensor, bool]:
        if not column:
            shape = [0] + [d if d is not None else 0 for d in spec.shape.as_list()]
            return tf.zeros(shape, dtype=spec.dtype), False
        shapes = {a.shape for a in column}
        if len(shapes) == 1:
            return tf.constant(np.stack(column), dtype=spec.dtype), False
        trailing = {a.shape[1:] for a in column}
        if any(a.ndim == 0 for a in column) or len(trailing) != 1:
            raise ValueError(
                f"feature {key!r} varies in more than its first dimension (shapes "
                f"{sorted(shapes)[:3]}...); only the leading dimension may vary"
            )
        lengths = np.array([a.shape[0] for a in column], dtype=np.int64)
        values = tf.constant(np.concatenate(column, axis=0), dtype=spec.dtype)
        return tf.RaggedTensor.from_row_lengths(values, lengths), True

    def gather(self, padded: bool, keras: KerasOutput | None = None) -> Callable[..., Any]:
        """The ``tf.data`` map from one step's ``Row`` (its five tensors as arguments) to
        its output element: a dict of every feature's rows at the step's indices, plus
        ``"loss_weight"``, ``"epoch"`` and ``"step"``; with ``keras``, Keras's
        ``(x, y, sample_weight)`` tuple of those features instead.

        Args:
            padded: pad every variable-length feature to the row's padded length (zeros)
                and add its ``_length`` and ``_mask`` features; ``False`` keeps it ragged.
            keras: the ``KerasOutput`` naming ``x`` and ``y``; ``None`` for dicts.

        Example::

            >>> gather = store.gather(padded=True)
            >>> element = gather(epoch, step, indices, loss_weight, padded_lengths)
        """
        tensors, ragged, varying = dict(self.tensors), dict(self.ragged), list(self.varying)

        def gather(
            epoch: tf.Tensor, step: tf.Tensor, index: tf.Tensor, weight: tf.Tensor, pads: tf.Tensor
        ):
            out: dict[str, Any] = {}
            for key, table in tensors.items():
                batch = tf.gather(table, index)
                if ragged[key] and padded:
                    length = tf.cast(pads[varying.index(key)], tf.int32)
                    lengths = batch.row_lengths()
                    dense = batch.to_tensor()
                    fill = [[0, 0], [0, length - tf.shape(dense)[1]]]
                    dense = tf.pad(dense, fill + [[0, 0]] * (dense.shape.rank - 2))
                    out[key] = dense
                    out[key + "_length"] = lengths
                    out[key + "_mask"] = tf.sequence_mask(lengths, maxlen=length)
                else:
                    out[key] = batch
            if keras is not None:
                return keras.element(out, index, weight)
            out[LOSS_WEIGHT] = weight
            out[EPOCH] = epoch
            out[STEP] = step
            return out

        return gather

    def gather_rows(self) -> Callable[..., dict[str, Any]]:
        """The ``tf.data`` map from one packed micro-batch (epoch, step, micro-batch,
        micro-batch count, loss weight, flat token index, segment ids, positions; the
        layout of ``chronica.runtime.rows``) to its output element. Needs a packed store.

        The element, every one of the same static shapes: ``"tokens"`` (int32,
        ``(rows, row_length)`` with ``rows = max_tokens // row_length``, 0 on padding),
        ``"segment_ids"`` (int32, ``1, 2, ...`` per document piece within its row, 0 on
        padding), ``"positions"`` (int32, restarting at 0 in every piece, 0 on padding), as
        ``chronica.runtime.rows`` lays them out (the JAX iterator's arrays, for equal
        plans); a dict example's other features gathered the same way under their own
        names (each a per-token sequence as long as the tokens); ``"loss_weight"``
        (float32: multiply the micro-batch's mean loss, per token or per document as
        ``Packing.loss`` says, by it; summing over the step's micro-batches and averaging
        over replicas gives the global mean), ``"epoch"``, ``"step"``, ``"micro"`` and
        ``"num_micro"`` (int64 scalars).

        Example::

            >>> gather = store.gather_rows()
            >>> element = gather(epoch, step, m, count, weight, index, segment_ids, positions)
        """
        flat, names = dict(self.flat), dict(self.names)

        def gather(
            epoch: tf.Tensor,
            step: tf.Tensor,
            micro: tf.Tensor,
            num_micro: tf.Tensor,
            weight: tf.Tensor,
            index: tf.Tensor,
            segment_ids: tf.Tensor,
            positions: tf.Tensor,
        ):
            real = index >= 0
            safe = tf.maximum(index, 0)
            out: dict[str, Any] = {}
            for key, values in flat.items():
                taken = tf.gather(values, safe)
                keep = real  # broadcast over a feature's trailing axes
                for _ in range(values.shape.rank - 1):
                    keep = keep[..., None]
                out[names[key]] = tf.where(keep, taken, tf.zeros_like(taken))
            out["segment_ids"] = segment_ids
            out["positions"] = positions
            out[LOSS_WEIGHT] = weight
            out[EPOCH] = epoch
            out[STEP] = step
            out[MICRO] = micro
            out[NUM_MICRO] = num_micro
            return out

        return gather
