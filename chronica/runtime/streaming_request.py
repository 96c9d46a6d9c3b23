"""From a streamed face's call to its two requests: the plan (``chronica.ScheduleConfig``) and
the stream's own options (``chronica.StreamOptions``).

The streamed faces (``chronica.torch.StreamingDataset``, ``chronica.tf.stream``,
``chronica.jax.stream``) take ``source, packing`` and ``batch_size=`` as the map-style faces
do, every plan option as a keyword (or a whole ``config=``) and every stream option as a
keyword (or a whole ``stream=``). A face declares ``**options`` and is decorated with
``stream_face``, which gives it a signature and a docstring listing both kinds of option,
made from the two classes; it hands what it was given to ``stream_request``. A new stream
option is therefore a new field of ``StreamOptions`` and nothing else.

Example::

    >>> from chronica.core.packing import Packing
    >>> from chronica.runtime.streaming_exchange import LocalGroup
    >>> config, stream = stream_request(
    ...     {"buffer_size": 64, "seed": 3}, packing=Packing(max_tokens=512), batch_size=16,
    ...     collectives=LocalGroup(1).rank(0), face="my_face")
    >>> config.seed, stream.buffer_size
    (3, 64)
"""

from __future__ import annotations

import difflib
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from chronica.core import ScheduleConfig
from chronica.core.streaming import StreamOptions, check_stream_config
from chronica.runtime.request import option_docs, plan_face, plan_request
from chronica.runtime.streaming_exchange import Collectives

__all__ = ["stream_face", "stream_request"]

_Face = TypeVar("_Face", bound=type)


def stream_request(
    options: Mapping[str, Any],
    *,
    packing: Any,
    batch_size: int | None,
    collectives: Collectives,
    face: str,
    config: ScheduleConfig | None = None,
    stream: StreamOptions | None = None,
) -> tuple[ScheduleConfig, StreamOptions]:
    """The plan request and the stream options of a streamed face's call, validated once
    (``check_stream_config``): ``config`` or the plan options among ``options`` (with
    ``packing`` and ``batch_size``), for a world of ``collectives.world_size`` ranks;
    ``stream`` or the stream options among ``options``. An option given both whole and as
    a keyword raises ``ValueError``, an unknown keyword ``TypeError`` naming the closest.

    Args:
        options: the keywords the face was given besides its own.
        packing: the face's ``packing`` (``None``: inside ``config``).
        batch_size: the global batch in samples (``None``: a token budget, or ``config``'s).
        collectives: this rank's collectives (the world size and rank).
        face: the face's name, for error messages.
        config: a whole plan request instead of ``packing``, ``batch_size`` and the plan
            options.
        stream: whole stream options instead of their keywords.
    """
    names = StreamOptions.field_names()
    known = (*ScheduleConfig.option_names(), *names)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{face}() got an unexpected keyword argument {name!r}{hint} (its options are "
                "the fields of chronica.ScheduleConfig and chronica.StreamOptions)"
            )
    given = {name: value for name, value in options.items() if name in names}
    plan = {name: value for name, value in options.items() if name not in names}
    if stream is not None:
        if not isinstance(stream, StreamOptions):
            raise TypeError(f"stream={stream!r} must be a chronica.StreamOptions (or None)")
        if given:
            raise ValueError(
                f"stream= already holds the stream options; pass {', '.join(given)} inside it "
                "(dataclasses.replace(stream, ...)) instead of beside it"
            )
    else:
        stream = StreamOptions(**given)
    if packing is not None:
        if config is not None:
            raise ValueError(
                "config= already holds the packing; pass it inside config "
                "(dataclasses.replace(config, packing=...)) instead of beside it"
            )
        plan["packing"] = packing
    config, _ = plan_request(
        plan,
        batch_size=batch_size,
        num_replicas=collectives.world_size,
        rank=collectives.rank,
        face=face,
        config=config,
        needs_step=True,
    )
    return check_stream_config(config), stream


def stream_face(cls: _Face) -> _Face:
    """Class decorator of a streamed face whose ``__init__`` ends with ``**options``: the
    plan options (``plan_face``) and then the stream options become keyword-only
    parameters of its signature, with their defaults, and its docstring gets a "Stream
    options" section made from ``StreamOptions``'s.

    Args:
        cls: the face class.
    """
    plan_face(cls)
    init = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    defaults = StreamOptions()
    types = {f.name: f.type for f in fields(StreamOptions)}
    added = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=getattr(defaults, name),
            annotation=types[name],
        )
        for name in StreamOptions.field_names()
    ]
    init.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *added])
    docs = option_docs(StreamOptions)
    lines = "\n".join(
        textwrap.fill(
            f"{name}: {docs[name]}", 92, initial_indent="    ", subsequent_indent="        "
        )
        for name in StreamOptions.field_names()
    )
    cls.__doc__ = (
        (cls.__doc__ or "").rstrip()
        + "\n\nStream options (keywords; the fields of ``chronica.StreamOptions``, which "
        "``stream=`` gives whole):\n" + lines + "\n"
    )
    return cls
