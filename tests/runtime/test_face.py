"""chronica.runtime.face: StreamFace gives every adapter the same stream-level methods, each
meaning what the stream's does (a face built here on a plain RankStream, no framework)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.face import StreamFace
from chronica.runtime.stream import RankStream

N, WORLD, BATCH = 120, 3, 12


class Face(StreamFace):
    """The least an adapter adds: a stream, and batches from it."""

    def __init__(self, rank, **config):
        sizes = np.random.default_rng(0).lognormal(3, 1, N)
        labels = np.arange(N) % 4
        scheduler = Scheduler(sizes, ScheduleConfig(WORLD, BATCH, **config), labels=labels)
        self.stream = RankStream(scheduler, rank)

    def __iter__(self):
        return (batch.indices.tolist() for batch in self.stream.batches())


def test_the_properties_are_the_streams():
    face = Face(2)
    assert face.scheduler is face.stream.scheduler
    assert (face.num_replicas, face.rank, face.epoch) == (WORLD, 2, 0)
    face.set_epoch(3)
    assert face.epoch == face.stream.epoch == 3


def test_plans_weights_and_diagnostics_are_the_streams():
    face = Face(1, kind="guided")
    face.set_epoch(2)
    plan = face.plan()
    assert plan is face.stream.plan() and plan.epoch == 2
    assert face.plan(0).epoch == 0
    np.testing.assert_array_equal(face.loss_weights(), np.ones(plan.num_steps))
    assert face.loss_weight(0) == 1.0
    assert face.stats() == face.stream.stats()
    assert face.stats().epoch == 2 and face.stats().load_ratio_mean >= 1.0
    moved = face.movement(sample_bytes=np.full(N, 10))
    assert moved.epoch == 2 and moved.total_bytes == 10 * moved.total_samples
    skew = face.label_skew()
    assert skew.epoch == 2 and 0 <= skew.batch_mean <= skew.batch_max
    face.report(0.5)  # a static job: nothing to report to, and no error
    face.close()
    face.close()  # idempotent


def test_get_state_and_set_state_resume_another_face_where_one_stopped():
    first = Face(0)
    batches = iter(first)
    head = [next(batches) for _ in range(4)]
    state = json.loads(json.dumps(first.get_state()))
    assert state == first.stream.state() and state["step"] == 4
    other = Face(2)
    other.set_state(state)
    assert list(other) == [p.tolist() for p in other.plan().rank_steps(2)[4:]]
    assert head == [p.tolist() for p in first.plan().rank_steps(0)[:4]]


def test_another_worlds_state_resumes_the_remainder():
    old = Face(0)
    batches = iter(old)
    for _ in range(3):
        next(batches)
    state = old.get_state()
    face = Face(1)
    scheduler = face.scheduler
    smaller = Scheduler(scheduler.sizes, ScheduleConfig(2, 8), labels=scheduler.labels)
    face.stream = RankStream(smaller, 1)
    face.set_state(state)
    assert face.plan().num_steps == face.stream.num_steps
    assert face.get_state()["history"] == [[WORLD, BATCH, 3]]


def test_a_bad_state_is_refused_through_the_face():
    face = Face(0)
    with pytest.raises(ValueError, match="state version 9 is not supported"):
        face.set_state({**face.get_state(), "version": 9})
