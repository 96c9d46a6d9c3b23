"""``tf.data`` face of chronica: ``dataset.apply(schedule(...))``.

``schedule`` returns a :class:`Schedule`, a callable that turns a finite data set of examples
into this rank's (or this input pipeline's) balanced local batches, step after step, epoch
after epoch. It is a face of ``chronica.runtime.RankStream``, as the PyTorch samplers are:
for equal sizes and arguments every adapter yields the same indices at every (epoch, step,
rank), and a state saved by one adapter resumes in any other.

This module holds the schedule: its arguments, the world of a ``tf.distribute.InputContext``,
the streams of the replicas it serves, their epochs and positions. Beside it: the examples
in memory and the gathers (``store``), rows and ``tf.data`` plumbing (``pipeline``), the
state after a delivered element (``delivered``), Keras's elements (``keras_output``; ``fit``
holds the callback), and ``kind="dynamic"``'s vote over TensorFlow's coordination service.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf import pipeline
from chronica.adapters.tf.coordination import coordination_store
from chronica.adapters.tf.delivered import state_after
from chronica.adapters.tf.keras_output import KerasOutput
from chronica.adapters.tf.store import ExampleStore, Row
from chronica.core import ScheduleConfig, validate_sizes
from chronica.core.checks import check_bool, check_int
from chronica.runtime import DynamicOptions, RankStream
from chronica.runtime.agreement import key_value_agreement
from chronica.runtime.face import StreamFace
from chronica.runtime.request import open_stream, plan_face, plan_request
from chronica.runtime.rows import TOKENS, check_document_lengths
from chronica.runtime.stream import state_format

__all__ = ["Schedule", "schedule"]

logger = logging.getLogger("chronica")

_NAMES = state_format("schedule")
_KEPT_EPOCHS = 64  # epochs whose start a delivered batch may still refer to


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
      ``(x, y, sample_weight)`` that ``chronica.adapters.tf.keras_output.KerasOutput``
      describes (the loss weight on every row: Keras's loss is then the mean over the step's
      global batch), and every iteration is exactly one epoch of ``steps_per_epoch``
      elements (its cardinality): the epoch ``set_epoch`` selected, or the rest of the one
      ``set_state`` left, padded with empty elements ``chronica.tf.ScheduleCallback`` never
      lets Keras train. Iterating it again without ``set_epoch``/``set_state`` in between
      raises an error naming the fix, as ``fit`` would otherwise repeat one epoch;
    * sizes (``sizes`` or ``size_fn``) are read once, when the transformation is first
      applied, and cached: ``size_fn`` is called exactly once per example;
    * with ``packing=`` (a ``chronica.core.packing.Packing``; sizes are then document
      lengths in tokens) each element is one packed micro-batch instead, every element of
      the same static shapes, as ``chronica.adapters.tf.store.ExampleStore.gather_rows``
      describes (``"tokens"``, ``"segment_ids"`` and ``"positions"`` laid out by
      ``chronica.runtime.rows``, a dict example's other features packed alike,
      ``"loss_weight"``, ``"epoch"``, ``"step"``, ``"micro"``, ``"num_micro"``). Every rank
      yields ``num_micro`` of them at every step, and those of step ``s`` hold exactly this
      rank's part of ``plan(e).micro``, each token of each piece once.

    The scheduler is built when the transformation is first applied (the sizes may come from
    the data set), so ``plan``, ``stats``, ``get_state`` and the other stream calls raise
    ``RuntimeError`` before. Applying the same ``Schedule`` to the same data set object again
    reuses that pass; applying it to another data set reads that one afresh. Every iteration
    of the output starts at ``epoch`` (``set_epoch`` changes it) or at the position of the
    last ``set_state`` (a static output's cardinality is its steps; a ``set_state`` that
    changes them needs the schedule applied again); iterate one output at a time. An
    iteration that starts without ``set_epoch`` or ``set_state`` since the previous one
    repeats its epochs: it logs a warning (an error with ``x=``/``y=``).

    Saving and resuming: ``get_state(delivered=batch)`` is the exact position after the
    last element the training loop took, whatever ``tf.data`` prefetched; ``set_state``
    (before applying or iterating) continues from a state saved by any adapter, at this or
    another world size or global batch size. With ``packing=`` positions count micro-batches.

    Args (``chronica.tf.schedule`` is this class under the name the docs use:
    ``ds.apply(chronica.tf.schedule(...))``):
        sizes: one non-negative number per example (tokens, frames); or give ``size_fn``.
        size_fn: called once per example (numpy values, as ``as_numpy_iterator`` yields
            them) when first applied, returning its size; exactly one of the two is required.
        global_batch_size: examples per step over all replicas, a multiple of the replica
            count (required unless ``config`` holds it).
        num_replicas: the world size (replicas); required unless ``input_context`` is given.
        rank: this process's replica, in ``[0, num_replicas)``; given with ``num_replicas``.
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
        x: Keras's inputs, given with ``y``: an output feature's name (e.g. ``"tokens"``,
            ``"tokens_mask"``; ``"x"`` for non-dict examples) or a list of names (a dict);
            see above. Needs ``padded=True``, one epoch per iteration (``epochs=1``, the
            default), one replica per input pipeline, and a static kind without ``packing``.
        y: Keras's targets, given with ``x``, named the same way (e.g. ``"label"``).
        epoch: the first epoch of every iteration until ``set_epoch``/``set_state``.
        options: the plan options below (``packing=`` cuts every step into packed
            micro-batches, see above).

    Raises ``TypeError`` for an argument of the wrong type (a ``size_fn`` that is not a
    function, ``x``/``y`` that are not names; when applied, anything but a
    ``tf.data.Dataset``) and ``ValueError`` for missing or doubled sizes, a bad argument
    value, and (when applied) an infinite data set or sizes of the wrong length.

    Example::

        >>> schedule = chronica.tf.schedule(
        ...     lengths, global_batch_size=32, num_replicas=2, rank=0, epochs=2
        ... )
        >>> schedule  # its configuration
        chronica.tf.Schedule(ranks=[0], num_replicas=2, global_batch_size=32, ...)
        >>> for batch in dataset.apply(schedule):
        ...     loss = model_loss(batch) * batch["loss_weight"]
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
        self._store: ExampleStore | None = None
        self._streams: list[RankStream] = []
        self._start: dict[str, Any] | None = None  # where every iteration begins (set_state)
        self._cardinality: int | None = None  # elements of every iteration of a static output
        self._epoch_starts: dict[int, dict[str, Any]] = {}  # state at each produced epoch's start
        self._unreported: deque[tuple[int, int]] = deque(maxlen=1 << 16)
        # Whether the next iteration was selected (set_epoch, set_state, or none yet): an
        # iteration without a selection repeats the previous one's epochs.
        self._selected = True

    def _keras_output(
        self, x: Any, y: Any, padded: Any, epochs: Any, served: int
    ) -> KerasOutput | None:
        """The validated ``x=``/``y=`` of Keras's elements, or ``None`` without them."""
        return KerasOutput.of(
            x,
            y,
            packed=self.config.packing is not None,
            padded=padded,
            dynamic=self.config.mode.opens_session,
            epochs=epochs,
            served=served,
        )

    def __repr__(self) -> str:
        keras = "" if self.keras is None else f", x={self.keras.x!r}, y={self.keras.y!r}"
        return (
            f"chronica.tf.Schedule(ranks={self.ranks}, num_replicas={self.num_replicas}, "
            f"global_batch_size={self.global_batch_size}, kind={str(self.config.kind)!r}, "
            f"padded={self.padded}, epochs={self.epochs}, epoch={self.first_epoch}, "
            f"packing={self.config.packing!r}{keras}, applied={self._store is not None})"
        )

    # -- the stream, once applied ------------------------------------------------------------

    @property
    def stream(self) -> RankStream:  # type: ignore[override]
        """The ``RankStream`` of this pipeline's (first) replica, built when first applied;
        ``RuntimeError`` before (e.g. ``dataset.apply(schedule); schedule.stream.epoch``)."""
        if not self._streams:
            raise RuntimeError(
                "the scheduler is built when the transformation is applied (the sizes may "
                "come from the data set): call dataset.apply(schedule) first"
            )
        return self._streams[0]

    @property
    def num_replicas(self) -> int:
        """The world size, known before applying (e.g. ``schedule.num_replicas == 2``)."""
        return self.config.num_replicas

    @property
    def rank(self) -> int:
        """The first replica this pipeline serves (the only one without ``input_context``;
        ``schedule.ranks`` lists them all), e.g. ``schedule.rank == 0``."""
        return self.ranks[0]

    @property
    def sizes(self) -> np.ndarray | None:
        """The validated per-example sizes once the transformation has been applied (from
        ``size_fn`` too), else ``None``: e.g. ``dataset.apply(schedule); schedule.sizes``."""
        return self.stream.scheduler.sizes if self._streams else None

    @property
    def steps_per_epoch(self) -> int:
        """Steps of an epoch (equal on every replica, and in every epoch without
        ``packing``); with ``x=``/``y=``, the elements of every iteration of the output.
        Needs the transformation applied: e.g. ``model.fit(data, steps_per_epoch=None)``
        runs ``schedule.steps_per_epoch`` steps an epoch."""
        return self.stream.scheduler.num_steps(self.first_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration of the output at ``epoch``, step 0 (and hold ``epochs``
        epochs from there), forgetting a position given by ``set_state``.

        Args:
            epoch: the epoch to start at, an int >= 0.

        Example::

            >>> for epoch in range(3):
            ...     schedule.set_epoch(epoch)
            ...     for batch in batches:
            ...         train(batch)
        """
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

        Args:
            delivered: the last element the training loop took from the output (or a dict
                of its ``"epoch"`` and ``"step"``; tensors, numpy values, ints or the
                distributed values of ``strategy.distribute_datasets_from_function`` are
                all fine): the state then resumes exactly at the batch after it, whatever
                ``tf.data`` prefetched. ``None``: the position after the last batch the
                pipeline produced, which runs ahead of training by the prefetched batches.

        Raises ``TypeError`` when ``delivered`` is not a dict, ``ValueError`` when it is
        not an element of this pipeline's current iteration.

        Example::

            >>> for batch in batches:
            ...     train(batch)
            ...     state = schedule.get_state(delivered=batch)
        """
        if delivered is None:
            return self.stream.state()
        return state_after(delivered, self._epoch_starts, self.config.packing is not None)

    def set_state(self, state: Any) -> None:
        """Make every following iteration of the output continue from ``state``
        (``get_state`` of any rank, from any adapter), exactly where it stopped at the same
        world and global batch size, or with the epoch's remaining samples at another
        (elastic resume, ``chronica.runtime.RankStream.load_state``); the output then ends
        where it would have (``epoch + epochs``). Before the transformation is applied the
        state is kept and checked when it is.

        Args:
            state: a dict ``get_state`` returned (here or in any adapter).

        Example::

            >>> schedule.set_state(json.loads(saved))
            >>> for batch in dataset.apply(schedule):  # continues after the saved batch
            ...     train(batch)
        """
        for stream in self._streams:
            stream.load_state(state)
        self._start = copy.deepcopy(state)
        self._selected = True
        if self._cardinality is not None and self._iteration_steps() != self._cardinality:
            raise ValueError(
                f"the output applied before this set_state has {self._cardinality} elements "
                f"(its cardinality), and from this state an iteration has "
                f"{self._iteration_steps()}; apply the schedule again after set_state "
                "(dataset.apply(schedule)), or call set_state before applying it"
            )

    def report(self, seconds: float, step: int | None = None, epoch: int | None = None) -> None:
        """Tell the dynamic scheduler this replica's own compute time for a step: forward
        and backward, *before* waiting for the gradient all-reduce. ``step`` and ``epoch``
        default to the batch after the one reported last, in the order the training loop
        took them (not what ``tf.data`` prefetched). Without ``kind="dynamic"`` this does
        nothing.

        Args:
            seconds: the step's compute time on this replica, > 0.
            step: the step reported; ``None``: the next one not yet reported.
            epoch: the step's epoch; ``None``: that of the next one not yet reported.

        Example::

            >>> start = time.perf_counter()
            >>> loss = train_step(batch)  # forward and backward
            >>> schedule.report(time.perf_counter() - start)
        """
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
        coordinator). Idempotent; also done at interpreter exit: e.g. ``schedule.close()``
        after training with ``kind="dynamic"``."""
        for stream in self._streams:
            stream.close()

    # -- applying --------------------------------------------------------------------------

    def _prepare(self, dataset: tf.data.Dataset) -> ExampleStore:
        if self._store is not None and self._source is dataset:
            return self._store
        given = self._given_sizes
        packed = self.config.packing is not None
        store = ExampleStore(
            dataset,
            self._size_fn,
            None if given is None else len(given),
            self.token_field if packed else None,
        )
        if self.keras is not None:
            self.keras.check_features(store.output_names(padded=True))
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
                coordination_store,
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
        raise self.keras.repeated(what)

    def _batches(self) -> Iterator[Row]:
        """Every ``Row`` of one iteration (``epoch_rows`` of each epoch); with
        ``kind="dynamic"`` each is queued for ``report``."""
        assert self._store is not None
        streams, lengths = self._streams, self._store.feature_lengths
        for _ in self._epochs():
            for row in pipeline.epoch_rows(streams, lengths, self.padded):
                if streams[0].session is not None:
                    self._unreported.append((row[0], row[1]))
                yield row

    def _micro_batches(self) -> Iterator[tuple[Any, ...]]:
        """Every packed micro-batch of one iteration (``epoch_micro_batches`` of each)."""
        packing = self.config.packing
        assert packing is not None and self._store is not None
        for _ in self._epochs():
            yield from pipeline.epoch_micro_batches(self._streams, packing, self._store.splits)

    def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """This pipeline's scheduled batches of ``dataset`` (see the class docstring).

        Args:
            dataset: the finite ``tf.data.Dataset`` of examples, read once here (again
                only when another data set object is given).

        Raises ``TypeError`` when ``dataset`` is not a ``tf.data.Dataset`` and
        ``ValueError`` for an infinite data set or sizes of the wrong length.

        Example::

            >>> batches = dataset.apply(schedule)  # the same as schedule(dataset)
        """
        self._cardinality = None
        store = self._prepare(dataset)
        if self.config.packing is not None:
            # One Python call per micro-batch lays out its rows (chronica.runtime.rows); the
            # tokens are gathered from the in-memory store in the graph.
            micro = pipeline.packed_steps(self._micro_batches, self.config.packing)
            rows = micro.map(
                store.gather_rows(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
            return rows.prefetch(tf.data.AUTOTUNE)
        gather = store.gather(self.padded, self.keras)
        if self.stream.session is not None:
            # Dynamic plans arrive window by window and follow the reports of the batches
            # trained: one step at a time, reading little ahead.
            return pipeline.dynamic_steps(self._batches, len(store.varying)).map(gather).prefetch(1)
        # Static plans are known per epoch: one Python call per epoch hands tf.data the
        # epoch's whole index table, and the steps are sliced from it in the graph.
        steps = pipeline.static_steps(self._epoch_tables, len(store.varying))
        batches = steps.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if self.keras is not None:
            # model.fit sizes an epoch by the cardinality: one epoch per iteration.
            batches = batches.apply(tf.data.experimental.assert_cardinality(self.steps_per_epoch))
        elif self.epochs is not None:
            # The plan knows every iteration's steps: len() and Keras can size the output.
            self._cardinality = self._iteration_steps()
            batches = batches.apply(tf.data.experimental.assert_cardinality(self._cardinality))
        return batches.prefetch(tf.data.AUTOTUNE)

    def _iteration_steps(self) -> int:
        """Elements (per replica and step) of every iteration of a static output."""
        assert self.epochs is not None
        epoch, step, steps = self._next_iteration()
        later = range(epoch + 1, self.first_epoch + self.epochs)
        steps += sum(self.stream.scheduler.num_steps(e) for e in later)
        return (steps - step) * len(self._streams)

    def _epoch_tables(self) -> Iterator[tuple[np.ndarray, ...]]:
        """``_batches`` grouped by epoch, one ``epoch_table`` each. With ``x=``/``y=`` an
        iteration is one epoch of ``steps_per_epoch`` elements (``KerasOutput.whole_epoch``)."""
        rows: list[Row] = []
        for row in self._batches():
            if rows and rows[0][0] != row[0]:
                yield pipeline.epoch_table(rows)
                rows = []
            rows.append(row)
        if self.keras is not None:
            assert self._store is not None
            varying = len(self._store.varying)
            rows = self.keras.whole_epoch(rows, self.stream.epoch, self.steps_per_epoch, varying)
        if rows:
            yield pipeline.epoch_table(rows)


schedule = Schedule
