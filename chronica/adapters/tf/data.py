"""``tf.data`` face of chronica: ``dataset.apply(schedule(...))``.

``schedule`` returns a :class:`Schedule`, a callable that turns a finite data set of examples
into this rank's (or this input pipeline's) balanced local batches, step after step, epoch
after epoch. Plans are built exactly as the PyTorch samplers build them, so for equal sizes
and arguments every adapter yields the same indices at every (epoch, step, rank).

This release keeps the examples in memory: the input data set is iterated once (in Python,
eagerly) when the transformation is first applied, every feature is stored as one dense or
ragged tensor, and each step's local batch is a ``tf.gather`` of the plan's indices. Sizes
(from ``sizes`` or ``size_fn``) are read in that same single pass and cached on the
:class:`Schedule`; they are never recomputed per epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.core import (
    ScheduleConfig,
    Scheduler,
    validate_sizes,
)
from chronica.core.plan import EpochPlan

__all__ = ["Schedule", "schedule"]

_SINGLE_KEY = "x"
_LOSS_WEIGHT = "loss_weight"


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class _Store:
    """Every example of the data set, one dense or ragged tensor per feature."""

    def __init__(self, dataset: tf.data.Dataset, size_fn: Callable[[Any], Any] | None) -> None:
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
            raise TypeError(
                f"chronica.tf.schedule needs examples that are a tensor or a flat dict of "
                f"tensors, got element_spec {spec!r}; map tuples to a dict first, e.g. "
                f"dataset.map(lambda x, y: {{'x': x, 'y': y}})"
            )
        for key, s in zip(self.keys, specs, strict=True):
            if not isinstance(s, tf.TensorSpec):
                raise TypeError(
                    f"feature {key!r} has spec {s!r}; every feature must be a plain tensor "
                    f"(variable-length 1-D features are fine, ragged/sparse inputs are not)"
                )
            if self.is_dict and key == _LOSS_WEIGHT:
                raise ValueError(f"feature name {_LOSS_WEIGHT!r} is reserved by chronica")
        cardinality = int(dataset.cardinality())
        if cardinality == int(tf.data.INFINITE_CARDINALITY):
            raise ValueError(
                "the data set is infinite (e.g. it ends in .repeat()); apply "
                "chronica.tf.schedule to the finite data set and pass epochs= instead of "
                "repeating"
            )
        columns: list[list[np.ndarray]] = [[] for _ in self.keys]
        sizes: list[Any] = []
        for element in dataset.as_numpy_iterator():
            values = [element[k] for k in self.keys] if self.is_dict else [element]
            for column, value in zip(columns, values, strict=True):
                column.append(np.asarray(value))
            if size_fn is not None:
                sizes.append(size_fn(element))
        self.num_examples = len(columns[0])
        self.sizes = sizes if size_fn is not None else None
        self.ragged: dict[str, bool] = {}
        self.tensors: dict[str, tf.Tensor | tf.RaggedTensor] = {}
        for key, s, column in zip(self.keys, specs, columns, strict=True):
            self.tensors[key], self.ragged[key] = self._to_tensor(key, s, column)

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


class Schedule:
    """The transformation ``chronica.tf.schedule`` returns; apply it with ``dataset.apply``.

    Guarantees, for a finite data set of ``N`` examples:

    * the output yields this pipeline's local batches in plan order, one epoch after
      another (``epochs`` of them, from ``epoch``); every rank gets the same number of
      steps, and batch ``s`` of epoch ``e`` holds exactly the examples
      ``Scheduler(sizes, config).plan_epoch(e).local(s, rank)``, in that order (the same
      indices ``chronica.torch``'s ``DistributedBatchSampler`` yields);
    * over all ranks, every example appears exactly once per epoch, apart from the padding
      (``drop_last=False``: repeats so every rank has as many) or dropping
      (``drop_last=True``) that torch's ``DistributedSampler`` also does;
    * each output element is a dict: the input's features (a non-dict input becomes the
      feature ``"x"``), batched; a ``"loss_weight"`` float32 scalar (multiply the local mean
      loss by it; all ones in exact mode); with ``padded=True`` every variable-length feature
      ``k`` is zero-padded to the batch's longest example and comes with ``k + "_length"``
      (int64, ``(batch,)``) and ``k + "_mask"`` (bool, ``(batch, max_len)``); with
      ``padded=False`` it stays a ``tf.RaggedTensor``;
    * sizes (``sizes`` or ``size_fn``) are read once, when the transformation is first
      applied, and cached: ``size_fn`` is called exactly once per example.

    The examples are held in memory (one pass over the input when first applied). Applying
    the same ``Schedule`` to the same data set object again reuses that pass; applying it to
    another data set reads that one (and its sizes) afresh.
    """

    def __init__(
        self,
        sizes: Any,
        size_fn: Callable[[Any], Any] | None,
        *,
        global_batch_size: int,
        num_replicas: int | None,
        rank: int | None,
        kind: str,
        exact: bool,
        shuffle: Any,
        seed: int,
        drop_last: bool,
        cost: Any,
        padded: bool,
        epochs: int | None,
        epoch: int,
        input_context: tf.distribute.InputContext | None,
    ) -> None:
        if (sizes is None) == (size_fn is None):
            raise ValueError(
                "pass exactly one of sizes= (one number per example) or size_fn= (a function "
                "of an example returning its size, e.g. lambda ex: len(ex['tokens']))"
                + ("; both were given" if sizes is not None else "; neither was given")
            )
        if size_fn is not None and not callable(size_fn):
            raise TypeError(f"size_fn must be callable, got {type(size_fn).__name__}")
        self.global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
        if input_context is not None:
            if num_replicas is not None or rank is not None:
                raise ValueError("pass either input_context or num_replicas/rank, not both")
            world = int(input_context.num_replicas_in_sync)
            pipelines = int(input_context.num_input_pipelines)
            if world % pipelines:
                raise ValueError(
                    f"{world} replicas cannot be split evenly over {pipelines} input pipelines"
                )
            per_pipeline = world // pipelines
            first = int(input_context.input_pipeline_id) * per_pipeline
            self.ranks = list(range(first, first + per_pipeline))
            self.num_replicas = world
        else:
            if num_replicas is None or rank is None:
                raise ValueError(
                    "num_replicas and rank are required without input_context; pass both, or "
                    "call schedule(..., input_context=ctx) inside the dataset_fn given to "
                    "strategy.distribute_datasets_from_function"
                )
            self.num_replicas = _check_int("num_replicas", num_replicas, 1)
            rank = _check_int("rank", rank, 0)
            if rank >= self.num_replicas:
                raise ValueError(f"rank={rank} must be in [0, {self.num_replicas - 1}]")
            self.ranks = [rank]
        if self.global_batch_size % self.num_replicas:
            raise ValueError(
                f"global_batch_size={global_batch_size} must be a multiple of the number of "
                f"replicas ({self.num_replicas}); every replica gets global_batch_size // "
                f"{self.num_replicas} examples per step"
            )
        self.epochs = 1 if epochs is None else _check_int("epochs", epochs, 1)
        self.epoch = _check_int("epoch", epoch, 0)
        self.padded = bool(padded)
        if kind == "dynamic":
            raise ValueError(
                "kind='dynamic' is not available for tf.data yet: the pipeline is planned "
                "ahead of training and takes no per-step timing back; use kind='static' "
                "(balanced by predicted cost) or 'guided', or chronica's torch samplers for "
                "dynamic re-balancing"
            )
        self.config = ScheduleConfig(
            num_replicas=self.num_replicas,
            batch_size=self.global_batch_size,
            kind=kind,
            exact=exact,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            cost=cost,
        )
        self._given_sizes = sizes
        self._size_fn = size_fn
        self._source: tf.data.Dataset | None = None
        self._store: _Store | None = None
        self.scheduler: Scheduler | None = None

    @property
    def rank(self) -> int:
        """The first rank this pipeline serves (the only one with explicit ``rank``)."""
        return self.ranks[0]

    @property
    def sizes(self) -> np.ndarray | None:
        """The validated per-example sizes, once the transformation has been applied."""
        return None if self.scheduler is None else self.scheduler.sizes

    def plan(self, epoch: int) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``; available once applied."""
        if self.scheduler is None:
            raise RuntimeError("apply the transformation to a data set first")
        return self.scheduler.plan_epoch(epoch)

    def _prepare(self, dataset: tf.data.Dataset) -> _Store:
        if self._store is not None and self._source is dataset:
            return self._store
        store = _Store(dataset, self._size_fn)
        raw = store.sizes if store.sizes is not None else self._given_sizes
        sizes = validate_sizes(
            raw,
            expected_len=store.num_examples,
            name="sizes" if store.sizes is None else "size_fn results",
        )
        self.scheduler = Scheduler(sizes, self.config, labels=None, partitions=None)
        self._source, self._store = dataset, store
        return store

    def _index_rows(self) -> tuple[tf.RaggedTensor, np.ndarray]:
        rows: list[np.ndarray] = []
        weights: list[float] = []
        for e in range(self.epoch, self.epoch + self.epochs):
            plan = self.plan(e)
            lw = plan.loss_weights
            for step in range(plan.num_steps):
                for r in self.ranks:
                    rows.append(plan.local(step, r))
                    weights.append(float(lw[step, r]))
        lengths = np.array([len(x) for x in rows], dtype=np.int64)
        flat = np.concatenate(rows) if rows else np.empty(0, np.int64)
        indices = tf.RaggedTensor.from_row_lengths(tf.constant(flat, tf.int64), lengths)
        return indices, np.asarray(weights, dtype=np.float32)

    def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """This pipeline's scheduled batches of ``dataset`` (see the class docstring)."""
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"expected a tf.data.Dataset, got {type(dataset).__name__}")
        store = self._prepare(dataset)
        indices, weights = self._index_rows()
        tensors = dict(store.tensors)
        ragged = dict(store.ragged)
        padded = self.padded

        def gather(index: tf.Tensor, weight: tf.Tensor) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, table in tensors.items():
                batch = tf.gather(table, index)
                if ragged[key] and padded:
                    lengths = batch.row_lengths()
                    dense = batch.to_tensor()
                    out[key] = dense
                    out[key + "_length"] = lengths
                    out[key + "_mask"] = tf.sequence_mask(lengths, maxlen=tf.shape(dense)[1])
                else:
                    out[key] = batch
            out[_LOSS_WEIGHT] = weight
            return out

        steps = tf.data.Dataset.from_tensor_slices((indices, weights))
        batches = steps.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return batches.prefetch(tf.data.AUTOTUNE)


def schedule(
    sizes: Any = None,
    size_fn: Callable[[Any], Any] | None = None,
    *,
    global_batch_size: int,
    num_replicas: int | None = None,
    rank: int | None = None,
    kind: str = "static",
    exact: bool = True,
    shuffle: Any = True,
    seed: int = 0,
    drop_last: bool = False,
    cost: Any = None,
    padded: bool = True,
    epochs: int | None = None,
    epoch: int = 0,
    input_context: tf.distribute.InputContext | None = None,
) -> Schedule:
    """A ``tf.data`` transformation yielding balanced local batches: ``ds.apply(schedule(...))``.

    Args:
        sizes: one non-negative number per example (tokens, frames); or give ``size_fn``.
        size_fn: called once per example (numpy values, as ``as_numpy_iterator`` yields
            them) when first applied, returning its size; exactly one of the two is required.
        global_batch_size: examples per step over all replicas, a multiple of the replica
            count; each replica's batch is ``global_batch_size // num_replicas``.
        num_replicas, rank: the world size and this process's rank; required unless
            ``input_context`` is given.
        input_context: the ``tf.distribute.InputContext`` handed to the ``dataset_fn`` of
            ``strategy.distribute_datasets_from_function``; the world is
            ``num_replicas_in_sync`` and this pipeline serves its
            ``num_replicas_in_sync // num_input_pipelines`` replicas, interleaving their
            local batches step by step (the order tf.distribute deals them to its devices).
        kind, exact, shuffle, seed, drop_last, cost: as for ``chronica.core.ScheduleConfig``
            (and ``chronica.torch``'s samplers); equal values give identical plans.
        padded: pad variable-length features per batch and add ``_length``/``_mask``
            features (``True``) or keep them ragged (``False``).
        epochs: how many epochs to yield (default 1), starting at ``epoch``.

    Raises ``ValueError`` for missing or doubled sizes, a bad batch size or rank, and (when
    applied) an infinite data set or sizes of the wrong length. See :class:`Schedule` for
    what the output guarantees.
    """
    return Schedule(
        sizes,
        size_fn,
        global_batch_size=global_batch_size,
        num_replicas=num_replicas,
        rank=rank,
        kind=kind,
        exact=exact,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        cost=cost,
        padded=padded,
        epochs=epochs,
        epoch=epoch,
        input_context=input_context,
    )
