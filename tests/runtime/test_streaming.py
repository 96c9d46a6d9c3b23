"""The streaming engine over an in-memory source, its ranks as threads: exactly-once per
pass, equal micro-batch counts, caps, bitwise mid-window resume, resume at another world,
passes without end, both delivery paths."""

import threading

import numpy as np
import pytest
from stream_source import ListSource, make_engine, make_source, run_ranks
from workers import scaled

from chronica.core import ScheduleConfig
from chronica.core.packing import Packing
from chronica.core.streaming import StreamOptions
from chronica.runtime.sources import ListSource as BlockLengthsSource
from chronica.runtime.sources import MDSSource, ParquetSource, read_ids, shard_offsets, write_mds
from chronica.runtime.streaming import StreamingEngine, reads_by_id
from chronica.runtime.streaming_exchange import LocalGroup

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def _ids(batches):
    return [i for rank in batches for b in rank for i in b.ids.tolist()]


def _signature(batch):
    return (
        batch.ids.tolist(), batch.rows.tolist(), batch.step, batch.micro, batch.num_micro,
        batch.loss_weight, [r["input_ids"].tolist() for r in batch.records],
    )  # fmt: skip


@pytest.mark.parametrize("random_access", [True, False])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_one_pass_gives_every_sample_once_in_equal_counts_under_the_cap(world, random_access):
    source = make_source(random_access=random_access)
    out, states, engines = run_ranks(source, world, PACKING, **OPTIONS)
    assert sorted(_ids(out)) == list(range(engines[0].num_samples))
    assert len({len(rank) for rank in out}) == 1
    for rank in out:
        for b in rank:
            assert b.lengths.sum() <= 1024 and 0 <= b.micro < b.num_micro
            for row in np.unique(b.rows):
                assert b.lengths[b.rows == row].sum() <= 512
            assert [int(r["id"]) for r in b.records] == b.ids.tolist()
    steps = [[(b.step, b.num_micro) for b in rank] for rank in out]
    assert all(s == steps[0] for s in steps)
    assert all(s == states[0] for s in states)
    moved = sum(e.stats.bytes_sent for e in engines)
    assert (moved > 0) == (not random_access and world > 1)


def test_a_source_with_block_lengths_streams_what_one_length_per_record_streams():
    per_record = make_source(random_access=True)  # length(record) only
    block = BlockLengthsSource(  # the same records, with block_lengths(records)
        [[per_record._record(s, r) for r in range(per_record.shard_size(s))]
         for s in range(per_record.num_shards)],
        length="input_ids",
    )  # fmt: skip
    assert not hasattr(per_record, "block_lengths") and hasattr(block, "block_lengths")
    expected, states, _ = run_ranks(per_record, 2, PACKING, **OPTIONS)
    got, block_states, _ = run_ranks(block, 2, PACKING, **OPTIONS)
    for r in range(2):
        assert [_signature(b) for b in got[r]] == [_signature(b) for b in expected[r]]
    assert block_states == states


def test_a_source_attribute_named_lengths_is_left_alone():
    # A user's source may keep its own data under ``lengths`` (docs/streaming.md's first
    # example does): only a ``block_lengths`` method is asked for a block's lengths.
    source = make_source(random_access=True)
    expected, states, _ = run_ranks(source, 2, PACKING, **OPTIONS)
    source.lengths = [[0] * source.shard_size(s) for s in range(source.num_shards)]
    got, got_states, _ = run_ranks(source, 2, PACKING, **OPTIONS)
    for r in range(2):
        assert [_signature(b) for b in got[r]] == [_signature(b) for b in expected[r]]
    assert got_states == states


def _written(kind, folder, length):
    """Shards of uneven sizes (one empty) as MDS or as parquet files of 8-row row groups."""
    rng = np.random.default_rng(11)
    sizes = (30, 0, 45, 17, 52)
    shards = [[np.arange(int(n), dtype=np.int32) for n in rng.integers(1, 400, k)] for k in sizes]
    if kind == "mds":
        if not (folder / "index.json").exists():
            write_mds(folder, [[{"input_ids": t} for t in s] for s in shards],
                      {"input_ids": "ndarray:int32"})  # fmt: skip
        return MDSSource(folder, length=length)
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [folder / f"{s}.parquet" for s in range(len(shards))]
    for file, shard in zip(files, shards, strict=True):
        if not file.exists():
            column = pa.array([t.tolist() for t in shard], pa.list_(pa.int32()))
            pq.write_table(pa.table({"input_ids": column}), file, row_group_size=8)
    return ParquetSource(files, length=length)


@pytest.mark.parametrize("world", [1, 2])
def test_samples_read_by_id_stream_what_buffered_records_stream(tmp_path, world):
    # MDSSource reads lengths from the shards' headers: the lanes hold no records and each
    # planned sample is read by id once; the same micro-batches and states as a source
    # whose lanes read and buffer the records (a length function needs the record).
    by_id = _written("mds", tmp_path, "input_ids")
    buffered = _written("mds", tmp_path, lambda record: len(record["input_ids"]))
    assert by_id.lengths_without_records and not buffered.lengths_without_records
    expected, states, _ = run_ranks(buffered, world, PACKING, **OPTIONS)
    got, got_states, engines = run_ranks(by_id, world, PACKING, **OPTIONS)
    for r in range(world):
        assert [_signature(b) for b in got[r]] == [_signature(b) for b in expected[r]]
    assert got_states == states
    assert sum(e.stats.rows_fetched for e in engines) == engines[0].num_samples


def test_parquet_is_read_by_its_lanes_here_and_planned_alone_for_reading_by_id(tmp_path):
    # ParquetSource reads by id (its length column alone), but its read_rows decodes whole
    # row groups: decoding in one process, the lanes read it (each row group once, in
    # order); planning alone (decode=False), the micro-batches are the same, read by id.
    source = _written("parquet", tmp_path, "input_ids")
    decoding = make_engine(source, PACKING, LocalGroup(1).rank(0), **OPTIONS)
    planning = StreamingEngine(source, decoding.config, LocalGroup(1).rank(0),
                               decoding.options, decode=False)  # fmt: skip
    assert reads_by_id(source) and not decoding.reads_by_id and planning.reads_by_id
    offsets = shard_offsets(source)
    expected = [_signature(b) for b in decoding.micro_batches()]
    read = [
        b.with_records(read_ids(source, offsets, b.ids.tolist())) for b in planning.micro_batches()
    ]
    assert [_signature(b) for b in read] == expected
    assert planning.stats.rows_fetched == 0 and planning.state_dict() == decoding.state_dict()


def test_resume_mid_window_reading_by_id_is_bitwise_the_uninterrupted_run(tmp_path):
    source = _written("mds", tmp_path, "input_ids")
    full, _, _ = run_ranks(source, 2, PACKING, **OPTIONS)
    part, states, _ = run_ranks(source, 2, PACKING, limit=4, **OPTIONS)
    rest, _, _ = run_ranks(source, 2, PACKING, states=states, **OPTIONS)
    for r in range(2):
        assert [_signature(b) for b in part[r] + rest[r]] == [_signature(b) for b in full[r]]
    again, _, _ = run_ranks(source, 3, PACKING, states=[states[0]] * 3, **OPTIONS)
    total = sum(source.shard_size(s) for s in range(source.num_shards))
    assert sorted(_ids(part) + _ids(again)) == list(range(total))


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_resume_mid_window_is_bitwise_the_uninterrupted_run(cut):
    source = make_source(random_access=False)
    full, _, _ = run_ranks(source, 2, PACKING, **OPTIONS)
    part, states, _ = run_ranks(source, 2, PACKING, limit=cut, **OPTIONS)
    rest, _, _ = run_ranks(source, 2, PACKING, states=states, **OPTIONS)
    for r in range(2):
        assert [_signature(b) for b in part[r] + rest[r]] == [_signature(b) for b in full[r]]


@pytest.mark.parametrize("world", [1, 3, 4])
def test_resume_at_another_world_keeps_exactly_once(world):
    source = make_source()
    part, states, engines = run_ranks(source, 2, PACKING, limit=5, **OPTIONS)
    rest, _, _ = run_ranks(source, world, PACKING, states=[states[0]] * world, **OPTIONS)
    assert sorted(_ids(part) + _ids(rest)) == list(range(engines[0].num_samples))
    assert len({len(rank) for rank in rest}) == 1


def test_passes_follow_each_other_and_differ_in_order():
    source = make_source(shards=4, mean=20)
    n = int(source.offsets[-1])
    group = LocalGroup(1)
    engine = make_engine(source, PACKING, group.rank(0), infinite=True, **OPTIONS)
    batches = engine.micro_batches()
    seen = []
    while len(seen) < 2 * n:
        seen.extend(next(batches).ids.tolist())
    batches.close()
    assert sorted(seen[:n]) == list(range(n)) and sorted(seen[n : 2 * n]) == list(range(n))
    assert seen[:n] != seen[n : 2 * n]
    finite = make_engine(source, PACKING, LocalGroup(1).rank(0), **OPTIONS)
    first = [i for b in finite.micro_batches() for i in b.ids.tolist()]
    second = [i for b in finite.micro_batches() for i in b.ids.tolist()]
    assert sorted(first) == sorted(second) == list(range(n)) and first != second


def test_token_budget_steps():
    source = make_source()
    packing = Packing(max_tokens=1024, tokens_per_step=3000)
    out, _, engines = run_ranks(source, 2, packing, window_steps=1, buffer_size=4)
    assert sorted(_ids(out)) == list(range(engines[0].num_samples))
    tokens = {}
    for rank in out:
        for b in rank:
            tokens[b.step] = tokens.get(b.step, 0) + int(b.lengths.sum())
    assert max(tokens.values()) <= 3000


def test_wrong_arguments_are_named():
    source = make_source()
    rank = LocalGroup(1).rank(0)
    config = ScheduleConfig(num_replicas=1, batch_size=4, packing=PACKING)
    with pytest.raises(TypeError, match="config"):
        StreamingEngine(source, PACKING, rank)
    with pytest.raises(ValueError, match="split"):
        make_engine(source, Packing(max_tokens=8, long_documents="split"), rank, batch_size=4)
    with pytest.raises(TypeError, match="collectives"):
        StreamingEngine(source, config, object())
    with pytest.raises(TypeError, match="StreamOptions"):
        StreamingEngine(source, config, rank, {"window_steps": 2})
    with pytest.raises(ValueError, match="num_replicas=2"):
        StreamingEngine(source, ScheduleConfig(num_replicas=2, batch_size=4, packing=PACKING), rank)
    with pytest.raises(ValueError, match="window_steps"):
        make_engine(source, PACKING, rank, batch_size=4, window_steps=0)
    engine = StreamingEngine(source, config, rank, StreamOptions(buffer_size=8))
    assert "StreamingEngine(rank=0" in repr(engine) and "buffer_size=8" in repr(engine)


@pytest.mark.parametrize("window_steps", [1, 3])
def test_a_lane_that_runs_dry_early_does_not_stall_the_others(window_steps):
    source = ListSource([[5] * 3, [7] * 90, [3] * 2])
    out, _, _ = run_ranks(
        source, 3, Packing(max_tokens=64), batch_size=10, window_steps=window_steps, buffer_size=4
    )
    assert sorted(_ids(out)) == list(range(95))
    assert len({len(rank) for rank in out}) == 1


def test_close_stops_planning_and_a_new_iteration_continues_where_it_stopped():
    source = make_source(shards=4, mean=20)
    full = [
        _signature(b)
        for b in make_engine(source, PACKING, LocalGroup(1).rank(0), **OPTIONS).micro_batches()
    ]
    engine = make_engine(source, PACKING, LocalGroup(1).rank(0), **OPTIONS)
    batches = engine.micro_batches()
    head = [_signature(next(batches)) for _ in range(3)]
    state = engine.state_dict()
    engine.close()
    assert engine.state_dict() == state
    assert head + [_signature(b) for b in engine.micro_batches()] == full


class _LaggingRank:
    """A rank's collectives whose thread lags after its second all-gather until ``gate``
    opens: the other rank's thread runs a window ahead meanwhile."""

    def __init__(self, inner, gate):
        self.inner, self.gate, self.calls = inner, gate, 0
        self.rank, self.world_size = inner.rank, inner.world_size

    def allgather(self, payload):
        out = self.inner.allgather(payload)
        self.calls += 1
        if self.calls == 2:
            self.gate.wait()
        return out

    def alltoall(self, payloads):
        return self.inner.alltoall(payloads)


def test_closing_when_one_ranks_planning_lags_leaves_no_collective_waiting():
    source = make_source()
    group, gate, stopped = LocalGroup(2), threading.Event(), threading.Barrier(2)
    ranks = [group.rank(0), _LaggingRank(group.rank(1), gate)]
    engines = [make_engine(source, PACKING, c, **OPTIONS) for c in ranks]
    states = [None, None]

    def run(r):
        batches = engines[r].micro_batches()
        next(batches)
        engines[r]._run.stop.set()  # both stop at one micro-batch, rank 1's thread lagging
        stopped.wait()
        if r == 1:
            gate.set()
        engines[r].close()
        states[r] = engines[r].state_dict()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(60))
    assert not any(t.is_alive() for t in threads), "a planning thread waits for its peer"
    assert states[0] == states[1] and states[0]["consumed"] == 1


def test_an_engine_that_plans_only_yields_the_same_plan_without_records(tmp_path):
    source = make_source()
    write_mds(
        tmp_path,
        [[{"input_ids": np.full(n, 1, np.int32)} for n in shard] for shard in source.shards],
        {"input_ids": "ndarray:int32"},
    )
    mds = MDSSource(tmp_path, length="input_ids")
    decoded = list(make_engine(mds, PACKING, LocalGroup(1).rank(0), **OPTIONS).micro_batches())
    planner = make_engine(mds, PACKING, LocalGroup(1).rank(0), **OPTIONS)
    planner = StreamingEngine(mds, planner.config, planner.collectives, planner.options,
                              decode=False)  # fmt: skip
    positions, planned = [planner.position()], []
    for batch in planner.micro_batches():
        planned.append(batch)
        positions.append(planner.position())
    assert [(b.ids.tolist(), b.rows.tolist(), b.step, b.micro, b.loss_weight) for b in planned] == [
        (b.ids.tolist(), b.rows.tolist(), b.step, b.micro, b.loss_weight) for b in decoded
    ]
    assert all(b.records == [] for b in planned) and not planner.decode
    assert repr(planner).endswith(", decode=False)")
    assert planner.state_dict(at=positions[-1]) == planner.state_dict()
    resumed = planner.resumed(planner.state_dict(at=positions[5]))
    assert not resumed.decode
    rest = [b.ids.tolist() for b in resumed.micro_batches()]
    assert rest == [b.ids.tolist() for b in planned[5:]]
    with pytest.raises(TypeError, match="decode must be a bool"):
        StreamingEngine(mds, planner.config, planner.collectives, decode=1)
