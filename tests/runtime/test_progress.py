"""chronica.runtime.progress: planning a large epoch shows a bar, and the plan is the same
bytes with or without it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.progress import LARGE_EPOCH, plan_epoch


def _scheduler(n=3000):
    sizes = np.random.default_rng(n).lognormal(3, 1, n)
    return Scheduler(sizes, ScheduleConfig(num_replicas=4, batch_size=32, kind="guided"))


def test_a_large_epoch_plans_under_a_bar_to_the_same_bytes():
    shown = io.StringIO()
    plan = plan_epoch(_scheduler(), 1, min_samples=1000, delay=0, file=shown, disable=False)
    assert "chronica: planning epoch 1" in shown.getvalue()
    expected = _scheduler().plan_epoch(1)
    assert plan.indices.tobytes() == expected.indices.tobytes()
    assert plan.bounds.tobytes() == expected.bounds.tobytes()


def test_no_bar_for_a_small_data_set_or_a_plan_already_held():
    scheduler = _scheduler()
    shown = io.StringIO()
    plan_epoch(scheduler, 0, min_samples=3001, delay=0, file=shown, disable=False)
    assert shown.getvalue() == ""
    held = scheduler.plan_epoch(2)
    again = plan_epoch(scheduler, 2, min_samples=1, delay=0, file=shown, disable=False)
    assert again is held and shown.getvalue() == ""
    assert LARGE_EPOCH > 1_000_000  # ordinary jobs plan without one


def test_a_disabled_bar_writes_nothing():
    shown = io.StringIO()
    plan_epoch(_scheduler(), 0, min_samples=1, delay=0, file=shown, disable=True)
    assert shown.getvalue() == ""


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(min_samples=-1), "min_samples=-1 must be an int >= 0"),
        (dict(delay=-1.0), "delay=-1.0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        plan_epoch(_scheduler(100), 0, **kw)
