"""chronica.runtime.timeline: the Chrome-trace file (closed or not), per-rank paths, and the
exposed-communication diagnostic read from steps or from a timeline."""

import gc
import json

import pytest

from chronica.runtime.timeline import Exposure, Timeline, read_exposure, timeline_path


def test_exposure_medians_bound_and_verdict():
    bucketed = Exposure.from_steps(
        [(0.1, 0.01, 0.0), (0.3, 0.03, 0.0), (0.2, 0.02, 0.0)], "bucketed"
    )
    assert (bucketed.steps, bucketed.step_time, bucketed.after_backward) == (3, 0.2, 0.02)
    assert bucketed.exposed == 0.02 and bucketed.saving_bound == pytest.approx(0.1)
    assert "would save at most 10.0% of step time" in bucketed.verdict
    scheduled = Exposure.from_steps([(0.2, 0.05, 0.01)], "scheduled", decision="told")
    assert scheduled.exposed == 0.01 and scheduled.decision == "told"
    assert "hides about 20.0% of step time here" in scheduled.verdict
    # In scheduled mode the bound is what is still exposed: the forward's wait, 5%.
    assert scheduled.saving_bound == pytest.approx(0.05)
    assert "would save at most 5.0% more" in scheduled.verdict
    assert "no step measured" in Exposure.from_steps([], "bucketed").verdict


def test_saving_bound_no_more_than_the_link_leaves_free():
    """A link busy 90 ms of a 100 ms step leaves 10 ms to save, however much is exposed."""
    slow = Exposure.from_steps([(0.1, 0.06, 0.0)], "bucketed", link_busy=0.09)
    assert slow.saving_bound == pytest.approx(0.1)
    assert "at most 10.0% of step time (the link is busy 90.0 ms per step)" in slow.verdict
    saturated = Exposure.from_steps([(0.1, 0.06, 0.0)], "bucketed", link_busy=0.12)
    assert saturated.saving_bound == 0.0
    free = Exposure.from_steps([(0.1, 0.03, 0.0)], "bucketed", link_busy=0.02)
    assert free.saving_bound == pytest.approx(0.3)  # the exposed part is the smaller one


def test_timeline_finished_when_collected_and_exposure_read_back(tmp_path):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), pid=1)
    timeline.step(1.0, 1.2, 0.05, 0.0, "bucketed")
    timeline.step(1.2, 1.4, 0.04, 0.01, "scheduled")
    timeline.step(1.4, 1.7, 0.06, 0.02, "scheduled")
    del timeline  # never closed: the finalizer terminates the JSON array
    gc.collect()
    events = json.loads(path.read_text())
    assert [e["tid"] for e in events if e["ph"] == "X"] == ["step"] * 3
    exposure = read_exposure(path)  # the mode the run ended in
    assert (exposure.mode, exposure.steps) == ("scheduled", 2)
    assert exposure.step_time == pytest.approx(0.25)
    assert exposure.forward_wait == pytest.approx(0.015)


def test_timeline_path_per_rank():
    assert timeline_path("/a/t.json", 1, 2) == "/a/t.rank1.json"
    assert timeline_path("/a/t-{rank}.json", 1, 2) == "/a/t-1.json"
    assert timeline_path("/a/t.json", 0, 1) == "/a/t.json"
    assert timeline_path("/a/trace", 1, 2) == "/a/trace.rank1"


def test_closed_timeline_is_complete_json_and_spans_carry_their_arguments(tmp_path):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), pid=2)
    timeline.span("w[0:4]", "communication", 1.0, 1.5, partition=0, bytes=16)
    timeline.close()
    timeline.close()  # idempotent
    timeline.span("late", "queue", 2.0, 2.1)  # after close: dropped, the file stays valid
    events = json.loads(path.read_text())
    (span,) = [e for e in events if e["ph"] == "X"]
    assert span["name"] == "w[0:4]" and span["pid"] == 2 and span["tid"] == "communication"
    assert span["dur"] == pytest.approx(5e5) and span["args"] == {"partition": 0, "bytes": 16}
