"""From an adapter's arguments to a ``RankStream``: world, configuration, sizes, scheduler.

Every adapter takes the same scheduling arguments with the same defaults (``SCHEDULING``)
or one ``ScheduleConfig`` instead, plus ``DynamicOptions`` for ``kind="dynamic"``; the
functions here turn them into one validated ``ScheduleConfig`` and a stream, so no adapter
assembles a configuration or resolves a world of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chronica.core import ScheduleConfig, Scheduler, as_shuffle_policy
from chronica.core.checks import check_int, is_int
from chronica.core.elastic import StateFormat
from chronica.runtime.agreement import Agreement
from chronica.runtime.options import DynamicOptions
from chronica.runtime.stream import RankStream

__all__ = [
    "SCHEDULING",
    "batch_config",
    "groups_from_environment",
    "open_stream",
    "resolve_world",
    "schedule_config",
    "scheduling_arguments",
]

logger = logging.getLogger("chronica")

# The scheduling arguments every adapter accepts, with their common defaults.
SCHEDULING: Mapping[str, Any] = {
    "kind": "static",
    "exact": True,
    "shuffle": True,
    "seed": 0,
    "drop_last": False,
    "cost": None,
    "groups": None,
    "variable_batch": False,
    "packing": None,
}


def scheduling_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SCHEDULING`` keywords out of a face's arguments (its ``locals()``)."""
    return {name: arguments[name] for name in SCHEDULING}


def resolve_world(
    num_replicas: Any,
    rank: Any,
    detect: Callable[[], tuple[int, int]] | None,
    missing: str = "",
    config: ScheduleConfig | None = None,
) -> tuple[int, int]:
    """``(num_replicas, rank)``: the given values, else ``config``'s world size with a given
    rank, else the framework's own world from ``detect()``, validated. Without ``detect`` a
    missing value raises ``ValueError`` with ``missing`` (how to give it); numpy integers
    are accepted."""
    if config is not None and num_replicas is None and rank is not None:
        num_replicas = config.num_replicas
    if num_replicas is None or rank is None:
        if detect is None:
            raise ValueError(f"num_replicas and rank are required: {missing}")
        world, me = detect()
        num_replicas = world if num_replicas is None else num_replicas
        rank = me if rank is None else rank
    num_replicas = check_int("num_replicas", num_replicas, 1)
    if not is_int(rank) or not 0 <= rank < num_replicas:
        # torch's DistributedSampler message, kept for drop-in compatibility.
        raise ValueError(
            f"Invalid rank {rank!r}, rank should be in the interval [0, {num_replicas - 1}]"
        )
    return num_replicas, int(rank)


def groups_from_environment(num_replicas: int) -> list[int] | None:
    """Nodes of ``LOCAL_WORLD_SIZE`` consecutive ranks (torchrun's layout), if it is set."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not local:
        return None
    if not local.strip().isdigit() or int(local) < 1 or num_replicas % int(local):
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local} does not divide the world size {num_replicas}; "
            f"pass groups= (the node id of every rank)"
        )
    return [r // int(local) for r in range(num_replicas)]


def schedule_config(
    config: ScheduleConfig | None,
    num_replicas: int,
    batch_size: int | None,
    scheduling: Mapping[str, Any],
    dynamic: DynamicOptions | None,
    batch_name: str = "batch_size",
) -> ScheduleConfig:
    """The one ``ScheduleConfig`` of an adapter's arguments: ``config`` as given (its world
    must be ``num_replicas``; the scheduling keywords must then keep their defaults), or
    one assembled from ``batch_size``, the ``scheduling`` keywords (names of ``SCHEDULING``)
    and ``dynamic``'s plan-shaping knobs. A partitioned shuffle without ``groups`` takes
    them from ``LOCAL_WORLD_SIZE``."""
    if dynamic is not None and not isinstance(dynamic, DynamicOptions):
        raise ValueError(f"dynamic={dynamic!r} must be a chronica.runtime.DynamicOptions (or None)")
    if config is not None:
        if not isinstance(config, ScheduleConfig):
            raise ValueError(f"config={config!r} must be a chronica.ScheduleConfig (or None)")
        changed = [k for k, v in scheduling.items() if _differs(v, SCHEDULING[k])]
        if batch_size is not None and batch_size != config.batch_size:
            changed.append(batch_name)
        if changed or dynamic is not None:
            extra = [*changed, *(["dynamic"] if dynamic is not None else [])]
            raise ValueError(
                f"config= already holds the whole configuration; pass {', '.join(extra)} "
                "inside it (dataclasses.replace(config, ...)) instead of beside it"
            )
        if config.num_replicas != num_replicas:
            raise ValueError(
                f"config.num_replicas={config.num_replicas} differs from the world size "
                f"{num_replicas}; build the config for this world"
            )
        return config
    options = dynamic or DynamicOptions()
    shuffle = as_shuffle_policy(scheduling["shuffle"])
    groups = scheduling["groups"]
    if groups is None and shuffle.partitioned:
        groups = groups_from_environment(num_replicas)
    try:
        return ScheduleConfig(
            num_replicas=num_replicas,
            batch_size=batch_size,
            kind=scheduling["kind"],
            exact=scheduling["exact"],
            shuffle=shuffle,
            seed=scheduling["seed"],
            drop_last=scheduling["drop_last"],
            cost=scheduling["cost"],
            groups=groups,
            variable_batch=scheduling["variable_batch"],
            packing=scheduling["packing"],
            window=options.window,
            min_batch=options.min_batch,
            max_batch=options.max_batch,
            controller=options.controller,
        )
    except ValueError as error:
        if batch_name != "batch_size" and str(error).startswith("batch_size="):
            raise ValueError(batch_name + str(error)[len("batch_size") :]) from None
        raise


def batch_config(
    config: ScheduleConfig | None,
    num_replicas: Any,
    rank: Any,
    global_batch_size: int | None,
    scheduling: Mapping[str, Any],
    dynamic: DynamicOptions | None,
    detect: Callable[[], tuple[int, int]] | None,
) -> tuple[ScheduleConfig, int]:
    """``(config, rank)`` of a face whose batch is the global batch (``global_batch_size``,
    the JAX iterator and the Grain step source): ``resolve_world`` then ``schedule_config``,
    refusing a configuration without a batch size unless packing holds a token budget."""
    packing = scheduling.get("packing")
    budget = packing is not None and packing.tokens_per_step is not None
    if global_batch_size is None and config is None and not budget:
        raise ValueError("global_batch_size (the batch over all processes) is required")
    world, rank = resolve_world(num_replicas, rank, detect, config=config)
    cfg = schedule_config(
        config, world, global_batch_size, scheduling, dynamic, "global_batch_size"
    )
    if cfg.batch_size is None and cfg.packing is None:
        raise ValueError("config.batch_size (the batch over all processes) is required")
    return cfg, rank


def open_stream(
    sizes: np.ndarray,
    config: ScheduleConfig,
    rank: int,
    *,
    labels: Any = None,
    partitions: Sequence[Any] | None = None,
    dynamic: DynamicOptions | None = None,
    agree: Callable[[Scheduler], Agreement | None] | None = None,
    names: StateFormat | None = None,
) -> RankStream:
    """A ``RankStream`` for ``rank`` over validated ``sizes``. ``agree(scheduler)`` builds
    the framework's all-ranks agreement; it is called only for ``kind="dynamic"`` at more
    than one rank."""
    scheduler = Scheduler(sizes, config, labels=labels, partitions=partitions)
    if config.shuffle.partitioned and config.exact and config.batch_size:
        if scheduler.owners.sizes().max() == 1:
            logger.warning(
                "chronica: with shuffle=%r and one rank per node, exact mode cannot balance "
                "(each rank trains its own partition in its own order); pass exact=False",
                config.shuffle.kind,
            )
    agreement = None
    if config.kind == "dynamic" and config.num_replicas > 1 and agree is not None:
        agreement = agree(scheduler)
    return RankStream(scheduler, rank, dynamic=dynamic, agree=agreement, names=names)


def _differs(value: Any, default: Any) -> bool:
    if default is None:
        return value is not None
    return not (type(value) is type(default) and value == default)
