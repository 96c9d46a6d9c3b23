"""``kind="dynamic"`` streams: measured step times travel in the window's all-gather, a
slower rank gets less work in later windows, exactly-once and equal micro-batch counts
hold, and a resume from every rank's own state plans the same windows bitwise. The ranks
are threads; their step times are a deterministic function of their work (a slowness per
rank), so runs can be compared bit for bit."""

import json

import numpy as np
import pytest
from stream_source import make_source, run_ranks

from chronica.core import ScheduleConfig
from chronica.core.packing import Packing
from chronica.core.streaming import StreamState
from chronica.runtime.streaming_speeds import StreamSpeeds

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 16, "buffer_size": 6, "window_steps": 1, "seed": 3, "kind": "dynamic"}
SLOWNESS = (1.0, 3.0)  # rank 1 takes three times as long for the same work


def _source():
    return make_source(shards=8, mean=60)


def _reporter():
    """Reports, after a step's last micro-batch, a time for the rank's step: its slowness
    times the work of that micro-batch, once per micro-batch of the step (a function of
    the micro-batch alone, so a resumed run reports what the uninterrupted one did)."""

    def each(rank, engine, batch):
        if batch.micro == batch.num_micro - 1:
            work = 1e-3 + 1e-6 * int(batch.lengths.sum())
            engine.report(SLOWNESS[rank] * work * batch.num_micro)

    return each


def _signature(batch):
    return (batch.ids.tolist(), batch.rows.tolist(), batch.step, batch.micro, batch.num_micro)


def _tokens_per_step(batches):
    out = {}
    for b in batches:
        out[b.step] = out.get(b.step, 0) + int(b.lengths.sum())
    return out


def test_a_slower_rank_gets_fewer_tokens_in_later_windows_exactly_once():
    source = _source()
    out, states, engines = run_ranks(source, 2, PACKING, each=_reporter(), **OPTIONS)
    ids = sorted(i for rank in out for b in rank for i in b.ids.tolist())
    assert ids == list(range(engines[0].num_samples))
    assert [(b.step, b.num_micro) for b in out[0]] == [(b.step, b.num_micro) for b in out[1]]
    fast, slow = _tokens_per_step(out[0]), _tokens_per_step(out[1])
    steps = sorted(fast)
    early, late = steps[:2], steps[len(steps) // 2 :]
    assert sum(slow[s] for s in late) < 0.7 * sum(fast[s] for s in late)
    assert sum(slow[s] for s in early) > 0.7 * sum(fast[s] for s in early)  # equal at first
    speeds = StreamState.from_dict(states[0]).speeds
    assert speeds.shape == (2,) and speeds[0] > 2 * speeds[1]
    assert states[0]["speeds"] == states[1]["speeds"]
    assert states[0]["reports"] == states[1]["reports"]


@pytest.mark.parametrize("cut", [3, 11, 20])
def test_resume_from_each_ranks_own_state_plans_the_same_windows_bitwise(cut):
    source = _source()
    full, _, _ = run_ranks(source, 2, PACKING, each=_reporter(), **OPTIONS)
    part, states, _ = run_ranks(source, 2, PACKING, limit=cut, each=_reporter(), **OPTIONS)
    assert all(state["reports_due"]["rank"] == r for r, state in enumerate(states))
    saved = [json.loads(json.dumps(state)) for state in states]
    rest, _, _ = run_ranks(source, 2, PACKING, states=saved, each=_reporter(), **OPTIONS)
    for r in range(2):
        assert [_signature(b) for b in part[r] + rest[r]] == [_signature(b) for b in full[r]]


def test_one_ranks_state_on_every_rank_or_another_world_keeps_exactly_once():
    source = _source()
    part, states, engines = run_ranks(source, 2, PACKING, limit=9, each=_reporter(), **OPTIONS)
    for world in (2, 3):
        rest, _, _ = run_ranks(source, world, PACKING, states=[states[0]] * world, **OPTIONS)
        ids = [i for batches in part + rest for b in batches for i in b.ids.tolist()]
        assert sorted(ids) == list(range(engines[0].num_samples))
        assert len({len(rank) for rank in rest}) == 1


def test_static_streams_keep_no_reports_and_a_report_outside_the_window_is_ignored():
    source = _source()
    static = {k: v for k, v in OPTIONS.items() if k != "kind"}
    _, states, _ = run_ranks(source, 2, PACKING, each=_reporter(), **static)
    assert "reports_due" not in states[0] and states[0]["speeds"] == []
    config = ScheduleConfig(num_replicas=2, batch_size=16, packing=PACKING, kind="dynamic")
    start = StreamState.from_dict(states[0])
    speeds = StreamSpeeds(config, 1, start, None)
    speeds.report(1.0, step=10**6)
    assert speeds.rank_state()["reports_due"]["pending"] == []
    assert "active=True" in repr(speeds)
    assert np.array_equal(start.reports, np.zeros((0, 5))) and start.speeds.shape == (0,)
