"""Balanced packing of streamed data: a bounded planning window over what the ranks read.

Every ``K`` global batches the ranks pool the ``(id, length)`` pairs their lanes buffered
(plus carry-over) and plan them with the map-style kernels (``plan_window``); the lanes
(``LaneState``, ``deal_lanes``: shard order and shuffle buffer) and the window's pool make
the global ``StreamState``, which any world size can resume (``reshard``). Pure: no I/O,
no framework; ``chronica.runtime.streaming`` reads, exchanges and serves.

``window``  ``plan_window``/``WindowPlan``/``WindowStep``: one window planned for all ranks;
``lanes``   ``LaneState``/``deal_lanes``: which rows a rank reads and its shuffle buffer;
``state``   ``StreamState``/``reshard``/``consumed_positions``: the global state, resume;
``options`` ``StreamOptions``/``check_stream_config``: what a streamed face is asked for.

Example::

    >>> from chronica.core.packing import Packing
    >>> plan = plan_window(range(6), [3, 1, 2, 2, 4, 1], 2, Packing(max_tokens=4),
    ...                    batch_size=4)
    >>> len(plan.steps), plan.carry.tolist()
    (1, [4, 5])
"""

from chronica.core.streaming.lanes import LaneState, deal_lanes
from chronica.core.streaming.options import StreamOptions, check_stream_config
from chronica.core.streaming.state import (
    STREAM_STATE_VERSION,
    StreamState,
    consumed_positions,
    reshard,
)
from chronica.core.streaming.window import WindowPlan, WindowStep, plan_window

__all__ = [
    "STREAM_STATE_VERSION",
    "LaneState",
    "StreamOptions",
    "StreamState",
    "WindowPlan",
    "WindowStep",
    "check_stream_config",
    "consumed_positions",
    "deal_lanes",
    "plan_window",
    "reshard",
]
