"""A scheduled, checkpointable, static-shape batch iterator for JAX.

``iterator(source, global_batch_size=B, ...)`` is a face of a ``chronica.runtime.RankStream``
(the torch samplers' plans, byte for byte, ``kind="dynamic"`` included, and their state
format) that yields this process's local batch for every step, epoch after epoch, as padded
numpy arrays (or ``jax.Array`` with ``as_jax=True``). This module holds only what is JAX's:
device placement, the world from ``jax.distributed`` and the ranks' agreement over its
key-value store; the batches themselves (sample lengths, buckets, padding to static shapes,
packed rows) are ``chronica.runtime.records``'s, shared with the Grain step source
(``chronica.jax.StepSource``). Shapes are static so that ``jax.jit`` compiles a bounded
number of programs (``num_shapes``):

- the batch dimension is ``B // W`` rows (a trailing partial step is padded with rows whose
  ``valid`` is ``False``); with ``variable_batch=True`` it is the smallest power of two that
  holds the local batch, capped at the per-rank maximum (one size for every process when a
  ``sharding`` spans processes);
- the sequence dimension is the smallest bucket boundary that holds the longest sample.

With ``packing=`` (a ``chronica.core.packing.Packing``) it yields micro-batches instead:
every step's micro-batches of this process, each ``rows`` dense rows of ``row_length``
tokens with several documents per row (``tokens``, ``segment_ids``, ``positions``; the
layout is ``chronica.runtime.rows``'s, the same as ``chronica.tf.schedule``'s), one shape
for every micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from chronica.core import ScheduleConfig
from chronica.core.checks import check_int
from chronica.runtime import DynamicOptions, LocalBatch
from chronica.runtime.agreement import KeyValueStore, key_value_agreement
from chronica.runtime.face import StreamFace
from chronica.runtime.records import (
    HOST_KEYS,
    PACKED_HOST_KEYS,
    PackedBatches,
    PaddedBatches,
    random_access,
    record_batches,
)
from chronica.runtime.request import open_stream, plan_face, plan_request
from chronica.runtime.rows import TOKENS
from chronica.runtime.stream import state_format

__all__ = ["ScheduledIterator", "iterator"]

_NAMES = state_format("iterator")


def _jax_world() -> tuple[int, int]:
    return jax.process_count(), jax.process_index()


def _jax_store(world: int) -> KeyValueStore | None:
    """The key-value store of ``jax.distributed``'s coordination service (no device, any
    thread), when this job runs one process per rank of ``world`` under it."""
    if not jax.distributed.is_initialized() or jax.process_count() != world:
        return None
    from jax._src.distributed import global_state

    client = global_state.client
    if client is None:
        return None
    return client.key_value_set, client.blocking_key_value_get, client.key_value_delete


@plan_face
class ScheduledIterator(StreamFace, Iterator[dict[str, Any]]):
    """This process's batches of a chronica plan, with static shapes and resumable state.

    Guarantees:

    - For epoch ``e`` and step ``s`` the batch's real rows are this rank's samples of the
      step, in order: ``Scheduler(sizes, config).plan_epoch(e).local(s, rank)`` for the
      static kinds, the same indices ``chronica.torch``'s ``DistributedBatchSampler`` yields
      for equal arguments; with ``kind="dynamic"``, this rank's part of the coordinator's
      re-split of that step (the step's samples over all ranks are the static plan's).
      Every process runs the same number of steps per epoch; over all ranks every sample
      appears once per epoch (except torch-style padding/dropping, see ``drop_last``).
    - Every batch has ``rows`` rows: ``global_batch_size // num_replicas``; with
      ``variable_batch=True`` the smallest power of two ``>=`` the local batch, capped at
      the per-rank maximum ``rows`` (always ``rows`` with a ``sharding`` spanning several
      processes, so every process contributes the same shape). Rows past the step's real
      samples have ``valid=False``, ``indices=-1``, ``lengths=0``, an all-False ``mask``
      and ``pad_value`` inputs.
    - The sequence axis (axis 1) is padded with ``pad_value`` to the smallest bucket
      boundary ``>=`` the batch's longest sample (with a ``sharding`` spanning several
      processes: the whole step's longest sample over all ranks, known from the plan
      without communication); ``mask[i, t]`` is True exactly for ``t < lengths[i]``.
      Hence at most ``num_shapes`` distinct shapes are yielded.
    - ``get_state()`` / ``set_state()``: the common state of every adapter (a torch
      sampler's state resumes here, and the reverse); see ``set_state``.

    - With ``packing=``: one element per micro-batch. Every process yields the same number
      of micro-batches at every step (``num_micro``); micro-batch ``micro`` of step
      ``step`` holds exactly the documents (pieces) of
      ``plan(e).micro`` for this rank, each piece's tokens once, laid out as
      ``chronica.runtime.rows`` says: ``tokens`` (int32, ``(rows, row_length)`` with
      ``rows = max_tokens // row_length``, ``pad_value`` on padding), ``segment_ids``
      (int32, ``1, 2, ...`` per piece within its row, ``0`` on padding), ``positions``
      (int32, restarting at 0 in every piece, 0 on padding); a dict record's other fields
      are packed the same way under their own names (each must be a per-token sequence).
      Also ``loss_weight`` (float32: multiply the micro-batch's mean loss, per token or
      per document as ``Packing.loss`` says, by it; summing over the step's micro-batches
      and averaging over processes gives the global mean), ``step``, ``micro``,
      ``num_micro`` (ints) and ``indices`` (int64 numpy, the micro-batch's documents, one
      entry per piece). Every micro-batch has the same shapes and dtypes, so a jitted step
      compiles once (``num_shapes`` is 1). ``get_state``/``set_state`` resume at
      micro-batch granularity, mid-step included.

    Batch keys: ``inputs`` (or one key per field when samples are dicts), ``mask`` (bool,
    ``(rows, length)``), ``lengths`` (int32), ``indices`` (int64, ``-1`` for padding rows),
    ``loss_weight`` (float32 scalar: multiply the local mean loss by it), ``valid`` (bool,
    ``(rows,)``). Scalar dict fields (labels) are stacked to ``(rows,)`` with padding 0.

    ``chronica.jax.iterator`` is this class under the name the docs use.

    Args:
        source: random-access data (numpy array, list of variable-length arrays, a dict of
            equal-length columns, or anything with ``__len__``/``__getitem__``); each sample
            is a sequence along its first axis, or a dict of such sequences and scalars.
        sizes: one cost proxy per sample (default: the data set's ``sizes``/``__sizeof__``
            as in ``chronica.core.resolve_sizes``, else every sample's length, read once at
            construction); given sizes (or the data set's own), no record is read before
            the batch that holds it. With ``packing=``, the documents' lengths in tokens.
        global_batch_size: the batch over all processes, a multiple of ``num_replicas``
            (``None`` with ``Packing(tokens_per_step=...)``).
        num_replicas: the world size (default ``jax.process_count()``).
        rank: this process's rank (default ``jax.process_index()``).
        labels: one class per sample (``shuffle="stratified"``, ``label_skew``).
        partitions: one index list per node (``shuffle="local"``/``"partial"``).
        config: a whole ``chronica.ScheduleConfig`` instead of ``global_batch_size`` and the
            plan options.
        dynamic: ``kind="dynamic"``: the transport to rank 0's coordinator (a
            ``chronica.runtime.DynamicOptions``); the processes report their compute time
            with ``it.report(seconds)`` and, under ``jax.distributed``, agree on every
            window over its key-value store.
        epochs: how many epochs to yield (``None``: forever).
        bucket_boundaries: padded sequence lengths (default: powers of two below the
            longest sample, then the longest; given sizes, when the longest sample is not
            read up front: every power of two); a longer sample raises ``ValueError``
            naming it. Not with ``packing=``.
        pad_value: the value of padding positions.
        sharding: with ``as_jax``, where arrays go (one spanning processes assembles a
            global array from every process's rows).
        as_jax: put array fields on device with ``jax.device_put``; ``indices`` and
            ``loss_weight`` stay numpy.
        token_field: with packing and dict records, the field holding the token sequence
            (yielded as ``tokens``); plain sequence records are the tokens themselves.
        options: the plan options below.

    Example::

        it = chronica.jax.iterator(tokens, global_batch_size=64, kind="guided", epochs=2)
        for batch in it:
            loss = step(batch["inputs"], batch["mask"], batch["loss_weight"])
    """

    def __init__(
        self,
        source: Any,
        sizes: Any = None,
        *,
        global_batch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
        epochs: int | None = 1,
        bucket_boundaries: Sequence[int] | None = None,
        pad_value: Any = 0,
        sharding: jax.sharding.Sharding | None = None,
        as_jax: bool = False,
        token_field: str = TOKENS,
        **options: Any,
    ) -> None:
        source = random_access(source)
        if epochs is not None:
            epochs = check_int("epochs", epochs, 1, hint=" or None (forever)")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(f"sharding={sharding!r} must be a jax.sharding.Sharding or None")
        if sharding is not None and not as_jax:
            raise ValueError("sharding= places arrays on devices; pass as_jax=True with it")
        cfg, rank = plan_request(
            options,
            batch_size=global_batch_size,
            num_replicas=num_replicas,
            rank=rank,
            face="chronica.jax.iterator",
            config=config,
            dynamic=dynamic,
            detect=_jax_world,
            batch_name="global_batch_size",
            needs_step=True,
        )
        # One global array over several processes: every process pads alike.
        self._global = sharding is not None and not sharding.is_fully_addressable
        self.records, sizes = record_batches(
            source,
            sizes,
            cfg,
            bucket_boundaries=bucket_boundaries,
            pad_value=pad_value,
            token_field=token_field,
            same_rows=self._global,
        )
        self.stream = open_stream(
            sizes,
            cfg,
            rank,
            labels=labels,
            partitions=partitions,
            dynamic=dynamic,
            agree=key_value_agreement(rank, (dynamic or DynamicOptions()).timeout, _jax_store),
            names=_NAMES,
        )
        self.source = source
        self.packing = cfg.packing
        self.token_field = token_field
        self.variable_batch = cfg.variable_batch
        self.epochs = epochs
        self.sharding = sharding
        self.as_jax = bool(as_jax)
        self._batches: Iterator[dict[str, Any]] | None = None

    # -- shapes ---------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """The most rows a batch has: ``global_batch_size // num_replicas``, the per-process
        maximum with ``variable_batch=True``, a packed micro-batch's rows with packing."""
        if isinstance(self.records, PackedBatches):
            return self.records.packing.rows
        return self.records.rows

    @property
    def bucket_boundaries(self) -> tuple[int, ...]:
        """The padded sequence lengths (with packing: ``(row_length,)``). Given ``sizes=``
        and no ``bucket_boundaries``, the buckets are every power of two, listed up to the
        bucket of the longest sample read so far."""
        if isinstance(self.records, PackedBatches):
            return (self.records.packing.length,)
        return self.records.bucket_boundaries

    @property
    def shapes_seen(self) -> set[tuple[int, int]]:
        """The ``(rows, length)`` shapes yielded so far (never more than ``num_shapes``)."""
        return self.records.shapes_seen

    @property
    def pad_value(self) -> Any:
        """What pads inputs past a sample's length (and packed rows past their tokens)."""
        return self.records.pad_value

    def bucket(self, length: int) -> int:
        """The padded length for a batch whose longest sample has ``length`` elements."""
        return self._padded().bucket(length)

    def batch_rows(self, count: int) -> int:
        """Rows of a batch holding ``count`` real samples: ``rows``, or with
        ``variable_batch=True`` (and no sharding spanning processes) the smallest power of
        two ``>= count`` capped at ``rows``."""
        return self._padded().batch_rows(count)

    def _padded(self) -> PaddedBatches:
        if not isinstance(self.records, PaddedBatches):
            raise ValueError("packed micro-batches have one shape: no buckets or row sizes")
        return self.records

    @property
    def num_shapes(self) -> int:
        """An upper bound on the distinct ``(rows, length)`` shapes this iterator can yield.

        Row sizes (one, or with ``variable_batch=True`` the powers of two below ``rows``
        and ``rows`` itself) times length buckets (those some sample's length falls into:
        a batch's length is the bucket of its longest sample, so ``<= len(bucket_boundaries)``);
        a jitted step function compiles at most this many programs. ``shapes_seen`` lists
        the ones actually yielded so far. Given ``sizes=``, the samples' lengths are not
        read up front: asking for this reads those not read yet. With packing: 1.
        """
        if isinstance(self.records, PackedBatches):
            return 1
        return self.records.num_shapes

    # -- iteration ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches one epoch yields (equal on every process): its steps (see
        ``steps_per_epoch``), or with ``packing=`` its micro-batches, of the epoch of the
        next batch."""
        if self.packing is None:
            return self.steps_per_epoch
        stream = self.stream
        plan = stream.plan(stream.epoch + 1) if self._epoch_done() else stream.plan()
        assert plan.micro is not None
        return int(plan.micro.num_micro.sum())

    def _epoch_done(self) -> bool:
        return self.stream.step >= self.stream.num_steps

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self.stream.epoch + (1 if self._epoch_done() else 0)

    @property
    def steps_per_epoch(self) -> int:
        """Steps of the epoch of the next batch, equal on every process: after an elastic
        ``set_state``, the steps of the resumed epoch's remainder until its last batch is
        yielded, then the ordinary count."""
        return self.scheduler.num_steps() if self._epoch_done() else self.stream.num_steps

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its start (the iterator moves from epoch to epoch by
        itself; this jumps). Selecting the current epoch keeps the position in it."""
        if epoch != self.stream.epoch:
            self._drop_batches()
        self.stream.set_epoch(epoch)

    def __iter__(self) -> ScheduledIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        stream = self.stream
        if self.scheduler.num_steps() == 0:
            raise StopIteration
        while True:
            if self._batches is None:
                if self.epochs is not None and stream.epoch >= self.epochs:
                    raise StopIteration
                self._batches = self._steps() if self.packing is None else self._micro_batches()
            for out in self._batches:
                return out
            self._batches = None
            stream.set_epoch(stream.epoch + 1)

    def _steps(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch's batches, one per step."""
        # A sample-level face's state (torch's DistributedSampler) may stop mid-step: the
        # samples of that step it handed out are not handed out again.
        skip = self.stream.offset
        for batch in self.stream.batches():
            yield self._batch(batch._replace(indices=batch.indices[skip:]))
            skip = 0

    def _micro_batches(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch's micro-batches, step after step (packing)."""
        stream = self.stream
        for batch in stream.batches(whole=False):
            for m in range(stream.offset, len(batch.micro)):
                # Counted before it is handed out: a state taken once the caller holds the
                # micro-batch resumes with the next one.
                stream.advance(1)
                yield self._micro_batch(batch, m)

    def _drop_batches(self) -> None:
        if self._batches is not None:
            self._batches.close()  # type: ignore[attr-defined]
            self._batches = None

    def _micro_batch(self, batch: LocalBatch, m: int) -> dict[str, Any]:
        assert isinstance(self.records, PackedBatches)
        return self._placed(self.records.make(batch, m), PACKED_HOST_KEYS)

    def _batch(self, batch: LocalBatch) -> dict[str, Any]:
        everyone = None
        if self._global:  # one global array: every process pads to the step's longest sample
            plan = self.stream.plan(batch.epoch)
            everyone = plan.indices[plan.bounds[batch.step, 0] : plan.bounds[batch.step, -1]]
        return self._placed(self._padded().make(batch, everyone), HOST_KEYS)

    def _placed(self, out: dict[str, Any], host: tuple[str, ...]) -> dict[str, Any]:
        """``out`` with its arrays on devices (``as_jax=True``), ``host`` keys as they are."""
        if not self.as_jax:
            return out
        return {key: v if key in host else self._place(v) for key, v in out.items()}

    def _place(self, value: np.ndarray) -> jax.Array:
        if self.sharding is None:
            return jax.device_put(value)
        if self.sharding.is_fully_addressable:
            return jax.device_put(value, self.sharding)
        # A global sharding over several processes: this process holds its own rows.
        return jax.make_array_from_process_local_data(self.sharding, value)

    # -- checkpointing --------------------------------------------------------------------

    def set_state(self, state: Any) -> None:
        """Continue from ``state``: ``get_state()`` of any process, or the state of any
        chronica adapter built with the same data and arguments (a torch sampler's too).

        Same world size and global batch size: the next batch is the saved next one, byte
        for byte (with ``packing=``, the saved next micro-batch, mid-step included). A
        state taken after an epoch's last batch says ``step`` = the epoch's steps; the next
        batch is then the next epoch's first. A state that stops mid-step (a torch
        ``DistributedSampler``'s) yields the rest of that step first. With ``packing=``,
        a partly yielded step resumed at another world is not counted as trained: the
        whole step is planned again with the remainder.

        Another world size or global batch size (elastic resume, ``chronica.core.elastic``,
        exactly as ``chronica.torch``'s samplers): the steps yielded at the saved world
        count as trained, and the epoch's remaining samples, in the saved plan's order, are
        planned for this world: cut into global batches of this ``global_batch_size``,
        each balanced between the processes, equal step counts on every process, padded by
        repeating from the remainder's start (``drop_last=False``) or cut at its tail
        (``drop_last=True``). The next batch is this process's first of the remainder, with
        the usual static shapes, masks, ``valid`` rows and ``loss_weight``; ``len()``,
        ``steps_per_epoch`` and ``plan()`` describe the remainder until the next epoch
        begins, which plans as usual at this world. Bucket boundaries and ``pad_value``
        shape batches, not plans: they may differ from the saved run's.

        Raises ``ValueError`` for another state version, state saved with other data,
        sizes or arguments (naming the fields that differ; only ``num_replicas`` and
        ``global_batch_size`` may change), and, mid-epoch, for a change of world or batch
        size under ``kind="dynamic"`` or a node-partitioned shuffle (``local``,
        ``partial``): those resume at the saved world, or at any world from a state saved
        at an epoch boundary.
        """
        self._drop_batches()
        self.stream.load_state(state)

    def close(self) -> None:
        """Release the coordinator connection (and, on rank 0, stop the coordinator).
        Idempotent; also done at interpreter exit."""
        self._drop_batches()
        self.stream.close()


iterator = ScheduledIterator
