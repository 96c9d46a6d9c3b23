"""A scheduled, checkpointable, static-shape batch iterator for JAX.

``iterator(source, global_batch_size=B, ...)`` builds the same ``Scheduler`` as the torch
samplers (same arguments, same sizes: byte-identical plans) and yields this process's local
batch for every step, epoch after epoch, as padded numpy arrays (or ``jax.Array`` with
``as_jax=True``). Shapes are static so that ``jax.jit`` compiles a bounded number of programs:

- the batch dimension is always ``B // W`` rows; a trailing partial step is padded with
  rows whose ``valid`` is ``False``;
- the sequence dimension is the smallest bucket boundary that holds the local batch's
  longest sample, so at most ``num_shapes`` distinct shapes are ever yielded.

Imports numpy, jax and ``chronica.core`` only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from chronica.core import (
    EpochPlan,
    ScheduleConfig,
    Scheduler,
    resolve_sizes,
)
from chronica.core.elastic import Segment, StateFormat, load_state, state_fields
from chronica.core.sizes import defines_sizeof

__all__ = ["ScheduledIterator", "iterator"]

_STATE_VERSION = 2
# Version 1 states (no batch size, history or fingerprint) still resume at the same world.
_STATE = StateFormat(
    versions=(1, 2),
    name="iterator state",
    owner="iterator",
    position="step",
    batch="global_batch_size",
)
_META_KEYS = ("mask", "lengths", "indices", "loss_weight", "valid")


class _Columns:
    """A mapping of equal-length columns seen as a sequence of per-sample dicts."""

    def __init__(self, columns: Mapping[str, Any]) -> None:
        if not columns:
            raise ValueError("source is an empty mapping; give at least one column")
        lengths = {}
        for key, column in columns.items():
            if not isinstance(key, str):
                raise ValueError(f"source column names must be str, got {key!r}")
            if key in _META_KEYS:
                raise ValueError(f"source column {key!r} clashes with a batch key; rename it")
            try:
                lengths[key] = len(column)
            except TypeError as exc:
                raise ValueError(f"source column {key!r} has no len()") from exc
        if len(set(lengths.values())) != 1:
            raise ValueError(f"source columns differ in length: {lengths}")
        self.columns = dict(columns)
        self.n = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {key: column[index] for key, column in self.columns.items()}


def _sample_length(sample: Any) -> int:
    """Sequence length of one sample: its first axis (the longest over a dict's fields)."""
    if isinstance(sample, Mapping):
        lengths = [_sample_length(v) for v in sample.values() if np.ndim(v) >= 1]
        return max(lengths, default=0)
    if np.ndim(sample) < 1:
        raise ValueError(
            "every sample must be a sequence (an array with at least one axis) or a dict of "
            f"arrays; got a scalar of type {type(sample).__name__}"
        )
    return len(sample)


def _default_boundaries(max_length: int) -> tuple[int, ...]:
    """Powers of two below the longest sample, then the longest sample itself."""
    bounds = []
    b = 1
    while b < max_length:
        bounds.append(b)
        b *= 2
    bounds.append(max(max_length, 1))
    return tuple(bounds)


def _validate_boundaries(boundaries: Any, max_length: int) -> tuple[int, ...]:
    try:
        values = [int(b) for b in boundaries]
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"bucket_boundaries={boundaries!r} must be a sequence of positive ints"
        ) from exc
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        raise ValueError(
            f"bucket_boundaries={boundaries!r} must be non-empty, positive and strictly increasing"
        )
    if values[-1] < max_length:
        raise ValueError(
            f"the longest sample has length {max_length} > the largest bucket boundary "
            f"{values[-1]}; add a boundary >= {max_length} to bucket_boundaries"
        )
    return tuple(values)


class ScheduledIterator(Iterator[dict[str, Any]]):
    """This process's batches of a chronica plan, with static shapes and resumable state.

    Guarantees:

    - For epoch ``e`` and step ``s`` the batch's real rows are exactly
      ``Scheduler(sizes, config).plan_epoch(e).local(s, rank)``, in that order — the same
      indices ``chronica.torch``'s ``DistributedBatchSampler`` yields for equal arguments.
      Every process runs the same number of steps per epoch; over all ranks every sample
      appears once per epoch (except torch-style padding/dropping, see ``drop_last``).
    - Every batch has ``rows = global_batch_size // num_replicas`` rows. Rows past the
      step's real samples (only in a trailing partial step) have ``valid=False``,
      ``indices=-1``, ``lengths=0``, an all-False ``mask`` and ``pad_value`` inputs.
    - The sequence axis (axis 1) is padded with ``pad_value`` to the smallest bucket
      boundary ``>=`` the batch's longest sample (with a ``sharding`` spanning several
      processes: the whole step's longest sample over all ranks, computed from the plan
      without communication, so every process contributes the same shape to the global
      array); ``mask[i, t]`` is True exactly for
      ``t < lengths[i]``. Hence at most ``num_shapes`` distinct shapes are yielded.
    - ``get_state()`` / ``set_state()`` resume at exactly the next step, in any process
      built with the same arguments; or, at another world size or global batch size, with
      the epoch's remaining samples (elastic resume, see ``set_state``).

    Batch keys: ``inputs`` (or one key per field when samples are dicts), ``mask`` (bool,
    ``(rows, length)``), ``lengths`` (int32), ``indices`` (int64, ``-1`` for padding rows),
    ``loss_weight`` (float32 scalar: multiply the local mean loss by it), ``valid`` (bool,
    ``(rows,)``). Scalar dict fields (labels) are stacked to ``(rows,)`` with padding 0.
    """

    def __init__(
        self,
        source: Any,
        sizes: Any = None,
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
        bucket_boundaries: Sequence[int] | None = None,
        pad_value: Any = 0,
        epochs: int | None = 1,
        sharding: jax.sharding.Sharding | None = None,
        as_jax: bool = False,
    ) -> None:
        if source is None:
            raise ValueError("source is required: a random-access data set (len and [])")
        if isinstance(source, Mapping):
            source = _Columns(source)
        if not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
            raise ValueError(
                f"source of type {type(source).__name__} is not random-access; it needs "
                f"__len__ and __getitem__ (a numpy array, a list of arrays, a dict of columns)"
            )
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int):
            raise ValueError(f"global_batch_size={global_batch_size!r} must be a positive int")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size={global_batch_size!r} must be a positive int")
        if epochs is not None and (
            isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
        ):
            raise ValueError(f"epochs={epochs!r} must be an int >= 1 or None (forever)")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise ValueError(f"sharding={sharding!r} must be a jax.sharding.Sharding or None")
        if sharding is not None and not as_jax:
            raise ValueError("sharding= places arrays on devices; pass as_jax=True with it")
        self.num_replicas, self.rank = _resolve_world(num_replicas, rank)
        n = len(source)
        self._lengths = np.fromiter(
            (_sample_length(source[i]) for i in range(n)), dtype=np.int64, count=n
        )
        if sizes is None and getattr(source, "sizes", None) is None and not defines_sizeof(source):
            sizes = self._lengths  # default cost proxy: the sequence length
        if kind == "dynamic":
            raise ValueError(
                "kind='dynamic' is not available for the JAX iterator yet: it plans ahead "
                "and takes no per-step timing back; use kind='static' (balanced by predicted "
                "cost) or 'guided', or chronica's torch samplers for dynamic re-balancing"
            )
        config = ScheduleConfig(
            num_replicas=self.num_replicas,
            batch_size=global_batch_size,
            kind=kind,
            exact=exact,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            cost=cost,
        )
        self.scheduler = Scheduler(resolve_sizes(source, sizes), config)
        max_length = int(self._lengths.max(initial=0))
        self.bucket_boundaries: tuple[int, ...] = (
            _default_boundaries(max_length)
            if bucket_boundaries is None
            else _validate_boundaries(bucket_boundaries, max_length)
        )
        self.source = source
        self.rows = global_batch_size // self.num_replicas
        self.pad_value = pad_value
        self.epochs = epochs
        self.sharding = sharding
        self.as_jax = bool(as_jax)
        self._global = sharding is not None and not sharding.is_fully_addressable
        self.shapes_seen: set[tuple[int, int]] = set()
        self._epoch = 0
        self._step = 0
        # An elastically resumed epoch ``_epoch``: the worlds it ran at before (oldest
        # first) and the plan of the samples they left, which replaces its ordinary plan.
        self._resumed: tuple[tuple[Segment, ...], EpochPlan] | None = None
        # What must not change across a resume besides the plan's own configuration.
        self._extra = {"bucket_boundaries": self.bucket_boundaries, "pad_value": repr(pad_value)}
        self._digest = hashlib.blake2b(
            json.dumps([self.scheduler.digest, self.bucket_boundaries, repr(pad_value)]).encode(),
            digest_size=16,
        ).hexdigest()

    # -- shapes ---------------------------------------------------------------------------

    def bucket(self, length: int) -> int:
        """The padded length for a batch whose longest sample has ``length`` elements."""
        pos = int(np.searchsorted(self.bucket_boundaries, length, side="left"))
        if pos == len(self.bucket_boundaries):
            raise ValueError(f"length {length} exceeds the largest bucket boundary")
        return self.bucket_boundaries[pos]

    @property
    def num_shapes(self) -> int:
        """An upper bound on the distinct ``(rows, length)`` shapes this iterator can yield.

        It is the number of buckets that some sample's length falls into (a batch's length
        is the bucket of its longest sample), so ``<= len(bucket_boundaries)``; a jitted
        step function compiles at most this many programs. ``shapes_seen`` lists the ones
        actually yielded so far.
        """
        return len({self.bucket(int(length)) for length in np.unique(self._lengths)})

    # -- iteration ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Steps per epoch (equal on every process); see ``steps_per_epoch``."""
        return self.steps_per_epoch

    @property
    def steps_per_epoch(self) -> int:
        """Steps of the epoch of the next batch, equal on every process: after an elastic
        ``set_state``, the steps of the resumed epoch's remainder until its last batch is
        yielded, then the ordinary count."""
        steps = self._epoch_steps()
        return steps if self._step < steps else self.scheduler.num_steps()

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``, the one being iterated by default. After
        an elastic ``set_state``, the resumed epoch's plan is that of its remainder."""
        if self._resumed is not None and epoch in (None, self._epoch):
            return self._resumed[1]
        return self.scheduler.plan_epoch(self._epoch if epoch is None else epoch)

    def __iter__(self) -> ScheduledIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.scheduler.num_steps() == 0:
            raise StopIteration
        if self._step >= self._epoch_steps():
            self._epoch += 1
            self._step = 0
            self._resumed = None
        if self.epochs is not None and self._epoch >= self.epochs:
            raise StopIteration
        batch = self._batch(self.plan(), self._step)
        self._step += 1
        return batch

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._epoch + (1 if self._step >= self._epoch_steps() else 0)

    def _epoch_steps(self) -> int:
        """Steps of the plan of ``_epoch`` (its remainder's after an elastic resume)."""
        return self.scheduler.num_steps() if self._resumed is None else self._resumed[1].num_steps

    def _batch(self, plan: EpochPlan, step: int) -> dict[str, Any]:
        indices = plan.local(step, self.rank)
        k = int(indices.shape[0])
        rows = self.rows
        lengths = np.zeros(rows, dtype=np.int32)
        lengths[:k] = self._lengths[indices]
        longest = int(lengths.max(initial=0))
        if self._global:  # one global array: every process pads to the step's longest sample
            everyone = plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]]
            longest = int(self._lengths[everyone].max(initial=0))
        length = self.bucket(longest)
        samples = [self.source[int(i)] for i in indices]
        out: dict[str, Any] = {}
        if samples and isinstance(samples[0], Mapping):
            for key in samples[0]:
                if key in _META_KEYS:
                    raise ValueError(f"sample field {key!r} clashes with a batch key; rename it")
                out[key] = self._stack([s[key] for s in samples], rows, length, key)
        else:
            out["inputs"] = self._stack(samples, rows, length, "inputs")
        valid = np.zeros(rows, dtype=bool)
        valid[:k] = True
        padded_indices = np.full(rows, -1, dtype=np.int64)
        padded_indices[:k] = indices
        out["mask"] = np.arange(length)[None, :] < lengths[:, None]
        out["lengths"] = lengths
        out["valid"] = valid
        self.shapes_seen.add((rows, length))
        if self.as_jax:
            out = {key: self._place(value) for key, value in out.items()}
        out["indices"] = padded_indices
        out["loss_weight"] = np.float32(plan.loss_weights[step, self.rank])
        return out

    def _stack(self, values: list[Any], rows: int, length: int, key: str) -> np.ndarray:
        arrays = [np.asarray(v) for v in values]
        if not arrays:
            raise ValueError(f"field {key!r}: a step without samples cannot be stacked")
        first = arrays[0]
        if first.ndim == 0:  # a per-sample scalar (a label): no sequence axis
            out = np.zeros(rows, dtype=first.dtype)
            out[: len(arrays)] = arrays
            return out
        tail = first.shape[1:]
        out = np.full((rows, length, *tail), self.pad_value, dtype=first.dtype)
        for i, a in enumerate(arrays):
            if a.shape[1:] != tail:
                raise ValueError(
                    f"field {key!r}: sample shapes {first.shape} and {a.shape} differ beyond "
                    f"the first (sequence) axis"
                )
            out[i, : a.shape[0]] = a
        return out

    def _place(self, value: np.ndarray) -> jax.Array:
        if self.sharding is None:
            return jax.device_put(value)
        if self.sharding.is_fully_addressable:
            return jax.device_put(value, self.sharding)
        # A global sharding over several processes: this process holds its own rows.
        return jax.make_array_from_process_local_data(self.sharding, value)

    # -- checkpointing --------------------------------------------------------------------

    @property
    def digest(self) -> str:
        """Hex digest of sizes, schedule configuration, buckets and padding value."""
        return self._digest

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable position: the next batch is ``(epoch, step)`` of this rank.

        ``epoch`` and ``step`` (the steps of the epoch's plan already yielded, all of them
        complete), ``rank``, ``num_replicas``, ``digest`` (data, whole configuration,
        buckets and padding value) and, for a change of world: ``batch_size`` (the global
        batch), ``history`` (``[W, B, step]`` of the worlds this epoch ran at before, oldest
        first; empty unless it was resumed at another world) and ``fingerprint``
        (everything else the plan and the batches depend on). After an epoch's last batch
        the state is the next epoch's step 0.
        """
        epoch, step = self._epoch, self._step
        history = () if self._resumed is None else self._resumed[0]
        if step >= self._epoch_steps():
            epoch, step, history = epoch + 1, 0, ()
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "rank": self.rank,
            "digest": self._digest,
            **state_fields(self.scheduler, history, step, self._extra),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from ``get_state``).

        Same world size and global batch size: the next batch is the saved next one, byte
        for byte; the state must be this rank's. States of the previous version (1, before
        elastic resume) are read too, at the same world only.

        Another world size or global batch size (elastic resume, ``chronica.core.elastic``,
        exactly as ``chronica.torch``'s samplers): any rank's state will do. The steps
        yielded at the saved world count as trained, and the epoch's remaining samples, in
        the saved plan's order, are planned for this world: cut into global batches of
        this ``global_batch_size``, each balanced between the processes, equal step counts
        on every process, padded by repeating from the remainder's start
        (``drop_last=False``) or cut at its tail (``drop_last=True``). Over the trained
        steps and the remainder every sample appears exactly once, apart from that padding
        or cutting (the remainder's ``plan().num_padded``/``num_dropped``, and padding
        inside the trained steps). The next batch is this process's first of the
        remainder, with the usual static shapes, masks, ``valid`` rows and
        ``loss_weight``; ``len()``, ``steps_per_epoch`` and ``plan()`` describe the
        remainder until the next epoch begins, which plans as usual at this world. A
        resumed epoch's state can be saved and resumed again, at any world.

        Raises ``ValueError`` for state from an unknown version, from another rank at the
        same world, or saved with other data, sizes, buckets, padding value or arguments
        (naming the fields that differ; only ``num_replicas`` and ``global_batch_size`` may
        change), and, mid-epoch, for a change of world or batch size under
        ``kind="dynamic"`` or a node-partitioned shuffle (``local``, ``partial``): those
        resume at the saved world, or at any world from a state saved at an epoch boundary.
        """
        resumed = load_state(state, self.scheduler, self._digest, _STATE, self._extra)
        if resumed.same_world and (state.get("rank"), state.get("num_replicas")) != (
            self.rank,
            self.num_replicas,
        ):
            raise ValueError(
                f"iterator state belongs to rank {state.get('rank')} of "
                f"{state.get('num_replicas')}, not rank {self.rank} of {self.num_replicas}"
            )
        plan = resumed.plan
        steps = self.scheduler.num_steps() if plan is None else plan.num_steps
        if resumed.position > steps:
            raise ValueError(f"iterator state step={resumed.position} is outside [0, {steps}]")
        self._epoch, self._step = resumed.epoch, resumed.position
        self._resumed = None if plan is None else (resumed.history, plan)


def _resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None:
        num_replicas = jax.process_count()
    if rank is None:
        rank = jax.process_index()
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas!r} must be an int >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank={rank!r} must be an int in [0, {num_replicas - 1}]")
    return num_replicas, rank


def iterator(
    source: Any,
    sizes: Any = None,
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
    bucket_boundaries: Sequence[int] | None = None,
    pad_value: Any = 0,
    epochs: int | None = 1,
    sharding: jax.sharding.Sharding | None = None,
    as_jax: bool = False,
) -> ScheduledIterator:
    """This process's scheduled, padded batches of ``source``; see ``ScheduledIterator``.

    ``source``: random-access data (numpy array, list of variable-length arrays, a dict of
    equal-length columns, or anything with ``__len__``/``__getitem__``); each sample is a
    sequence along its first axis, or a dict of such sequences and scalars. ``sizes``: one
    cost proxy per sample (default: the data set's ``sizes``/``__sizeof__`` as in
    ``chronica.core.resolve_sizes``, else every sample's length). ``global_batch_size``: the
    batch over all processes, a multiple of ``num_replicas`` (default
    ``jax.process_count()``); ``rank`` defaults to ``jax.process_index()``. ``kind``,
    ``exact``, ``shuffle``, ``seed``, ``drop_last``, ``cost`` mean what they mean for
    ``chronica.torch``'s samplers. ``bucket_boundaries``: padded sequence lengths (default:
    powers of two below the longest sample, then the longest). ``epochs``: how many epochs
    to yield (``None``: forever). ``as_jax``: put array fields on device with
    ``jax.device_put`` (``sharding`` given: on it; a sharding spanning processes assembles a
    global array from every process's rows); ``indices`` and ``loss_weight`` stay numpy.
    """
    return ScheduledIterator(
        source,
        sizes,
        global_batch_size=global_batch_size,
        num_replicas=num_replicas,
        rank=rank,
        kind=kind,
        exact=exact,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        cost=cost,
        bucket_boundaries=bucket_boundaries,
        pad_value=pad_value,
        epochs=epochs,
        sharding=sharding,
        as_jax=as_jax,
    )
