"""From a face's call to one validated plan request and a ``RankStream``.

Every face (the torch samplers, ``chronica.tf.schedule``, ``chronica.jax.iterator``, the
Grain step source, the trainer glue built on them) takes the same plan options: the fields
of ``chronica.ScheduleConfig`` as keywords of the same names, or a whole ``config=``, plus
``dynamic=`` (``DynamicOptions``, the transport). A face declares ``**options`` and is
decorated with ``plan_face``, which gives it a signature and a docstring listing every plan
option, made from ``ScheduleConfig`` itself; the face passes the options to
``plan_request``. A new plan option is therefore a new field of ``ScheduleConfig`` (and of
the mode or kernel that uses it) and nothing else: every face accepts and documents it.

Example::

    >>> from chronica.runtime.request import plan_request
    >>> config, rank = plan_request(
    ...     {"kind": "guided"}, batch_size=64, num_replicas=4, rank=1, face="my_face"
    ... )
    >>> config.kind, rank
    (chronica.core.modes.GUIDED, 1)
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

import numpy as np

from chronica.core import ScheduleConfig, Scheduler
from chronica.core.checks import check_int, is_int
from chronica.core.elastic import StateFormat
from chronica.core.shuffle import as_shuffle_policy
from chronica.runtime.agreement import Agreement
from chronica.runtime.options import DynamicOptions
from chronica.runtime.stream import RankStream

__all__ = [
    "given_options",
    "groups_from_environment",
    "open_stream",
    "option_docs",
    "plan_face",
    "plan_request",
    "resolve_world",
]

logger = logging.getLogger("chronica")

_Face = TypeVar("_Face", bound=type)


def given_options(**values: Any) -> dict[str, Any]:
    """The plan options among ``values`` that differ from ``ScheduleConfig``'s defaults
    (same type and value), for faces that keep some options positional (torch's
    ``shuffle``, ``seed``, ``drop_last``) and so cannot tell a default from a given value.

    Args:
        values: plan options by name.
    """
    defaults = ScheduleConfig.option_defaults()
    return {
        name: value
        for name, value in values.items()
        if not (type(value) is type(defaults[name]) and value == defaults[name])
    }


def resolve_world(
    num_replicas: Any,
    rank: Any,
    detect: Callable[[], tuple[int, int]] | None,
    missing: str = "",
    config: ScheduleConfig | None = None,
) -> tuple[int, int]:
    """``(num_replicas, rank)``: the given values, else ``config``'s world size with a given
    rank, else the framework's own world from ``detect()``, validated.

    Args:
        num_replicas: the world size, or ``None`` to detect it.
        rank: this process's rank, or ``None`` to detect it.
        detect: returns the framework's ``(world, rank)``; ``None``: both must be given.
        missing: how to give them, for the error raised without ``detect``.
        config: a given configuration, whose world size counts as given.
    """
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
    """Nodes of ``LOCAL_WORLD_SIZE`` consecutive ranks (torchrun's layout), if it is set.

    Args:
        num_replicas: the world size, which ``LOCAL_WORLD_SIZE`` must divide.
    """
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not local:
        return None
    if not local.strip().isdigit() or int(local) < 1 or num_replicas % int(local):
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local} does not divide the world size {num_replicas}; "
            f"pass groups= (the node id of every rank)"
        )
    return [r // int(local) for r in range(num_replicas)]


def plan_request(
    options: Mapping[str, Any],
    *,
    batch_size: int | None,
    num_replicas: Any,
    rank: Any,
    face: str,
    config: ScheduleConfig | None = None,
    dynamic: DynamicOptions | None = None,
    detect: Callable[[], tuple[int, int]] | None = None,
    batch_name: str = "batch_size",
    needs_step: bool = False,
    missing: str = "",
) -> tuple[ScheduleConfig, int]:
    """The one ``ScheduleConfig`` of a face's call, and this process's rank.

    ``config`` is taken as given (its world must be the face's, and no plan option may be
    passed beside it); otherwise one is built from ``batch_size`` and ``options``; a
    partitioned shuffle without ``groups`` takes them from ``LOCAL_WORLD_SIZE``.

    Args:
        options: the plan options the face was given (names of
            ``ScheduleConfig.option_names()``); an unknown name raises ``TypeError``.
        batch_size: the global batch, under the face's name ``batch_name``.
        num_replicas: the world size, or ``None`` (from ``config`` or ``detect``).
        rank: this process's rank, or ``None`` (from ``detect``).
        face: the face's name, for error messages.
        config: a whole configuration instead of ``batch_size`` and ``options``.
        dynamic: the transport options, checked for their type here.
        detect: returns the framework's ``(world, rank)`` (see ``resolve_world``).
        batch_name: what the face calls the global batch.
        needs_step: the face yields whole steps, so a step size (a batch size or a packing
            token budget) is required.
        missing: how to give the world without ``detect`` (see ``resolve_world``).
    """
    names = ScheduleConfig.option_names()
    for name in options:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{face}() got an unexpected keyword argument {name!r}{hint} (its plan "
                f"options are the fields of chronica.ScheduleConfig: {', '.join(names)})"
            )
    if dynamic is not None and not isinstance(dynamic, DynamicOptions):
        raise TypeError(f"dynamic={dynamic!r} must be a chronica.runtime.DynamicOptions (or None)")
    if config is not None and not isinstance(config, ScheduleConfig):
        raise TypeError(f"config={config!r} must be a chronica.ScheduleConfig (or None)")
    budget = getattr(options.get("packing"), "tokens_per_step", None) is not None
    if needs_step and batch_size is None and config is None and not budget:
        raise ValueError(f"{batch_name} (the global batch over all ranks) is required")
    world, rank = resolve_world(num_replicas, rank, detect, missing, config)
    if config is not None:
        given = [*options, *([batch_name] if batch_size not in (None, config.batch_size) else [])]
        if given:
            raise ValueError(
                f"config= already holds the whole configuration; pass {', '.join(given)} "
                "inside it (dataclasses.replace(config, ...)) instead of beside it"
            )
        if config.num_replicas != world:
            raise ValueError(
                f"config.num_replicas={config.num_replicas} differs from the world size "
                f"{world}; build the config for this world"
            )
    else:
        config = _config(options, world, batch_size, batch_name)
    if needs_step and config.batch_size is None and config.packing is None:
        raise ValueError("config.batch_size (the global batch over all ranks) is required")
    return config, rank


def _config(
    options: Mapping[str, Any], world: int, batch_size: int | None, batch_name: str
) -> ScheduleConfig:
    options = dict(options)
    if (
        options.get("groups") is None
        and as_shuffle_policy(options.get("shuffle", True)).partitioned
    ):
        options["groups"] = groups_from_environment(world)
    try:
        return ScheduleConfig(num_replicas=world, batch_size=batch_size, **options)
    except (TypeError, ValueError) as error:
        if batch_name != "batch_size" and str(error).startswith("batch_size="):
            raise type(error)(batch_name + str(error)[len("batch_size") :]) from None
        raise


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
    """A ``RankStream`` for ``rank`` over validated ``sizes``.

    Args:
        sizes: one size per sample.
        config: the plan request (from ``plan_request``).
        rank: this process's rank.
        labels: one class per sample (stratified shuffles, ``label_skew``).
        partitions: one index list per node (partitioned shuffles).
        dynamic: the transport to rank 0's coordinator, for a mode that opens a session.
        agree: builds the framework's all-ranks agreement from the scheduler; called only
            when the mode opens a session and there is more than one rank.
        names: the face's names in state errors.
    """
    scheduler = Scheduler(sizes, config, labels=labels, partitions=partitions)
    if config.shuffle.partitioned and config.exact and config.batch_size:
        if scheduler.owners.sizes().max() == 1:
            logger.warning(
                "chronica: with shuffle=%r and one rank per node, exact mode cannot balance "
                "(each rank trains its own partition in its own order); pass exact=False",
                config.shuffle.kind,
            )
    agreement = None
    if config.mode.opens_session and config.num_replicas > 1 and agree is not None:
        agreement = agree(scheduler)
    return RankStream(scheduler, rank, dynamic=dynamic, agree=agreement, names=names)


# -- signatures and documentation of the faces ----------------------------------------------


def option_docs(cls: type = ScheduleConfig) -> dict[str, str]:
    """Every field's entry of ``cls``'s ``Args:`` section (``ScheduleConfig``'s plan options
    by default), by name, each on one line.

    Args:
        cls: a class whose docstring has an ``Args:`` section.
    """
    doc = inspect.cleandoc(cls.__doc__ or "")
    section = doc.split("Args:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.split(r"\n(?=    \w+:)", "\n" + section)
    out = {}
    for entry in entries:
        if entry.strip():
            name, text = entry.strip().split(":", 1)
            out[name] = " ".join(text.split())
    return out


def plan_face(cls: _Face) -> _Face:
    """Class decorator of a face whose ``__init__`` takes ``**options``: its signature gets
    every plan option it does not name itself as a keyword-only parameter (with
    ``ScheduleConfig``'s default), and its docstring a "Plan options" section, both made
    from ``ScheduleConfig``, so that no face retypes them.

    Args:
        cls: the face class.
    """
    init = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    params = list(signature.parameters.values())
    if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        raise TypeError(f"{cls.__name__}.__init__ must end with **options to be a plan face")
    own = {p.name for p in params}
    defaults = ScheduleConfig.option_defaults()
    types = {f.name: f.type for f in fields(ScheduleConfig)}
    added = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name], annotation=types[name]
        )
        for name in ScheduleConfig.option_names()
        if name not in own
    ]
    init.__signature__ = signature.replace(parameters=[*params[:-1], *added])
    docs = option_docs()
    lines = "\n".join(
        textwrap.fill(
            f"{name}: {docs[name]}", 92, initial_indent="    ", subsequent_indent="        "
        )
        for name in ScheduleConfig.option_names()
        if name not in own
    )
    cls.__doc__ = (
        (inspect.cleandoc(cls.__doc__ or "")).rstrip()
        + "\n\nPlan options (keywords; the fields of ``chronica.ScheduleConfig``, which "
        "``config=`` gives whole):\n" + lines + "\n"
    )
    return cls
