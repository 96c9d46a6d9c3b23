"""``StreamOptions``: how a stream is read and planned, declared once for every streamed face.

A streamed face (``chronica.torch.StreamingDataset``, ``chronica.tf.stream``,
``chronica.jax.stream``) takes two frozen objects: the plan request
(``chronica.ScheduleConfig``: the packing, the global batch, ``kind``, ``seed``, ``cost``,
``controller``), and ``StreamOptions``, what only a stream has (its planning window, its
shuffle buffer, whether it ends). ``check_stream_config`` says which plan requests a stream
can honour, once for all faces and the engine.

Example::

    >>> StreamOptions(window_steps=4, buffer_size=256)
    StreamOptions(window_steps=4, buffer_size=256, infinite=False)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from chronica.core.checks import check_bool, check_int
from chronica.core.config import ScheduleConfig

__all__ = ["StreamOptions", "check_stream_config"]

# Plan options a stream cannot honour, and what to do instead (they must keep their defaults).
_REFUSED = {
    "shuffle": "a stream is shuffled by its shard order and its buffer: use "
    "StreamOptions(buffer_size=...) (1 keeps the read order)",
    "window": "a stream plans StreamOptions(window_steps=...) steps at a time",
    "drop_last": "a stream plans its last, shorter step too (every sample once)",
    "jitter": "only guided and pool plans sort by size",
    "groups": "every rank reads its own lane of shards; there is no node partition",
    "min_batch": "a packed step gives each rank what its speed and the token cap allow",
    "max_batch": "a packed step gives each rank what its speed and the token cap allow",
}


@dataclass(frozen=True, repr=False)
class StreamOptions:
    """What a streamed face needs besides the plan (``chronica.ScheduleConfig``); frozen,
    validated on construction (``TypeError`` for a wrong type, ``ValueError`` for a wrong
    value, each naming the field).

    Args:
        window_steps: global steps planned at once (the window ``K``), ``>= 1``: the ranks
            exchange what they read once per window; memory grows with it, balance does not.
        buffer_size: the shuffle buffer's samples per rank, ``>= 1`` (1: read order).
        infinite: pass after pass without end (else each iteration is one pass).

    Example::

        >>> StreamOptions(window_steps=4).window_steps
        4
    """

    window_steps: int = 2
    buffer_size: int = 1024
    infinite: bool = False

    def __post_init__(self) -> None:
        window = check_int("window_steps", self.window_steps, 1, hint=" (steps per window)")
        object.__setattr__(self, "window_steps", window)
        buffer = check_int(
            "buffer_size",
            self.buffer_size,
            1,
            hint=" (the shuffle buffer's samples per rank; 1 keeps the read order)",
        )
        object.__setattr__(self, "buffer_size", buffer)
        object.__setattr__(self, "infinite", check_bool("infinite", self.infinite))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The fields, which the faces also accept as keywords of the same names."""
        return tuple(f.name for f in fields(cls))

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.field_names())
        return f"StreamOptions({values})"


def check_stream_config(config: Any) -> ScheduleConfig:
    """``config`` if a stream can be planned from it, else an error naming the field and
    the fix: it must pack (``packing=``, with ``long_documents`` ``"error"`` or
    ``"truncate"``; so the kind is ``"static"`` or ``"dynamic"``), and the plan options of
    a whole, shuffled data set (``shuffle``, ``window``, ``drop_last``, ``jitter``,
    ``groups``, ``min_batch``, ``max_batch``) keep their defaults.

    Args:
        config: the plan request.

    Example::

        >>> from chronica.core.packing import Packing
        >>> config = ScheduleConfig(num_replicas=2, batch_size=8, packing=Packing(max_tokens=64))
        >>> check_stream_config(config) is config
        True
    """
    if not isinstance(config, ScheduleConfig):
        raise TypeError(f"config={config!r} must be a chronica.ScheduleConfig")
    if config.packing is None:
        raise ValueError(
            "a stream is packed: pass packing=chronica.Packing(max_tokens=...) (its lengths "
            "are only known as the stream is read)"
        )
    if config.packing.long_documents == "split":
        raise ValueError(
            "streamed packing takes long_documents='error' or 'truncate'; 'split' needs "
            "every document's pieces up front"
        )
    plain = ScheduleConfig(num_replicas=1)
    for name, fix in _REFUSED.items():
        if getattr(config, name) != getattr(plain, name):
            raise ValueError(f"{name}={getattr(config, name)!r} does not apply to a stream: {fix}")
    return config
