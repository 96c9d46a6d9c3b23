"""``tf.data`` face of chronica: ``dataset.apply(schedule(...))``.

``schedule`` returns a :class:`Schedule`, a callable that turns a finite data set of examples
into this rank's (or this input pipeline's) balanced local batches, step after step, epoch
after epoch. It is a face of ``chronica.runtime.RankStream``, as the PyTorch samplers are:
for equal sizes and arguments every adapter yields the same indices at every (epoch, step,
rank), and a state saved by one adapter resumes in any other.

This module holds only what is TensorFlow's: the in-memory example store (the input data
set is iterated once, eagerly, when the transformation is first applied; every feature
becomes one dense or ragged tensor and each step's local batch is a ``tf.gather``), the
padding of variable-length features (to the step's longest sample over all replicas, from
``chronica.runtime.padding``), the ``tf.data`` plumbing (a ``from_generator`` over the
stream's local batches), Keras's ``(x, y, sample_weight)`` elements (``x=``/``y=``, one epoch
per iteration, sized for ``model.fit``; ``chronica.adapters.tf.fit`` holds the callback that
selects each epoch), the world of a ``tf.distribute.InputContext``, and the ranks'
agreement for ``kind="dynamic"`` over the key-value store of TensorFlow's coordination
service. With ``packing=`` the store holds every feature's tokens concatenated, one Python
call per micro-batch lays out its dense rows (``chronica.runtime.rows``, shared with the
JAX iterator) as a flat token index, and the graph gathers the tokens with it.
"""

from __future__ import annotations

import copy
import logging
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.core import Packing, ScheduleConfig, validate_sizes
from chronica.core.checks import check_bool, check_int
from chronica.runtime import DynamicOptions, LocalBatch, RankStream
from chronica.runtime.agreement import KeyValueStore, key_value_agreement
from chronica.runtime.face import StreamFace
from chronica.runtime.padding import step_longest
from chronica.runtime.request import open_stream, plan_face, plan_request
from chronica.runtime.rows import (
    TOKENS,
    check_document_lengths,
    check_field_lengths,
    packed_dtype,
    packed_names,
    row_layout,
)
from chronica.runtime.stream import state_format

__all__ = ["Schedule", "schedule"]

logger = logging.getLogger("chronica")

_SINGLE_KEY = "x"
_LOSS_WEIGHT, _EPOCH, _STEP = "loss_weight", "epoch", "step"
_MICRO, _NUM_MICRO = "micro", "num_micro"
_RESERVED = (_LOSS_WEIGHT, _EPOCH, _STEP)
_NAMES = state_format("schedule")
# Examples read from a data set of unknown length before it counts as endless.
_UNKNOWN_LENGTH_LIMIT = 10_000_000
_KEPT_EPOCHS = 64  # epochs whose start a delivered batch may still refer to
# A step's local batch, as the generators hand it to tf.data: epoch, step, indices, loss
# weight, and the padded length of every variable-length feature (the step's longest).
_Row = tuple[int, int, np.ndarray, float, np.ndarray]


class _Store:
    """Every example of the data set, one dense or ragged tensor per feature; with packing
    (``token_field`` given), every feature's tokens of all examples concatenated instead
    (``flat``), example ``i`` being ``splits[i] .. splits[i + 1]``."""

    def __init__(
        self,
        dataset: tf.data.Dataset,
        size_fn: Callable[[Any], Any] | None,
        expected: int | None,
        token_field: str | None = None,
    ) -> None:
        spec = dataset.element_spec
        if isinstance(spec, Mapping):
            self.is_dict = True
            self.keys = list(spec.keys())
            specs = [spec[k] for k in self.keys]
        elif isinstance(spec, tf.TensorSpec):
            self.is_dict = False
            self.keys = [_SINGLE_KEY]
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
        self.varying = []
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

    def output_names(self, padded: bool) -> list[str]:
        """The features of an (unpacked) output element, derived ones included."""
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
            self.names = packed_names(self.keys, token_field, reserved=(_EPOCH,))
        else:
            self.names = packed_names(None, _SINGLE_KEY)
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

    def gather(self, padded: bool, keras: _Keras | None = None) -> Callable[..., Any]:
        """The ``tf.data`` map from one step's ``_Row`` to its output element (see
        ``Schedule``): a dict, or with ``keras`` the ``(x, y, sample_weight)`` tuple."""
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
                # Keras's default loss reduction divides each replica's weighted sum by its
                # row count and the replica count, and sums the replicas' gradients: the
                # loss weight per row makes that the mean over the step's global batch.
                weights = tf.fill(tf.shape(index), weight)
                return _pick(out, keras[0]), _pick(out, keras[1]), weights
            out[_LOSS_WEIGHT] = weight
            out[_EPOCH] = epoch
            out[_STEP] = step
            return out

        return gather

    def gather_rows(self) -> Callable[..., dict[str, Any]]:
        """The ``tf.data`` map from one packed micro-batch's ``_micro_spec`` tuple to its
        output element: every feature's tokens gathered into the dense rows of
        ``chronica.runtime.rows`` (0 on padding), plus the layout and the position."""
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
            out[_LOSS_WEIGHT] = weight
            out[_EPOCH] = epoch
            out[_STEP] = step
            out[_MICRO] = micro
            out[_NUM_MICRO] = num_micro
            return out

        return gather


def _coordination_store(world: int) -> KeyValueStore | None:
    """The key-value store of TensorFlow's coordination service (``MultiWorkerMirroredStrategy``
    from ``TF_CONFIG`` starts it), when there is one; a cluster of another size than
    ``world`` is an error."""
    if not os.environ.get("TF_CONFIG"):
        return None
    from tensorflow.python.eager import context

    ctx = context.context()
    service = ctx.coordination_service
    if not service:
        return None
    tasks = sum(job.num_tasks for job in service.coordinated_job_list)
    if tasks and tasks != world:
        raise ValueError(
            f"num_replicas={world} differs from the {tasks} tasks of the TensorFlow cluster "
            f"(TF_CONFIG); kind='dynamic' needs one replica per worker"
        )

    def get(key: str, timeout_ms: int) -> str:
        return ctx.get_config_key_value(key, timeout_in_ms=timeout_ms)

    return ctx.set_config_key_value, get, ctx.delete_config_key_value


# Which output features form Keras's x and y: one name (a tensor) or several (a dict).
_Names = str | tuple[str, ...]
_Keras = tuple[_Names, _Names]


def _names(argument: str, value: Any) -> _Names:
    """``x=``/``y=``: a feature name, or a non-empty sequence of them."""
    if isinstance(value, str):
        return value
    if (
        isinstance(value, Sequence)
        and value
        and all(isinstance(v, str) for v in value)
        and len(set(value)) == len(value)
    ):
        return tuple(value)
    raise ValueError(
        f"{argument}={value!r} must name an output feature (a string, giving a tensor) or "
        f"several distinct ones (a list of strings, giving a dict of tensors)"
    )


def _pick(out: Mapping[str, Any], names: _Names) -> Any:
    """The tensor ``names`` names, or the dict of the tensors it names."""
    if isinstance(names, str):
        return out[names]
    return {name: out[name] for name in names}


def _scalar(name: str, value: Any) -> int:
    """One integer from a tensor, numpy value, int, or distributed value (all equal)."""
    found = {int(np.asarray(v)) for v in tf.nest.flatten(value, expand_composites=True)}
    if len(found) != 1:
        raise ValueError(f"delivered[{name!r}] holds {sorted(found)}, not one step counter")
    return found.pop()


@plan_face
class Schedule(StreamFace):
    """The transformation ``chronica.tf.schedule`` returns; apply it with ``dataset.apply``.

    Guarantees, for a finite data set of ``N`` examples:

    * the output yields this pipeline's local batches in plan order, one epoch after
      another (``epochs`` of them, from ``epoch``; forever with ``epochs=None``); every rank
      gets the same number of steps, and with the static kinds batch ``s`` of epoch ``e``
      holds exactly ``Scheduler(sizes, config).plan_epoch(e).local(s, rank)``, in that order
      (the indices ``chronica.torch``'s ``DistributedBatchSampler`` yields). With
      ``kind="dynamic"`` each step holds this rank's part of the same step's samples, split
      by rank speed (see ``chronica.runtime.RankStream``);
    * over all ranks, every example appears exactly once per epoch, apart from the padding
      (``drop_last=False``: repeats so every rank has as many) or dropping
      (``drop_last=True``) that torch's ``DistributedSampler`` also does;
    * each output element is a dict: the input's features (a non-dict input becomes the
      feature ``"x"``), batched; ``"loss_weight"`` (float32 scalar: multiply the local mean
      loss by it); ``"epoch"`` and ``"step"`` (int64 scalars: where the batch stands, for
      ``get_state(delivered=...)``); with ``padded=True`` every variable-length feature
      ``k`` is zero-padded to the longest example of the *step*, over every replica (so
      all replicas of a step hold equal shapes, which Keras's ``model.fit`` under a
      strategy needs; with equal local batch sizes the step takes no longer, as every
      replica waits for the one holding that example), and comes with ``k + "_length"``
      (int64, ``(batch,)``) and ``k + "_mask"`` (bool, ``(batch, max_len)``); with
      ``padded=False`` it stays a ``tf.RaggedTensor``;
    * with ``x=`` and ``y=`` (for Keras's ``model.fit``) each element is instead the tuple
      ``(x, y, sample_weight)``: ``x`` and ``y`` the output features they name (one name: a
      tensor; several: a dict), ``sample_weight`` (float32, ``(batch,)``) the loss weight
      on every row, so that Keras's default loss reduction (each replica's weighted sum
      over its rows, divided by its rows and by the replica count, the replicas'
      gradients summed) is the mean over the step's global batch. Every iteration of the
      output is then exactly one epoch, of ``steps_per_epoch`` elements (its cardinality,
      so ``fit`` knows an epoch's length): the epoch ``set_epoch`` selected (or the rest
      of the epoch ``set_state`` left, whose missing steps come last as empty elements
      that ``chronica.tf.ScheduleCallback`` never lets Keras train). Iterating it again
      without ``set_epoch``/``set_state`` in between raises an error naming the fix, as
      ``fit`` would otherwise repeat one epoch; ``ScheduleCallback`` selects the epoch
      ``fit`` trains, and backs up and restores training mid-epoch exactly;
    * sizes (``sizes`` or ``size_fn``) are read once, when the transformation is first
      applied, and cached: ``size_fn`` is called exactly once per example;
    * with ``packing=`` (a ``chronica.core.packing.Packing``; sizes are then document
      lengths in tokens) each output element is one packed micro-batch instead, and every
      rank yields the same number of them at every step (``num_micro``): ``"tokens"``
      (int32, ``(rows, row_length)`` with ``rows = max_tokens // row_length``, 0 on
      padding), ``"segment_ids"`` (int32, ``1, 2, ...`` per document piece within its row,
      0 on padding), ``"positions"`` (int32, restarting at 0 in every piece, 0 on
      padding), as ``chronica.runtime.rows`` lays them out (the JAX iterator's arrays, for
      equal plans); a dict example's other features are packed the same way under their
      own names (each a per-token sequence as long as the tokens); ``"loss_weight"``
      (float32: multiply the micro-batch's mean loss, per token or per document as
      ``Packing.loss`` says, by it; summing over the step's micro-batches and averaging
      over replicas gives the global mean), ``"epoch"``, ``"step"``, ``"micro"`` and
      ``"num_micro"`` (int64 scalars). Every element has the same static shapes. The
      micro-batches of step ``s`` hold exactly this rank's part of ``plan(e).micro``,
      each token of each piece once.

    The scheduler is built when the transformation is first applied (the sizes may come from
    the data set), so ``plan``, ``stats``, ``get_state`` and the other stream calls raise
    ``RuntimeError`` before. Applying the same ``Schedule`` to the same data set object again
    reuses that pass; applying it to another data set reads that one afresh. Every iteration
    of the output starts at ``epoch`` (``set_epoch`` changes it) or at the position of the
    last ``set_state``; iterate one output of a ``Schedule`` at a time. An iteration that
    starts without ``set_epoch`` or ``set_state`` since the previous one repeats its epochs:
    it logs a warning (an error with ``x=``/``y=``).

    Saving and resuming: ``get_state(delivered=batch)``, with ``batch`` the last element the
    training loop took (or a dict of its ``"epoch"`` and ``"step"``), is the exact position
    after that batch, whatever ``tf.data`` prefetched. ``get_state()`` without it is the
    position after the last batch the pipeline produced, ahead of training by what was
    prefetched. ``set_state(state)`` (before applying or before iterating) makes the next
    iteration continue from ``state``, saved by any adapter, at this or another world size
    or global batch size. With ``packing=`` positions count micro-batches: the state after
    micro-batch ``m`` of a step (``delivered`` holds ``"micro"`` and ``"num_micro"``)
    resumes with micro-batch ``m + 1`` of it.

    Args (``chronica.tf.schedule`` is this class under the name the docs use:
    ``ds.apply(chronica.tf.schedule(...))``):
        sizes: one non-negative number per example (tokens, frames); or give ``size_fn``.
        size_fn: called once per example (numpy values, as ``as_numpy_iterator`` yields
            them) when first applied, returning its size; exactly one of the two is required.
        global_batch_size: examples per step over all replicas, a multiple of the replica
            count (required unless ``config`` holds it).
        num_replicas, rank: the world size and this process's replica; required unless
            ``input_context`` is given.
        input_context: the ``tf.distribute.InputContext`` handed to the ``dataset_fn`` of
            ``strategy.distribute_datasets_from_function``; the world is
            ``num_replicas_in_sync`` and this pipeline serves its
            ``num_replicas_in_sync // num_input_pipelines`` replicas, interleaving their
            local batches step by step (the order tf.distribute deals them to its devices).
        labels: one class per example (``shuffle="stratified"``, ``label_skew``).
        partitions: one index list per node (``shuffle="local"``/``"partial"``).
        config: a whole ``chronica.ScheduleConfig`` instead of ``global_batch_size`` and
            the plan options.
        dynamic: ``kind="dynamic"`` (which re-plans every window from the replicas'
            ``report``-ed times): the transport to rank 0's coordinator (a
            ``chronica.runtime.DynamicOptions``).
        padded: pad variable-length features per batch and add ``_length``/``_mask``
            features (``True``) or keep them ragged (``False``).
        epochs: how many epochs the output holds, starting at ``epoch`` (default 1;
            ``None``: forever).
        token_field: with ``packing=`` and dict examples, the feature holding the token
            sequence (output as ``"tokens"``); a non-dict example is the tokens itself.
        x, y: Keras's inputs and targets, given together: an output feature's name (e.g.
            ``"tokens"``, ``"tokens_mask"``, ``"label"``; ``"x"`` for non-dict examples) or
            a list of names (a dict); see above. They need ``padded=True``, one epoch per
            iteration (``epochs=1``, the default), one replica per input pipeline, and a
            static kind without ``packing``.
        options: the plan options below (``packing=`` cuts every step into packed
            micro-batches, see above).

    Raises ``ValueError`` for missing or doubled sizes, a bad argument value, and (when
    applied) an infinite data set or sizes of the wrong length.
    """

    def __init__(
        self,
        sizes: Any = None,
        size_fn: Callable[[Any], Any] | None = None,
        *,
        global_batch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
        padded: bool = True,
        epochs: int | None = 1,
        epoch: int = 0,
        input_context: tf.distribute.InputContext | None = None,
        token_field: str = TOKENS,
        x: str | Sequence[str] | None = None,
        y: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        if (sizes is None) == (size_fn is None):
            raise ValueError(
                "pass exactly one of sizes= (one number per example) or size_fn= (a function "
                "of an example returning its size, e.g. lambda ex: len(ex['tokens']))"
                + ("; both were given" if sizes is not None else "; neither was given")
            )
        if size_fn is not None and not callable(size_fn):
            raise TypeError(f"size_fn={size_fn!r} must be a function of one example")
        if input_context is not None:
            if num_replicas is not None or rank is not None:
                raise ValueError("pass either input_context or num_replicas/rank, not both")
            world = int(input_context.num_replicas_in_sync)
            pipelines = int(input_context.num_input_pipelines)
            if world % pipelines:
                raise ValueError(
                    f"{world} replicas cannot be split evenly over {pipelines} input pipelines"
                )
            num_replicas = world
            rank = int(input_context.input_pipeline_id) * (world // pipelines)
            served = world // pipelines
        else:
            served = 1
        self.config, rank = plan_request(
            options,
            batch_size=global_batch_size,
            num_replicas=num_replicas,
            rank=rank,
            face="chronica.tf.schedule",
            config=config,
            dynamic=dynamic,
            batch_name="global_batch_size",
            needs_step=True,
            missing="pass both, or call schedule(..., input_context=ctx) inside the dataset_fn "
            "given to strategy.distribute_datasets_from_function",
        )
        if self.config.packing is not None and not padded:
            raise ValueError(
                "padded=False keeps variable-length features ragged; packed micro-batches "
                "are dense rows (drop padded= with packing=)"
            )
        self.ranks = list(range(rank, rank + served))
        if self.config.mode.opens_session and served > 1:
            raise ValueError(
                f"kind='dynamic' needs one replica per input pipeline, but this pipeline "
                f"serves replicas {self.ranks} (several devices in one worker): each "
                f"replica's batch is re-planned from its own measured time. Run one worker "
                f"per device (MultiWorkerMirroredStrategy with one device each), or use "
                f"kind='static' or 'guided'"
            )
        self.global_batch_size = self.config.batch_size
        self.keras = self._keras_output(x, y, padded, epochs, served)
        self.epochs = None if epochs is None else check_int("epochs", epochs, 1)
        self.first_epoch = check_int("epoch", epoch, 0)
        self.padded = check_bool("padded", padded)
        self.dynamic_options = dynamic
        self.token_field = token_field
        self._given_sizes, self._size_fn = sizes, size_fn
        self._labels, self._partitions = labels, partitions
        self._source: tf.data.Dataset | None = None
        self._store: _Store | None = None
        self._streams: list[RankStream] = []
        self._start: dict[str, Any] | None = None  # where every iteration begins (set_state)
        self._epoch_starts: dict[int, dict[str, Any]] = {}  # state at each produced epoch's start
        self._unreported: deque[tuple[int, int]] = deque(maxlen=1 << 16)
        # Whether the next iteration was selected (set_epoch, set_state, or none yet): an
        # iteration without a selection repeats the previous one's epochs.
        self._selected = True

    def _keras_output(self, x: Any, y: Any, padded: Any, epochs: Any, served: int) -> _Keras | None:
        """The validated ``(x, y)`` names of Keras's elements, or ``None`` without them."""
        if x is None and y is None:
            return None
        if x is None or y is None:
            raise ValueError(
                "x= and y= go together: name the output features Keras's model.fit takes as "
                "inputs and as targets (e.g. x='tokens', y='label')"
            )
        names = (_names("x", x), _names("y", y))
        fixes = {
            "packing=": self.config.packing is not None,
            "padded=False (Keras takes dense batches; use the '<feature>_mask' outputs)": (
                padded is not True
            ),
            "kind='dynamic' (model.fit reports no per-replica compute times; use a custom "
            "training loop with schedule.report, see the TensorFlow quick start)": (
                self.config.mode.opens_session
            ),
            f"epochs={epochs!r} (each iteration is one epoch: pass epochs= to model.fit "
            f"instead)": epochs != 1,
            f"an input pipeline serving {served} replicas (Keras sizes an epoch by the "
            f"pipeline's elements, one per replica; run one device per worker, e.g. "
            f"MultiWorkerMirroredStrategy)": served > 1,
        }
        refused = [what for what, found in fixes.items() if found]
        if refused:
            raise ValueError(
                "x=/y= (Keras's (x, y, sample_weight) elements, one epoch per iteration) "
                "cannot be combined with " + "; nor with ".join(refused)
            )
        return names

    # -- the stream, once applied ------------------------------------------------------------

    @property
    def stream(self) -> RankStream:  # type: ignore[override]
        """The ``RankStream`` of this pipeline's (first) replica, built when first applied."""
        if not self._streams:
            raise RuntimeError(
                "the scheduler is built when the transformation is applied (the sizes may "
                "come from the data set): call dataset.apply(schedule) first"
            )
        return self._streams[0]

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def rank(self) -> int:
        """The first replica this pipeline serves (the only one without ``input_context``)."""
        return self.ranks[0]

    @property
    def sizes(self) -> np.ndarray | None:
        """The validated per-example sizes, once the transformation has been applied."""
        return self.stream.scheduler.sizes if self._streams else None

    @property
    def steps_per_epoch(self) -> int:
        """Steps of an epoch (equal on every replica, and in every epoch without
        ``packing``); with ``x=``/``y=``, the elements of every iteration of the output.
        Needs the transformation applied."""
        return self.stream.scheduler.num_steps(self.first_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration of the output at ``epoch``, step 0 (and hold ``epochs``
        epochs from there), forgetting a position given by ``set_state``."""
        self.first_epoch = check_int("epoch", epoch, 0)
        self._start = None
        self._selected = True
        for stream in self._streams:
            stream.rewind(self.first_epoch)

    def _next_iteration(self) -> tuple[int, int, int]:
        """``(epoch, first step, steps)`` of the next iteration's first epoch: where
        ``set_epoch`` or ``set_state`` starts it, and the steps of that epoch's plan (of its
        remainder after an elastic ``set_state``). For ``chronica.tf.ScheduleCallback``."""
        lead = self.stream
        if self._start is None:
            return self.first_epoch, 0, self.stream.scheduler.num_steps(self.first_epoch)
        lead.load_state(self._start)
        return lead.epoch, lead.step, lead.num_steps

    def get_state(self, delivered: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Resumable position, the common state of every adapter (see
        ``chronica.runtime.RankStream.state``).

        ``delivered``: the last element the training loop took from the output (or a dict
        of its ``"epoch"`` and ``"step"``; tensors, numpy values, ints or the distributed
        values of ``strategy.distribute_datasets_from_function`` are all fine): the state
        then resumes exactly at the batch after it, whatever ``tf.data`` prefetched.
        Without it: the position after the last batch the pipeline produced, which runs
        ahead of training by the prefetched batches."""
        stream = self.stream
        if delivered is None:
            return stream.state()
        if not isinstance(delivered, Mapping) or not {_EPOCH, _STEP} <= set(delivered):
            raise ValueError(
                "delivered= must be an element of this pipeline's output (a dict with "
                "'epoch' and 'step'), the last one the training loop took"
            )
        epoch, step = _scalar(_EPOCH, delivered[_EPOCH]), _scalar(_STEP, delivered[_STEP])
        start = self._epoch_starts.get(epoch)
        if start is None or not start["step"] <= step:
            raise ValueError(
                f"delivered= is epoch {epoch} step {step}, not a batch of this pipeline's "
                f"current iteration"
            )
        if self.config.packing is None:
            return {**copy.deepcopy(start), "step": step + 1, "offset": 0}
        if not {_MICRO, _NUM_MICRO} <= set(delivered):
            raise ValueError(
                "with packing= delivered= must be a packed micro-batch of this pipeline's "
                "output (a dict with 'epoch', 'step', 'micro' and 'num_micro')"
            )
        micro = _scalar(_MICRO, delivered[_MICRO]) + 1
        if micro < _scalar(_NUM_MICRO, delivered[_NUM_MICRO]):
            return {**copy.deepcopy(start), "step": step, "offset": micro}
        return {**copy.deepcopy(start), "step": step + 1, "offset": 0}

    def set_state(self, state: Any) -> None:
        """Make every following iteration of the output continue from ``state``
        (``get_state`` of any rank, from any adapter), exactly where it stopped at the same
        world and global batch size, or with the epoch's remaining samples at another
        (elastic resume, ``chronica.runtime.RankStream.load_state``); the output then ends
        where it would have (``epoch + epochs``). Before the transformation is applied the
        state is kept and checked when it is."""
        for stream in self._streams:
            stream.load_state(state)
        self._start = copy.deepcopy(state)
        self._selected = True

    def report(self, seconds: float, step: int | None = None, epoch: int | None = None) -> None:
        """Tell the dynamic scheduler this replica's own compute time for a step: forward
        and backward, *before* waiting for the gradient all-reduce. ``step`` and ``epoch``
        default to the batch after the one reported last, in the order the training loop
        took them (not what ``tf.data`` prefetched). Without ``kind="dynamic"`` this does
        nothing."""
        stream = self.stream
        if stream.session is None:
            return
        if step is None:
            if not self._unreported:
                return
            epoch, step = self._unreported.popleft()
        stream.report(seconds, step, epoch)

    def close(self) -> None:
        """Release the coordinator connection (and, on the first rank, stop the
        coordinator). Idempotent; also done at interpreter exit."""
        for stream in self._streams:
            stream.close()

    # -- applying --------------------------------------------------------------------------

    def _prepare(self, dataset: tf.data.Dataset) -> _Store:
        if self._store is not None and self._source is dataset:
            return self._store
        given = self._given_sizes
        packed = self.config.packing is not None
        store = _Store(
            dataset,
            self._size_fn,
            None if given is None else len(given),
            self.token_field if packed else None,
        )
        if self.keras is not None:
            available = store.output_names(padded=True)
            named = [
                n for names in self.keras for n in ((names,) if isinstance(names, str) else names)
            ]
            missing = [n for n in named if n not in available]
            if missing:
                raise ValueError(
                    f"x=/y= name {missing}, which the output lacks; its features are {available}"
                )
        raw = store.sizes if store.sizes is not None else self._given_sizes
        sizes = validate_sizes(
            raw,
            expected_len=store.num_examples,
            name="sizes" if store.sizes is None else "size_fn results",
        )
        if packed:
            check_document_lengths(store.lengths, sizes)
        self.close()
        first = open_stream(
            sizes,
            self.config,
            self.ranks[0],
            labels=self._labels,
            partitions=self._partitions,
            dynamic=self.dynamic_options,
            agree=key_value_agreement(
                self.ranks[0],
                (self.dynamic_options or DynamicOptions()).timeout,
                _coordination_store,
            ),
            names=_NAMES,
        )
        others = [RankStream(first.scheduler, r, names=_NAMES) for r in self.ranks[1:]]
        self._streams = [first, *others]
        self._source, self._store = dataset, store
        for stream in self._streams:
            stream.rewind(self.first_epoch)
        if self._start is not None:
            self.set_state(self._start)
        return store

    def _epochs(self) -> Iterator[int]:
        """Starts one iteration of the output (at ``set_state``'s position, else at
        ``epoch``) and yields every epoch it holds, its streams selected."""
        streams, lead = self._streams, self._streams[0]
        if self._start is not None:
            for stream in streams:
                stream.load_state(self._start)
        else:
            for stream in streams:
                stream.rewind(self.first_epoch)
        if not self._selected:
            self._repeated()
        self._selected = False
        self._unreported.clear()
        self._epoch_starts.clear()
        end = None if self.epochs is None else self.first_epoch + self.epochs
        epoch = lead.epoch
        if self.keras is not None:
            end = epoch + 1  # one epoch per iteration, the one selected
        while end is None or epoch < end:
            for stream in streams:
                stream.set_epoch(epoch)
            self._epoch_starts[epoch] = lead.state()
            self._epoch_starts.pop(epoch - _KEPT_EPOCHS, None)
            yield epoch
            epoch += 1

    def _repeated(self) -> None:
        """An iteration starts with no epoch selected since the previous one."""
        what = (
            "the output of chronica.tf.schedule is iterated again without set_epoch or "
            "set_state since its last iteration, so it repeats the same epochs"
        )
        if self.keras is None:
            logger.warning("chronica: %s; call schedule.set_epoch(epoch) before each", what)
            return
        raise ValueError(
            f"{what}. Keras's model.fit iterates its data once per epoch (and once more "
            f"before training, to build the model): pass "
            f"callbacks=[chronica.tf.ScheduleCallback(schedule)] to model.fit, which selects "
            f"every epoch, and no steps_per_epoch (the data set tells Keras its length); in "
            f"a loop of your own call schedule.set_epoch(epoch) before every epoch"
        )

    def _batches(self) -> Iterator[_Row]:
        """``(epoch, step, indices, loss_weight, padded lengths)`` of every batch of one
        iteration, the served replicas' batches of a step one after another; the padded
        lengths are the step's longest example over every replica, per variable-length
        feature (zeros with ``padded=False``)."""
        streams, lead = self._streams, self._streams[0]
        assert self._store is not None
        lengths = self._store.feature_lengths
        for _ in self._epochs():
            # The plan of every replica's step (for kind="dynamic" the static plan, whose
            # steps hold the same samples): every replica pads to the same length.
            if self.padded and lengths.shape[1]:
                longest = step_longest(lead.plan(), lengths)
            else:
                longest = np.zeros((lead.num_steps, lengths.shape[1]), dtype=np.int64)
            parts: tuple[LocalBatch, ...]
            for parts in zip(*(stream.batches() for stream in streams), strict=True):
                for part in parts:
                    if lead.session is not None:
                        self._unreported.append((part.epoch, part.step))
                    yield part.epoch, part.step, part.indices, part.loss_weight, longest[part.step]

    def _micro_batches(self) -> Iterator[tuple[Any, ...]]:
        """Every packed micro-batch of one iteration as a ``_micro_spec`` tuple (where it
        stands, its loss weight and its ``chronica.runtime.rows`` layout: the flat token
        index of every slot, segment ids, positions); the served replicas' micro-batches of
        a step interleaved, micro-batch by micro-batch."""
        packing = self.config.packing
        assert packing is not None and self._store is not None
        streams, lead, splits = self._streams, self._streams[0], self._store.splits
        for _ in self._epochs():
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

    def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """This pipeline's scheduled batches of ``dataset`` (see the class docstring)."""
        if not isinstance(dataset, tf.data.Dataset):
            raise ValueError(f"expected a tf.data.Dataset, got {type(dataset).__name__}")
        store = self._prepare(dataset)
        if self.config.packing is not None:
            # One Python call per micro-batch lays out its rows (chronica.runtime.rows); the
            # tokens are gathered from the in-memory store in the graph.
            micro = tf.data.Dataset.from_generator(
                self._micro_batches, output_signature=_micro_spec(self.config.packing)
            )
            rows = micro.map(
                store.gather_rows(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
            return rows.prefetch(tf.data.AUTOTUNE)
        gather = store.gather(self.padded, self.keras)
        if self.stream.session is not None:
            # Dynamic plans arrive window by window and follow the reports of the batches
            # trained: one step at a time, reading little ahead.
            steps = tf.data.Dataset.from_generator(
                self._batches, output_signature=_step_spec(len(store.varying))
            )
            return steps.map(gather).prefetch(1)
        # Static plans are known per epoch: one Python call per epoch hands tf.data the
        # epoch's whole index table, and the steps are sliced from it in the graph.
        spec = _table_spec(len(store.varying))
        tables = tf.data.Dataset.from_generator(self._epoch_tables, output_signature=spec)
        steps = tables.flat_map(_table_steps)
        batches = steps.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if self.keras is not None:
            # model.fit sizes an epoch by the cardinality: one epoch per iteration.
            batches = batches.apply(tf.data.experimental.assert_cardinality(self.steps_per_epoch))
        return batches.prefetch(tf.data.AUTOTUNE)

    def _epoch_tables(self) -> Iterator[tuple[np.ndarray, ...]]:
        """``_batches`` grouped by epoch: (epochs, steps, flat indices, row lengths,
        weights, padded lengths) of each epoch's batches. With ``x=``/``y=`` an iteration
        is one epoch of ``steps_per_epoch`` elements: a resumed epoch's missing steps come
        last as empty elements (step -1), which ``ScheduleCallback`` never lets Keras
        train."""
        rows: list[_Row] = []
        for row in self._batches():
            if rows and rows[0][0] != row[0]:
                yield _table(rows)
                rows = []
            rows.append(row)
        if self.keras is not None:
            epoch, steps = self.stream.epoch, self.steps_per_epoch
            if len(rows) > steps:
                raise ValueError(
                    f"the resumed epoch {epoch} has {len(rows)} steps left at this world and "
                    f"global batch size, more than an epoch's {steps}, which model.fit cannot "
                    f"run as one epoch: resume it at its former global batch size"
                )
            empty = np.zeros(0, dtype=np.int64)
            assert self._store is not None
            pads = np.zeros(len(self._store.varying), dtype=np.int64)
            rows += [(epoch, -1, empty, 0.0, pads)] * (steps - len(rows))
        if rows:
            yield _table(rows)


def _step_spec(varying: int) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one ``_Row`` (``varying`` variable-length features)."""
    return (
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([], tf.float32),
        tf.TensorSpec([varying], tf.int64),
    )


def _table_spec(varying: int) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one epoch's ``_table``."""
    return (
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([None, varying], tf.int64),
    )


def _micro_spec(packing: Packing) -> tuple[tf.TensorSpec, ...]:
    """The generator's signature of one packed micro-batch (see ``_micro_batches``)."""
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


def _table(rows: list[_Row]) -> tuple[np.ndarray, ...]:
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


schedule = Schedule
