"""A Grain data source whose record is this process's whole batch of one step.

Grain's ``DataLoader`` and ``MapDataset.mp_prefetch`` deal *records* to worker processes
one by one and batch them there, so a plan of per-rank batches built from single samples
does not survive them: each worker would batch the samples it happened to receive.
``StepSource`` makes the step the record. Record ``k`` is this rank's local batch of the
``k``-th step (epoch after epoch), already padded to static shapes exactly as
``chronica.jax.iterator`` pads it (or, with packing, all its packed micro-batches), so
whatever worker builds it, the batch the training step receives is the one chronica
planned, and Grain's own checkpoint (the next record number) is chronica's position.

``StepSampler`` (``StepSource.sampler()``) is the sampler for ``grain.DataLoader``: its
shard options are chronica's rank and world, so Grain's sharding selects this rank's
records (``grain.sharding.ShardByJaxProcess`` agrees whenever the rank is the JAX process
index), and a pipeline that would read another rank's records fails at once.

Neither grain nor jax is imported here (Grain's spawned workers unpickle the source and
import this module): the sampler imports grain when it is built, and the default world is
``jax.process_count()`` / ``jax.process_index()``, imported only when not given.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chronica.core import Packing, PlanStats, ScheduleConfig, Scheduler
from chronica.core.checks import check_int
from chronica.core.plan import EpochPlan
from chronica.runtime.records import META_KEYS, PaddedBatches, random_access, record_batches
from chronica.runtime.request import open_stream, plan_face, plan_request
from chronica.runtime.rows import TOKENS
from chronica.runtime.stream import RankStream, state_format

__all__ = ["StepSampler", "StepSource"]

# What a record holds besides a batch's keys.
_POSITION = ("epoch", "step")


def _jax_world() -> tuple[int, int]:
    import jax

    return jax.process_count(), jax.process_index()


@plan_face
class StepSource:
    """This rank's batches of a chronica plan as a Grain data source: record ``k`` is step
    ``k`` of the run (epoch after epoch), for ``grain.DataLoader`` (with ``sampler()``) or
    ``grain.MapDataset.source``.

    Guarantees:

    - ``len(source)`` is the steps of ``epochs`` epochs, equal on every rank; ``position(k)``
      is record ``k``'s ``(epoch, step)``. A record is a dict of numpy arrays built from the
      records of ``source`` only when it is read (workers build them independently; equal
      arguments give equal bytes in any process).
    - Unpacked, record ``k`` at ``(epoch, step)`` is exactly the batch
      ``chronica.jax.iterator`` yields there with the same arguments: its real rows are
      ``plan(epoch).local(step, rank)`` in order (for ``kind="static"``, the indices
      ``chronica.torch``'s ``DistributedBatchSampler`` yields for equal arguments), padded
      to ``rows`` rows and to the smallest bucket boundary holding the longest sample, with
      the keys ``inputs`` (or one per field of dict samples), ``mask``, ``lengths``,
      ``valid``, ``indices`` (``-1`` on padding rows), ``loss_weight``, plus ``epoch`` and
      ``step``. Over all ranks, every sample is in exactly one record per epoch (apart
      from torch-style padding or dropping, see ``drop_last``); epochs differ in order as
      ``shuffle`` and ``seed`` say.
    - ``global_shape=True``: every rank's record of a step has the same shape (the step's
      longest sample over all ranks decides the length; ``variable_batch`` rows are the
      most rows), so ``jax.make_array_from_process_local_data`` can assemble one global
      batch from every process's record.
    - With ``packing=`` record ``k`` is the whole step: every array of the iterator's
      packed micro-batches (``tokens``, ``segment_ids``, ``positions``, other packed
      fields) stacked on a leading axis of ``num_micro`` micro-batches, ``loss_weight``
      ``(num_micro,)``, ``indices`` ``(num_micro, pieces)`` (``-1`` past a micro-batch's
      pieces), ``step``, ``num_micro`` and ``epoch``; every rank has the same
      ``num_micro`` at a step.
    - Nothing is read ahead: given ``sizes`` (or the data set's own ``sizes`` /
      ``__sizeof__``), construction reads no record (the first one, when packed, for its
      fields' shapes), and record ``k`` reads the samples of its batch (with
      ``global_shape`` and lengths not read yet, also the lengths of the step's other
      samples). Without sizes, every sample's length is read once, here, as the default
      size.
    - ``repr`` names the rank, the world and the configuration digest (sizes included):
      Grain's ``DataLoader`` compares it when it restores a checkpoint, so a checkpoint of
      another plan is refused. The number of epochs is not in it: a checkpoint resumes
      with more epochs too.

    Args:
        source: random-access data, as for ``chronica.jax.iterator``.
        sizes: one cost proxy per sample, as for ``chronica.jax.iterator``.
        global_batch_size: the batch over all processes (``None`` with
            ``Packing(tokens_per_step=...)``).
        num_replicas: the world size (default ``jax.process_count()``).
        rank: this process's rank (default ``jax.process_index()``).
        labels: one class per sample (``shuffle="stratified"``, ``label_skew``).
        partitions: one index list per node (``shuffle="local"``/``"partial"``).
        config: a whole ``chronica.ScheduleConfig`` instead of ``global_batch_size`` and the
            plan options.
        epochs: how many epochs the records span (an int: a data source has a length).
        bucket_boundaries: padded sequence lengths, as for ``chronica.jax.iterator``.
        pad_value: the value of padding positions.
        global_shape: every rank's record of a step has the same shape (see above).
        token_field: with packing and dict records, the field holding the tokens.
        options: the plan options below. A mode that opens a session
            (``kind="dynamic"``) is refused: its plans follow the times ranks report while
            training, which Grain's workers never see (use ``chronica.jax.iterator``).

    Example::

        source = chronica.jax.StepSource(tokens, global_batch_size=64, epochs=3)
        loader = grain.DataLoader(data_source=source, sampler=source.sampler, ...)
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
        epochs: int = 1,
        bucket_boundaries: Sequence[int] | None = None,
        pad_value: Any = 0,
        global_shape: bool = False,
        token_field: str = TOKENS,
        **options: Any,
    ) -> None:
        source = random_access(source, (*META_KEYS, *_POSITION))
        self.epochs = check_int("epochs", epochs, 1)
        cfg, rank = plan_request(
            options,
            batch_size=global_batch_size,
            num_replicas=num_replicas,
            rank=rank,
            face="chronica.jax.StepSource",
            config=config,
            detect=_jax_world,
            batch_name="global_batch_size",
            needs_step=True,
        )
        if cfg.mode.opens_session:
            raise ValueError(
                f"kind={cfg.mode.name!r} re-plans from the compute times ranks report while "
                "they train, which Grain's worker processes never see; use kind='static' (or "
                "'guided') here, or chronica.jax.iterator for dynamic scheduling"
            )
        self.global_shape = bool(global_shape)
        self.records, sizes = record_batches(
            source,
            sizes,
            cfg,
            bucket_boundaries=bucket_boundaries,
            pad_value=pad_value,
            token_field=token_field,
            same_rows=self.global_shape,
        )
        self._stream: RankStream = open_stream(
            sizes,
            cfg,
            rank,
            labels=labels,
            partitions=partitions,
            names=state_format("step source"),
        )
        scheduler = self._stream.scheduler
        # The first record of every epoch, and the end. Packed step counts may differ
        # between epochs (a token budget): those epochs are planned here, once.
        counts = [scheduler.num_steps(e) for e in range(self.epochs)]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._lock = threading.Lock()

    # -- what it is -----------------------------------------------------------------------

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler every plan comes from (sizes, configuration, digest)."""
        return self._stream.scheduler

    @property
    def rank(self) -> int:
        return self._stream.rank

    @property
    def num_replicas(self) -> int:
        return self._stream.num_replicas

    @property
    def packing(self) -> Packing | None:
        return self.scheduler.config.packing

    @property
    def num_shapes(self) -> int:
        """An upper bound on the distinct shapes of the unpacked records' arrays (as
        ``chronica.jax.iterator``'s; reads the lengths not read yet); 1 when packed (a
        packed step's arrays have ``num_micro`` on their leading axis besides)."""
        records = self.records
        return records.num_shapes if isinstance(records, PaddedBatches) else 1

    def steps(self, epoch: int) -> int:
        """Records (steps) of ``epoch``, equal on every rank."""
        epoch = check_int("epoch", epoch, 0, self.epochs - 1)
        return int(self._starts[epoch + 1] - self._starts[epoch])

    def position(self, record: int) -> tuple[int, int]:
        """``(epoch, step)`` of record number ``record``."""
        record = check_int("record", record, 0, len(self) - 1)
        epoch = int(np.searchsorted(self._starts, record, side="right")) - 1
        return epoch, record - int(self._starts[epoch])

    def plan(self, epoch: int) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``."""
        with self._lock:
            return self.scheduler.plan_epoch(check_int("epoch", epoch, 0))

    def stats(self, epoch: int) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan."""
        return self.scheduler.plan_stats(self.plan(epoch))

    def sampler(self) -> StepSampler:
        """The ``grain.DataLoader`` sampler of these records (imports grain): see
        ``StepSampler``."""
        return StepSampler(len(self), self.rank, self.num_replicas, self.scheduler.digest)

    # -- the data source ------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, record: int) -> dict[str, Any]:
        """Record ``record``: this rank's batch of its step (see the class)."""
        record = operator.index(record)
        if not 0 <= record < len(self):
            raise IndexError(f"record {record} is outside the {len(self)} records")
        epoch, step = self.position(record)
        plan = self.plan(epoch)
        batch = self._stream.planned(plan, step)
        if isinstance(self.records, PaddedBatches):
            everyone = None
            if self.global_shape:
                everyone = plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]]
            out = self.records.make(batch, everyone, reserved=_POSITION)
            out["step"] = step
        else:
            out = self.records.step_arrays(batch)
        out["epoch"] = epoch
        return out

    def __repr__(self) -> str:
        return (
            f"chronica.jax.StepSource(rank={self.rank}, num_replicas={self.num_replicas}, "
            f"digest={self.scheduler.digest})"
        )

    # A lock does not pickle; Grain's workers get a copy of the source and a lock of their own.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class StepSampler:
    """The ``grain.DataLoader`` sampler of a ``StepSource``: Grain's index ``i · W + r``
    is record ``i`` of rank ``r`` (``W`` ranks), in order.

    Guarantees: it carries ``grain.sharding.ShardOptions(shard_index=rank,
    shard_count=num_replicas, drop_remainder=True)`` (a ``DataLoader`` without
    ``shard_options`` takes them), under which the loader reads records ``0, 1, 2, ...``
    of this rank's source, once each, in order, whatever its ``worker_count``; so does
    ``grain.sharding.ShardByJaxProcess`` when the rank is the JAX process index. An index
    of another rank (``NoSharding`` in a job of several ranks, or a rank that is not the
    JAX process index) raises ``ValueError``, since this rank's source cannot serve it.
    No shuffling or repetition: the records already are chronica's order, epoch after
    epoch. ``repr`` names the rank, the world and the configuration digest, which Grain
    compares when it restores a checkpoint.
    """

    def __init__(self, num_records: int, rank: int, num_replicas: int, digest: str) -> None:
        import grain

        self.num_records = check_int("num_records", num_records, 0)
        self.num_replicas = check_int("num_replicas", num_replicas, 1)
        self.rank = check_int("rank", rank, 0, self.num_replicas - 1)
        self.digest = digest
        self._metadata = grain.RecordMetadata
        self._shard_options = grain.sharding.ShardOptions(
            shard_index=self.rank, shard_count=self.num_replicas, drop_remainder=True
        )

    def __len__(self) -> int:
        return self.num_records * self.num_replicas

    def __getitem__(self, index: int) -> Any:
        index = operator.index(index)
        if not 0 <= index < len(self):
            raise IndexError(f"sampler index {index} is outside [0, {len(self)})")
        record, rank = divmod(index, self.num_replicas)
        if rank != self.rank:
            raise ValueError(
                f"Grain asked for index {index}, a record of rank {rank}, from rank "
                f"{self.rank}'s StepSource of {self.num_replicas} ranks: leave the "
                f"DataLoader's shard_options unset (the sampler carries rank {self.rank} "
                f"of {self.num_replicas}) or pass ShardOptions(shard_index={self.rank}, "
                f"shard_count={self.num_replicas})"
            )
        return self._metadata(index=index, record_key=record)

    def __repr__(self) -> str:
        return (
            f"chronica.jax.StepSampler(rank={self.rank}, num_replicas={self.num_replicas}, "
            f"digest={self.digest})"
        )
