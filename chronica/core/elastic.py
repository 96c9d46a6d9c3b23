"""Elastic resume: the rest of an epoch, planned for a different world size or batch size.

A job saves its sampler state after some steps at ``W`` ranks with global batch ``B`` and
restarts at ``W'`` ranks (and possibly ``B'``). The epoch then continues with exactly the
samples it has not trained yet:

1. The saved epoch's plan at ``(W, B)`` is recomputed (a pure function, so every rank gets
   the same bytes). Its *order* is its samples step after step, each step's samples in the
   order of the epoch's permutation, every sample at its first appearance only (later
   copies are padding), followed by the samples the plan dropped (``drop_last``). For
   ``static`` exact mode that is simply the epoch's permutation: the order plain
   data-parallel training cuts into global batches.
2. The samples of the ``step`` steps completed at ``(W, B)`` are a prefix of that order and
   count as trained; the rest of the order is the *remainder*.
3. ``Scheduler.plan_stream`` plans the remainder at ``(W', B')``: in that order, padded by
   repeating from the remainder's start (``drop_last=False``) or cut at its tail
   (``drop_last=True``) to equal per-rank counts, cut into global batches of ``B'``, every
   batch balanced between the ``W'`` ranks by the scheduler's kernel, equal step counts on
   every rank. In exact mode, when ``B'`` divides the samples already trained, these are
   the global batches an uninterrupted ``(W', B')`` run would have formed from the same
   positions of the permutation, up to the padding at the end.

Exactly once: the trained prefix and the remainder are disjoint and together hold every
sample of the epoch; the only repeats are padding (the saved world's padding inside
trained steps, the new world's ``num_padded``), the only samples left out the new world's
``num_dropped``. The remainder is a pure function of (sizes, configuration, epoch,
segments, new world and batch size): byte-identical on every rank and after any restart.

A packed plan with outlier delay (``Packing(outliers=...)``) trains some documents in later
steps than the epoch's order put them in; its order (step 1) follows the plan's steps, so the
documents still waiting when the state was saved are part of the remainder, and the remainder
is planned with outlier delay again, its own order its delays' origin.

A resumed epoch can be saved and resumed again: its history is a chain of ``Segment``s,
one per world the epoch ran at, each planning the remainder left by the one before.

Supported: ``kind="static"`` (exact and pool) and ``"guided"`` with the ``global``,
``none``, ``block`` and ``stratified`` shuffles. A state saved before an epoch's first step
or after its last resumes at any world for every kind and policy. Mid-epoch, node-partitioned
policies (``local``, ``partial``) and ``kind="dynamic"`` refuse a new world or batch size
(``check_elastic`` says why); they still resume at the saved one.

``state_fields`` writes what a change of world needs and ``load_state`` decides, from a
saved state, where iteration continues; ``chronica.runtime.RankStream`` builds the one
state format of every adapter on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from chronica.core.checks import is_int
from chronica.core.config import ScheduleConfig
from chronica.core.plan import EpochPlan
from chronica.core.scheduler import Scheduler, per_replica, step_counts
from chronica.core.shuffle import epoch_order

__all__ = [
    "Resumption",
    "Segment",
    "StateFormat",
    "check_elastic",
    "check_fingerprint",
    "fingerprint",
    "load_state",
    "parse_segments",
    "remaining_samples",
    "resume_plan",
    "state_fields",
]

# What ``ScheduleConfig.describe`` holds that may change between worlds: the world and
# batch themselves, and the node map and dynamic bounds that are tied to them.
_WORLD_FIELDS = ("version", "num_replicas", "batch_size", "groups", "dynamic")


class Segment(NamedTuple):
    """``step`` completed steps of an epoch's plan at ``num_replicas`` ranks with global batch
    ``batch_size`` (``None``: no batch, one sample per rank and step)."""

    num_replicas: int
    batch_size: int | None
    step: int


class StateFormat(NamedTuple):
    """How an adapter's state reads: the state ``versions`` it loads, and the names its
    messages use for the state, for what builds it (``owner``), for the key of its position
    in the epoch's plan and for its global batch size argument."""

    versions: tuple[int, ...]
    name: str = "state_dict"
    owner: str = "sampler"
    position: str = "progress"
    batch: str = "batch_size"


class Resumption(NamedTuple):
    """Where an adapter continues after ``load_state``: ``epoch``; ``history``, the worlds the
    epoch ran at before (oldest first; empty when it follows its ordinary plan); ``plan``, the
    plan of the epoch's remainder (``None``: the ordinary plan); ``position`` in that plan (the
    saved one at the same world, 0 after a change of world); ``same_world``: the state's
    configuration digest matched, so its rank and position are this world's."""

    epoch: int
    history: tuple[Segment, ...]
    plan: EpochPlan | None
    position: int
    same_world: bool


_NAMES = StateFormat(versions=())


def fingerprint(scheduler: Scheduler) -> dict[str, Any]:
    """Everything an epoch's plan depends on except the world and batch size: the number of
    samples, the data digest (sizes, labels, partitions), kind, shuffle, seed, cost model,
    ``drop_last``... JSON-ready; equal fingerprints mean equal epoch orders at every world."""
    described = scheduler.config.describe(scheduler.data_digest)
    out = {key: value for key, value in described.items() if key not in _WORLD_FIELDS}
    out["num_samples"] = scheduler.num_samples
    return _jsonable(out)


def check_fingerprint(
    saved: Any,
    scheduler: Scheduler,
    names: StateFormat = _NAMES,
) -> None:
    """Raise ``ValueError`` naming every field in which ``saved`` (a ``fingerprint``) and
    ``scheduler`` differ; the message contains ``configuration digest
    differs`` and uses ``names``' words for the state and what builds it."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"state fingerprint must be a mapping, got {type(saved).__name__}")
    here = fingerprint(scheduler)
    saved = _jsonable(dict(saved))
    differ = [
        f"{key}: saved {saved.get(key)!r}, now {here.get(key)!r}"
        for key in sorted(set(here) | set(saved))
        if here.get(key) != saved.get(key)
    ]
    if differ:
        raise ValueError(
            f"{names.name} was saved with different sizes or {names.owner} arguments "
            f"(configuration digest differs: {'; '.join(differ)}); 'sizes' digests the sizes, "
            f"labels and partitions. Build the {names.owner} with the saved data and "
            f"arguments; only num_replicas and {names.batch} may change"
        )


def state_fields(
    scheduler: Scheduler,
    history: Sequence[Segment],
    step: int,
) -> dict[str, Any]:
    """What a state needs for a change of world, JSON-ready: ``num_replicas``,
    ``batch_size``, ``step`` (the completed steps of the plan being iterated), ``history``
    (``[W, B, step]`` of the worlds the epoch ran at before, oldest first) and
    ``fingerprint``."""
    cfg = scheduler.config
    return {
        "num_replicas": cfg.num_replicas,
        "batch_size": cfg.batch_size,
        "step": int(step),
        "history": [list(segment) for segment in history],
        "fingerprint": fingerprint(scheduler),
    }


def load_state(
    state: Any,
    scheduler: Scheduler,
    digest: str,
    names: StateFormat,
) -> Resumption:
    """Where an adapter built with ``scheduler`` (whose own configuration digest is
    ``digest``) continues from ``state``, a dict with ``version``, ``epoch``, the position
    key, ``digest`` and the ``state_fields``.

    Equal digests: the saved epoch, history and position (the remainder's plan again when
    the history is not empty). Otherwise the saved world becomes the history's last segment
    and the remainder is planned for this world from its start (``resume_plan``). Raises
    ``ValueError`` for an unknown version, invalid fields, a state without fingerprint or
    with another one (``check_fingerprint``), the same world and
    batch size under another digest, and what ``resume_plan`` refuses."""
    if not isinstance(state, dict) or state.get("version") not in names.versions:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(f"{names.name} version {version!r} is not supported")
    saved_epoch, saved_position = state.get("epoch"), state.get(names.position)
    if not _is_count(saved_epoch) or not _is_count(saved_position):
        raise ValueError(
            f"{names.name} epoch={saved_epoch!r}, {names.position}={saved_position!r} are invalid"
        )
    epoch, position = int(saved_epoch), int(saved_position)
    history = tuple(parse_segments(state.get("history", [])))
    if state.get("digest") == digest:
        plan = resume_plan(scheduler, epoch, history) if history else None
        kept = history if plan is not None else ()
        return Resumption(epoch, kept, plan, position, True)
    if "fingerprint" not in state:
        raise ValueError(
            f"{names.name} has another configuration digest and no fingerprint to compare; "
            f"build the {names.owner} exactly as when the state was saved"
        )
    check_fingerprint(state["fingerprint"], scheduler, names)
    saved = _segment(state.get("num_replicas"), state.get("batch_size"), state.get("step"))
    cfg = scheduler.config
    if saved[:2] == (cfg.num_replicas, cfg.batch_size):
        raise ValueError(
            f"{names.name} was saved with different {names.owner} arguments (configuration "
            "digest differs in groups= or the kind='dynamic' options); build the "
            f"{names.owner} exactly as when the state was saved"
        )
    segments = (*history, saved)
    plan = resume_plan(scheduler, epoch, segments)
    return Resumption(epoch, segments if plan is not None else (), plan, 0, False)


def check_elastic(config: ScheduleConfig, saved: Segment | None = None) -> None:
    """Raise ``ValueError`` if ``config``'s kind or shuffle policy cannot continue an epoch at
    another world or batch size; the message says why and what to do."""
    where = "" if saved is None else f" ({saved.num_replicas} ranks, batch {saved.batch_size})"
    todo = (
        f"Resume at the saved world size and batch size{where}, or change them at an epoch "
        "boundary (a state saved before the epoch's first step or after its last one loads "
        "at any world)"
    )
    if config.shuffle.partitioned:
        raise ValueError(
            f"shuffle={config.shuffle.kind!r} cannot continue an epoch at another world size "
            "or batch size: every sample lives on one node's partition, and the partitions "
            "are cut for the saved world, so the new ranks would either read other nodes' "
            f"data or break exactly-once. {todo}"
        )
    if config.mode.elastic_refusal is not None:
        raise ValueError(f"{config.mode.elastic_refusal} {todo}")


def parse_segments(value: Any) -> list[Segment]:
    """Segments from a state's ``history`` (a list of ``[num_replicas, batch_size, step]``),
    validated; ``ValueError`` names what is wrong."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"state history must be a list, got {type(value).__name__}")
    out = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise ValueError(f"state history entry {item!r} is not [num_replicas, batch, step]")
        try:
            out.append(_segment(*item))
        except ValueError as error:
            raise ValueError(f"state history entry {list(item)!r}: {error}") from None
    return out


def _is_count(value: Any, low: int = 0) -> TypeGuard[int]:
    """``value`` is an int (not a bool) ``>= low``."""
    return bool(is_int(value) and value >= low)


def _segment(num_replicas: Any, batch_size: Any, step: Any) -> Segment:
    # Whether the batch fits the world is the configuration's to say (a packed batch of
    # documents need not be a multiple of the world): the saved world is planned anew.
    batch_ok = batch_size is None or _is_count(batch_size, 1)
    if not _is_count(num_replicas, 1) or not batch_ok or not _is_count(step):
        raise ValueError(
            f"state segment num_replicas={num_replicas!r}, batch_size={batch_size!r}, "
            f"step={step!r} is invalid"
        )
    return Segment(int(num_replicas), None if batch_size is None else int(batch_size), int(step))


def remaining_samples(scheduler: Scheduler, epoch: int, segments: Sequence[Segment]) -> np.ndarray:
    """The samples of ``epoch`` not trained during ``segments``, in training order (int64,
    each sample once). ``segments[0]`` ran the epoch's ordinary plan, every later one the
    ``plan_stream`` of what the previous left. Pure; see the module docstring."""
    segments = [_segment(*s) for s in segments]
    if not segments:
        raise ValueError("an elastic resume needs at least one saved segment")
    check_elastic(scheduler.config, segments[0])
    first = segments[0]
    old = _at_world(scheduler, first.num_replicas, first.batch_size)
    plan = old.plan_epoch(epoch)
    _check_step(first, plan.num_steps)
    if first.step == plan.num_steps:
        return np.empty(0, dtype=np.int64)
    cfg = scheduler.config
    order = epoch_order(cfg.shuffle, scheduler.num_samples, cfg.seed, epoch, scheduler.labels)
    stream = _plan_order(plan, order)
    trained = np.unique(plan.indices[: plan.bounds[first.step, 0]]).shape[0]
    stream = stream[trained:]
    for seg in segments[1:]:
        # Later plans cut the remaining stream in order, so a prefix of it is trained (of
        # their own order: a packed plan with outlier delay moves documents to later steps).
        if cfg.packing is not None:
            later = _at_world(scheduler, seg.num_replicas, seg.batch_size).plan_stream(
                epoch, stream
            )
            _check_step(seg, later.num_steps)
            if seg.step == later.num_steps:
                return np.empty(0, dtype=np.int64)
            trained = np.unique(later.indices[: later.bounds[seg.step, 0]]).shape[0]
            stream = _plan_order(later, stream)[trained:]
            continue
        counts = step_counts(
            per_replica(stream.shape[0], seg.num_replicas, cfg.drop_last),
            seg.batch_size,
            seg.num_replicas,
        )
        _check_step(seg, len(counts))
        if seg.step == len(counts):
            return np.empty(0, dtype=np.int64)
        stream = stream[sum(counts[: seg.step]) * seg.num_replicas :]
    return stream


def resume_plan(scheduler: Scheduler, epoch: int, segments: Sequence[Segment]) -> EpochPlan | None:
    """The plan of the rest of ``epoch`` at ``scheduler``'s world and batch size, after
    ``segments`` (oldest first). ``None`` when nothing was trained yet (one segment at step
    0): the epoch's ordinary plan applies. An epoch finished in its first segment gives an
    empty plan for every kind and policy; mid-epoch, ``check_elastic`` decides. Pure: equal
    arguments give byte-identical plans on every rank."""
    segments = [_segment(*s) for s in segments]
    if not segments:
        raise ValueError("an elastic resume needs at least one saved segment")
    first = segments[0]
    if len(segments) == 1 and first.step == 0:
        return None
    cfg = scheduler.config
    if cfg.packing is not None:
        steps = _at_world(scheduler, first.num_replicas, first.batch_size).num_steps(epoch)
    else:
        total = per_replica(scheduler.num_samples, first.num_replicas, cfg.drop_last)
        steps = len(step_counts(total, first.batch_size, first.num_replicas))
    _check_step(first, steps)
    if first.step == steps:
        return scheduler.plan_stream(epoch, np.empty(0, dtype=np.int64))
    return scheduler.plan_stream(epoch, remaining_samples(scheduler, epoch, segments))


def _at_world(scheduler: Scheduler, num_replicas: int, batch_size: int | None) -> Scheduler:
    """``scheduler`` with another world and batch size (a non-partitioned policy)."""
    cfg = scheduler.config
    if (num_replicas, batch_size) == (cfg.num_replicas, cfg.batch_size):
        return scheduler
    try:
        other = dataclasses.replace(
            cfg, num_replicas=num_replicas, batch_size=batch_size, groups=None
        )
    except ValueError as error:
        raise ValueError(f"the saved world cannot be planned: {error}") from None
    return Scheduler(scheduler.sizes, other, labels=scheduler.labels)


def _plan_order(plan: EpochPlan, order: np.ndarray) -> np.ndarray:
    """``plan``'s distinct samples step after step (within a step in ``order``'s order),
    then the samples of ``order`` the plan left out, in ``order``'s order."""
    n = order.shape[0]
    # ``order`` may be part of the data set (a remainder): index by sample number.
    size = 1 + int(max(order.max(initial=-1), plan.indices.max(initial=-1)))
    position = np.empty(size, dtype=np.int64)
    position[order] = np.arange(n)
    step_of = np.repeat(np.arange(plan.num_steps), plan.bounds[:, -1] - plan.bounds[:, 0])
    ordered = plan.indices[np.lexsort((position[plan.indices], step_of))]
    _, first = np.unique(ordered, return_index=True)
    ordered = ordered[np.sort(first)]
    left_out = np.ones(size, dtype=bool)
    left_out[ordered] = False
    return np.concatenate([ordered, order[left_out[order]]])


def _check_step(segment: Segment, steps: int) -> None:
    if segment.step > steps:
        raise ValueError(
            f"state step={segment.step} is outside the epoch's {steps} steps at "
            f"{segment.num_replicas} ranks with batch {segment.batch_size}"
        )


def _jsonable(value: Any) -> Any:
    """Tuples as lists, numpy scalars as Python ones: what a JSON round trip gives."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
