"""``StreamingEngine``: one rank's packed, balanced micro-batches from a sharded stream.

Every rank reads its own lane of shards (``chronica.core.streaming.lanes``: shards dealt by
``(seed, epoch)``, a bounded shuffle buffer), and every ``window_steps`` global batches the
ranks exchange what they buffered (ids, lengths and lane states, and with
``kind="dynamic"`` step-time reports, ``chronica.runtime.streaming_speeds``: one
``allgather``), plan
the pool with the map-style kernels (``plan_window``) and bring every sample to its planned
rank: that rank reads it by index where the source has random access (``read_rows``), else
the rank holding the record sends it (one ``alltoall``; the bytes are counted in
``stats``). A planning thread builds window ``i + 1`` while the trainer consumes window
``i``. Framework-free: the collectives are injected (``Collectives``).

Memory per rank: the shuffle buffer (``buffer_size`` records), the samples the rank
contributed to the window being built and its share of the carry-over (under one global
batch), and at most two planned windows of its own micro-batches (``window_steps`` steps
each), whatever the size of the stream.

``state_dict()`` is the global ``StreamState`` at the micro-batch last yielded (every rank
returns the same); ``StreamingEngine(..., state=...)`` resumes it bitwise for the same
world size, and with exactly-once for the rest of the pass for another.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chronica.core import ScheduleConfig
from chronica.core.streaming import (
    LaneState,
    StreamOptions,
    StreamState,
    WindowPlan,
    check_stream_config,
    deal_lanes,
    plan_window,
    reshard,
)
from chronica.runtime.sources.base import read_ids, shard_offsets
from chronica.runtime.streaming_batch import CPU_PARTS, StreamMicroBatch, StreamStats
from chronica.runtime.streaming_exchange import Collectives, decode, encode, fetch_records
from chronica.runtime.streaming_lane import ReadingLane
from chronica.runtime.streaming_records import RecordTable
from chronica.runtime.streaming_speeds import StreamSpeeds

__all__ = ["CPU_PARTS", "StreamMicroBatch", "StreamStats", "StreamingEngine", "reads_by_id"]

_END = object()


def reads_by_id(source: Any) -> bool:
    """Whether the engine can plan over ``source``'s lengths alone and read each planned
    sample by id: it has random access and reads lengths without records
    (``random_access`` and ``lengths_without_records``: ``MDSSource`` or ``ParquetSource``
    over a length column). What ``decode=False`` needs, and what a face that plans in one
    process and reads in others asks.

    Args:
        source: a ``ShardedSource``.

    Example::

        >>> reads_by_id(MDSSource(folder, length="input_ids"))
        True
    """
    return bool(source.random_access) and bool(getattr(source, "lengths_without_records", False))


@dataclass
class _Window:
    """A planned window as this rank serves it."""

    state: StreamState
    plan: WindowPlan
    records: RecordTable | None  # None: read by id as the micro-batches are built
    start: int = 0
    batches: list[StreamMicroBatch] = field(default_factory=list)
    resumed: bool = False


@dataclass
class _Run:
    """One ``micro_batches()`` run: the planned windows' queue and the stop signal."""

    out: queue.Queue[Any]
    stop: threading.Event


@dataclass
class _Carry:
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    holders: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    held: RecordTable = field(default_factory=RecordTable.empty)


class StreamingEngine:
    """This rank's micro-batches of a sharded ``source`` (see the module docstring).

    Args:
        source: a ``ShardedSource`` (``num_shards``, ``random_access``, ``shard_size``,
            ``read``, ``read_rows``, ``length``).
        config: the plan (``chronica.ScheduleConfig`` for ``collectives.world_size``
            ranks, accepted by ``check_stream_config``): its ``packing`` (cap, rows,
            objective, padding; ``tokens_per_step``: steps of about that many tokens;
            ``long_documents="truncate"`` cuts long samples to a row), ``batch_size``
            (samples per global step), ``seed`` (shard order, shuffle buffers), ``cost``.
        collectives: this rank's ``Collectives`` (``rank``, ``world_size``).
        stream: the window ``K``, the shuffle buffer and whether the stream ends
            (``chronica.StreamOptions``).
        state: a ``state_dict()`` to resume from (any world size), or ``None``.
        decode: ``False``: plan only; the micro-batches carry no records (``records``
            empty) for another process to read by id (``StreamMicroBatch.with_records``);
            the source must read by id (``reads_by_id``). ``True``: the records are read
            here, by id where the source reads by id and its ``read_rows`` decodes the
            rows asked alone (``reads_rows_alone``, true unless the source says false, as
            ``ParquetSource`` does), else through the lanes.

    Example::

        group = LocalGroup(1)
        config = ScheduleConfig(num_replicas=1, batch_size=64, packing=Packing(max_tokens=4096))
        engine = StreamingEngine(source, config, group.rank(0), StreamOptions(window_steps=2))
        for batch in engine.micro_batches(): ...
    """

    def __init__(
        self,
        source: Any,
        config: ScheduleConfig,
        collectives: Collectives,
        stream: StreamOptions | None = None,
        *,
        state: dict[str, Any] | None = None,
        decode: bool = True,
    ) -> None:
        config = check_stream_config(config)
        stream = StreamOptions() if stream is None else stream
        if not isinstance(stream, StreamOptions):
            raise TypeError(f"stream={stream!r} must be a chronica.StreamOptions")
        if not isinstance(collectives, Collectives):
            raise TypeError("collectives must have rank, world_size, allgather and alltoall")
        if config.num_replicas != collectives.world_size:
            raise ValueError(
                f"config.num_replicas={config.num_replicas} differs from the "
                f"{collectives.world_size} ranks of collectives; build the config for them"
            )
        assert config.packing is not None
        self.source, self.config, self.options = source, config, stream
        self.collectives, self.packing = collectives, config.packing
        self.batch_size, self.seed, self.cost = config.batch_size, config.seed, config.cost
        self.window_steps, self.buffer_size = stream.window_steps, stream.buffer_size
        self.infinite = stream.infinite
        self.rank, self.world_size = int(collectives.rank), int(collectives.world_size)
        self.stats = StreamStats()
        self._offsets = shard_offsets(source)
        if not isinstance(decode, bool):
            raise TypeError(f"decode must be a bool, got {type(decode).__name__}")
        # Read by id (reads_by_id): the lanes hold ids and lengths only, and each planned
        # sample is read by id once, when gathered. Decoding here, a source whose read_rows
        # decodes more than the rows asked (reads_rows_alone false: parquet's whole row
        # groups) is read by its lanes instead, each row group once and in order: by id, the
        # ranks would decode as many row groups and read the length column besides.
        by_id = reads_by_id(source)
        self.reads_by_id = by_id and not (decode and not getattr(source, "reads_rows_alone", True))
        if not (decode or by_id):
            raise ValueError(
                f"decode=False plans without reading records, which needs a source that "
                f"reads by id (random_access and lengths_without_records); {source!r} does "
                "not: keep decode=True (the engine reads the records itself)"
            )
        self.decode = decode
        self._position = self._start(state)
        self._served = self._position.consumed
        self.speeds = StreamSpeeds(config, self.rank, self._position, state)
        self._thread: threading.Thread | None = None
        self._run = _Run(queue.Queue(maxsize=1), threading.Event())

    def __repr__(self) -> str:
        return (
            f"StreamingEngine(rank={self.rank}, world_size={self.world_size}, "
            f"{self.options!r}, {self.config!r}{'' if self.decode else ', decode=False'})"
        )

    @property
    def num_samples(self) -> int:
        """Samples in one pass of the stream."""
        return int(self._offsets[-1])

    def resumed(self, state: dict[str, Any]) -> StreamingEngine:
        """A new engine of the same stream (source, packing, collectives and options),
        starting at ``state``; this one is closed first.

        Args:
            state: what ``state_dict()`` returned, from a run of any world size.
        """
        self.close()
        return StreamingEngine(
            self.source, self.config, self.collectives, self.options, state=state,
            decode=self.decode,
        )  # fmt: skip

    def position(self) -> tuple[StreamState, int]:
        """Where the stream stands after the micro-batch last yielded, as a value for
        ``state_dict(at=...)``: no copy, cheap enough to keep one per micro-batch for a
        consumer that runs ahead of training."""
        return self._position, self._served

    def state_dict(self, at: tuple[StreamState, int] | None = None) -> dict[str, Any]:
        """The global state at the last micro-batch yielded (the same on every rank), or
        at ``at`` (a ``position()`` taken earlier), and with ``kind="dynamic"`` this rank's
        reports not exchanged yet (``"reports_due"``).

        Args:
            at: a ``position()`` of this engine, or ``None`` (the last micro-batch yielded).
        """
        position, served = self.position() if at is None else at
        return replace(position, consumed=served).to_dict() | self.speeds.rank_state()

    def report(self, seconds: float, step: int | None = None) -> None:
        """With ``kind="dynamic"``: this rank's own compute time of ``step`` (default: the
        step of the micro-batch last yielded), forward and backward before the gradient
        all-reduce; the windows planned later give a slower rank less work
        (``chronica.runtime.streaming_speeds``). Without it nothing happens.

        Args:
            seconds: the rank's compute time of the step.
            step: the global step, or ``None``.
        """
        self.speeds.report(seconds, step)

    def micro_batches(self) -> Iterator[StreamMicroBatch]:
        """This rank's micro-batches from the saved position to the end of the pass (or
        forever with ``infinite``); every rank yields the same count."""
        self.close()
        run = self._run = _Run(queue.Queue(maxsize=1), threading.Event())
        self._thread = threading.Thread(
            target=self._produce,
            args=(replace(self._position, consumed=self._served), run),
            daemon=True,
        )
        self._thread.start()
        try:
            while True:
                start = time.perf_counter()
                window = run.out.get()
                self.stats.waiting += time.perf_counter() - start
                if window is _END:
                    break
                if isinstance(window, BaseException):
                    raise window
                self._position, self._served = window.state, window.start
                self.speeds.taken(window.state, window.plan, window.resumed)
                yield from self._serve(window)
        finally:
            run.stop.set()

    def close(self) -> None:
        """Stop the planning thread and wait for it: it takes part in one more window's
        exchange, which tells every rank's thread to stop after that window, so no rank is
        left waiting in a collective whatever each consumer had prefetched. Call it on every
        rank at the same point of the stream, before the process group is destroyed, when a
        pass is left unfinished. A later ``micro_batches()`` starts again from
        ``state_dict()``."""
        if self._thread is not None:
            self._run.stop.set()
            self._thread.join()
            self._thread = None

    def _serve(self, window: _Window) -> Iterator[StreamMicroBatch]:
        for served, batch in enumerate(window.batches, start=1):
            if served > window.start:
                self._served = served
                self.speeds.served(batch.step)
                yield batch

    def _prepared(self, window: _Window) -> _Window:
        """The window with this rank's micro-batches built, in the planning thread: the
        window's samples of this rank sorted once by (step, micro-batch, row, pool
        position), its records gathered once; every micro-batch is a slice of them (an
        empty one where the rank has no sample in it). The consumer only hands them out."""
        me, state, steps = self.rank, window.state, window.plan.steps
        empty, cpu = np.zeros(0, np.int64), time.thread_time()
        first = np.cumsum([0] + [s.num_micro for s in steps])
        part = [s.rank == me for s in steps]
        ids, lengths, rows, micro, position = (
            np.concatenate([empty, *(v[m] for v, m in zip(column, part, strict=True))])
            for column in (
                [s.ids for s in steps],
                [s.lengths for s in steps],
                [s.row for s in steps],
                [first[i] + s.micro for i, s in enumerate(steps)],
                [np.arange(s.ids.shape[0]) for s in steps],
            )
        )
        order = np.lexsort((position, rows, micro))
        ids, lengths, rows = ids[order], lengths[order], rows[order]
        cut = np.searchsorted(micro[order], np.arange(first[-1] + 1)).tolist()
        if not self.decode:  # the plan alone: another process reads the records by id
            records: list[Any] = []
        elif window.records is None:  # read by id, in the order served (counted as reading)
            read = time.thread_time()
            records = read_ids(self.source, self._offsets, ids.tolist())
            self.stats.rows_fetched += len(records)
            cpu += (read := time.thread_time() - read)
            self.stats.cpu["reading"] += read
        else:
            records = window.records.take(ids).tolist()
        for index, step in enumerate(steps):
            weights = step.weights[me].tolist()
            for m in range(step.num_micro):
                a, b = cut[first[index] + m], cut[first[index] + m + 1]
                window.batches.append(
                    StreamMicroBatch.of(
                        records=records[a:b],
                        ids=ids[a:b],
                        lengths=lengths[a:b],
                        rows=rows[a:b],
                        epoch=state.epoch,
                        step=state.step + index,
                        micro=m,
                        num_micro=step.num_micro,
                        loss_weight=weights[m],
                    )
                )
        window.records = None
        self.stats.cpu["assembling"] += time.thread_time() - cpu
        return window

    # The planning thread -------------------------------------------------------------

    def _start(self, state: dict[str, Any] | None) -> StreamState:
        """The position to start from: before the first window, or a saved state taken
        over by this world (``reshard`` when the world changed)."""
        if state is None:
            sizes = np.diff(self._offsets)
            lanes = deal_lanes(sizes, self.world_size, self.seed, 0, self.buffer_size)
            empty = np.zeros(0, np.int64)
            return StreamState(self.world_size, 0, -1, 0, 0, empty, empty, empty, tuple(lanes))
        saved = StreamState.from_dict(state)
        if saved.world_size == self.world_size:
            return saved
        return reshard(saved, self._plan(saved), self.world_size, self.seed)

    def _plan(self, state: StreamState) -> WindowPlan:
        start, cpu = time.perf_counter(), time.thread_time()
        plan = plan_window(
            state.pool_ids, state.pool_lengths, state.world_size, self.packing,
            batch_size=self.batch_size, final=state.exhausted, cost=self.cost,
            speeds=state.speeds if state.speeds.shape[0] else None,
        )  # fmt: skip
        self.stats.planning += time.perf_counter() - start
        self.stats.cpu["planning"] += time.thread_time() - cpu
        return plan

    def _produce(self, position: StreamState, run: _Run) -> None:
        # How the ranks' threads end together: a stopped thread does not wait for room in
        # its queue; it builds the next window, whose exchange carries its stop, and every
        # rank's thread ends after the first window whose exchange carries one. The threads
        # meet in every exchange, so they all end after the same window, however many
        # windows each rank's consumer had taken or prefetched.
        def put(item: Any) -> bool:
            while True:
                try:
                    run.out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    if run.stop.is_set():
                        return False

        try:
            state, consumed = position, position.consumed
            lane = self._restore_lane(state.lanes[self.rank])
            plan = self._plan(state)
            carry = self._restored_carry(state, plan)
            if state.exhausted and carry.ids.shape[0] == 0 and consumed >= plan.num_micro:
                state, plan, lane = self._next_epoch(state, plan)
            elif consumed < plan.num_micro:
                mine = [i for s in plan.steps for i in s.ids[s.rank == self.rank].tolist()]
                window = _Window(state, plan, None if self.reads_by_id else self._fetch(mine))
                window.start, window.resumed = consumed, True
                put(self._prepared(window))
            while True:
                if state.exhausted and carry.ids.shape[0] == 0:
                    if not self.infinite:
                        put(_END)
                        return
                    state, plan, lane = self._next_epoch(state, plan)
                reports = self.speeds.due(state.sequence + 1, run.stop)
                state, plan, records, carry, stopping = self._window(
                    state, plan, lane, carry, run.stop.is_set(), reports
                )
                if stopping:
                    with contextlib.suppress(queue.Full):
                        run.out.put_nowait(_END)  # a consumer still waiting ends its pass
                    return
                put(self._prepared(_Window(state, plan, records)))
        except BaseException as error:  # handed to the consumer, raised there
            put(error)

    def _next_epoch(
        self, state: StreamState, plan: WindowPlan
    ) -> tuple[StreamState, WindowPlan, ReadingLane]:
        """The next pass's start after ``state``'s window (its last), and its empty plan."""
        sizes = np.diff(self._offsets)
        lanes = deal_lanes(sizes, self.world_size, self.seed, state.epoch + 1, self.buffer_size)
        empty = np.zeros(0, np.int64)
        fresh = StreamState(
            self.world_size, state.epoch + 1, -1, state.step + len(plan.steps), 0, empty, empty,
            empty, tuple(lanes), sequence=state.sequence, speeds=state.speeds,
            reports=state.reports,
        )  # fmt: skip
        return fresh, self._plan(fresh), self._lane(lanes[self.rank])

    def _lane(self, state: LaneState) -> ReadingLane:
        def read_lengths(shard: int, row: int, count: int) -> np.ndarray:
            return self._cut(self.source.read_lengths(shard, row, count))

        by_row = read_lengths if self.reads_by_id else None
        return ReadingLane(state, self.source, self._offsets, self.stats.cpu, by_row)

    def _restore_lane(self, saved: LaneState) -> ReadingLane:
        lane = LaneState.from_dict(saved.to_dict())
        if not self.reads_by_id:
            lane.payloads = self._fetch(lane.buffer_ids).take(lane.buffer_ids)
        return self._lane(lane)

    def _restored_carry(self, state: StreamState, plan: WindowPlan) -> _Carry:
        ids = np.concatenate([state.carry_ids, state.pool_ids[plan.carry]])
        lengths = np.concatenate([state.carry_lengths, state.pool_lengths[plan.carry]])
        holders = np.concatenate([state.carry_holders, state.pool_holders[plan.carry]])
        held = [] if self.reads_by_id else ids[holders == self.rank].tolist()
        return _Carry(ids, lengths, holders, self._fetch(held))

    def _window(
        self,
        state: StreamState,
        plan: WindowPlan,
        lane: ReadingLane,
        carry: _Carry,
        stop: bool,
        reports: list[Any],
    ) -> tuple[StreamState, WindowPlan, RecordTable | None, _Carry, bool]:
        """Read this rank's share, exchange (with this rank's step-time ``reports``), plan
        and gather the next window; the last element: whether any rank's thread was
        stopping (this one's is ``stop``)."""
        w, me = self.world_size, self.rank
        start = time.perf_counter()
        ids, lengths, records = lane.take(self._share(state.lanes, carry), self._lengths)
        self.stats.reading += time.perf_counter() - start
        start, cpu = time.perf_counter(), time.thread_time()
        payload = encode([ids, lengths, lane.state.to_dict(), stop, reports])
        parts = [decode(p) for p in self.collectives.allgather(payload)]
        self.stats.exchanging += time.perf_counter() - start
        self.stats.cpu["exchanging"] += time.thread_time() - cpu
        speeds, measured = self.speeds.absorb(state, [p[4] for p in parts])
        # The ranks' samples interleaved: the j-th sample of every rank, rank after rank.
        counts = [len(p[0]) for p in parts]
        holders = np.repeat(np.arange(w, dtype=np.int64), counts)
        place = np.concatenate([np.arange(n, dtype=np.int64) for n in counts]) * w + holders
        order = np.argsort(place, kind="stable")
        pool = StreamState(
            world_size=w,
            epoch=state.epoch,
            window=state.window + 1,
            step=state.step + len(plan.steps),
            consumed=0,
            pool_ids=np.concatenate([carry.ids, np.concatenate([p[0] for p in parts])[order]]),
            pool_lengths=np.concatenate(
                [carry.lengths, np.concatenate([p[1] for p in parts])[order]]
            ),
            pool_holders=np.concatenate([carry.holders, holders[order]]),
            lanes=tuple(LaneState.from_dict(p[2]) for p in parts),
            generation=state.generation,
            sequence=state.sequence + 1,
            speeds=speeds,
            reports=measured,
        )
        new_plan = self._plan(pool)
        # The carry's records, then this window's (none where samples are read by id).
        held = carry.held if records is None else carry.held.join(RecordTable(ids, records))
        mine = None if self.reads_by_id else self._gather(pool, new_plan, held)
        keep = pool.pool_ids[new_plan.carry]
        holders = pool.pool_holders[new_plan.carry]
        next_carry = _Carry(
            keep,
            pool.pool_lengths[new_plan.carry],
            holders,
            held.select(keep[holders == me]),
        )
        self.stats.windows += 1
        self.stats.steps += len(new_plan.steps)
        return pool, new_plan, mine, next_carry, any(p[3] for p in parts)

    def _share(self, lanes: tuple[LaneState, ...], carry: _Carry) -> tuple[int, int]:
        """This rank's share of the window, ``(samples, tokens)`` (one of them 0): the
        window's need split over the lanes that still hold samples (every rank knows them
        all), so that every window progresses while any lane does."""
        k, budget = self.window_steps, self.packing.tokens_per_step
        left = [lane.remaining for lane in lanes]
        live = [r for r, n in enumerate(left) if n > 0]
        if self.rank not in live:
            return 0, 0
        if budget is not None:
            need = max(0, (k + 1) * budget - int(carry.lengths.sum()))
            return 0, -(-need // len(live))
        assert self.batch_size is not None
        need = max(0, k * self.batch_size - carry.ids.shape[0])
        shares = [0] * len(left)
        while need > 0 and (live := [r for r in live if left[r] > shares[r]]):
            per, extra = divmod(need, len(live))
            for i, r in enumerate(live):
                give = min(per + (i < extra), left[r] - shares[r])
                shares[r] += give
                need -= give
        return shares[self.rank], 0

    def _lengths(self, records: list[Any]) -> np.ndarray:
        """The records' tokens (the source's ``block_lengths`` where it has that method,
        else one ``length`` call per record), cut to a row with
        ``long_documents="truncate"``."""
        block = getattr(self.source, "block_lengths", None)
        if callable(block):
            return self._cut(block(records))
        return self._cut(np.fromiter(map(self.source.length, records), np.int64, len(records)))

    def _cut(self, lengths: np.ndarray) -> np.ndarray:
        """``lengths`` cut to a row with ``long_documents="truncate"``."""
        if self.packing.long_documents == "truncate":
            return np.minimum(lengths, self.packing.length)
        return lengths

    def _fetch(self, ids: Any) -> RecordTable:
        """The records of ``ids`` read from the source (by index where it allows it)."""
        if len(ids) == 0:
            return RecordTable.empty()
        if self.source.random_access:  # one read_rows per shard, ids in order
            wanted = np.unique(np.asarray(ids, dtype=np.int64))
            return RecordTable(wanted, read_ids(self.source, self._offsets, wanted.tolist()))
        return RecordTable.of(fetch_records(self.source, self._offsets, ids))

    def _gather(self, pool: StreamState, plan: WindowPlan, held: RecordTable) -> RecordTable:
        """The records of this rank's planned samples: its own, then by index or by the
        all-to-all from the ranks holding them."""
        me, empty, cpu = self.rank, np.zeros(0, np.int64), time.thread_time()
        ids = np.concatenate([empty, *(s.ids for s in plan.steps)])
        ranks = np.concatenate([empty, *(s.rank for s in plan.steps)])
        wanted = ids[ranks == me]
        found, at = held.positions(wanted)
        mine, missing = RecordTable(held.ids[at], held.records[at]), wanted[~found]
        start = time.perf_counter()
        if self.source.random_access:
            mine = mine.join(self._fetch(missing.tolist()))
            self.stats.rows_fetched += missing.shape[0]
        else:
            by_id = np.argsort(pool.pool_ids, kind="stable")
            at = by_id[np.searchsorted(pool.pool_ids[by_id], ids)]
            sent = pool.pool_holders[at] == me
            outgoing = [
                held.select(ids[sent & (ranks == r)]) if r != me else RecordTable.empty()
                for r in range(self.world_size)
            ]
            payloads = [encode([t.ids, t.records.tolist()]) for t in outgoing]
            self.stats.bytes_sent += sum(len(p) for r, p in enumerate(payloads) if r != me)
            for received in self.collectives.alltoall(payloads):
                got, records = decode(received)
                mine = mine.join(RecordTable(got, records))
        self.stats.exchanging += time.perf_counter() - start
        self.stats.cpu["exchanging"] += time.thread_time() - cpu
        return mine
