"""chronica.runtime.auto: the mode="auto" trial driven with given windows (no framework, no
timing): when scheduling is tried, kept or dropped, the margins at their edges, the decision
made once, its words, and bad arguments."""

import logging

import pytest

from chronica.runtime.auto import MARGIN, MODES, AutoTrial, Window, check_mode


def run(trial, *windows, bound=0.5):
    """Feed ``windows`` in order; the engine after each."""
    engines = [trial.observe(windows[0], saving_bound=bound)]
    engines += [trial.observe(w) for w in windows[1:] if not trial.settled]
    return engines


def test_scheduling_kept_when_faster_than_bucketed_before_and_after(caplog):
    trial = AutoTrial(min_saving=0.05)
    assert (trial.phase, trial.engine, trial.decision) == ("measure", "bucketed", "")
    with caplog.at_level(logging.INFO, logger="chronica"):
        engines = run(trial, Window(0.100, 0.050), Window(0.080, 0.050), Window(0.100, 0.050))
    assert engines == ["scheduled", "bucketed", "scheduled"]
    assert trial.settled and trial.engine == "scheduled"
    assert trial.decision == (
        "scheduled: rank 0 measured 80.0 ms per step scheduled against 100.0 ms bucketed "
        "before and 100.0 ms after, CPU 50.0 against 50.0 ms and 50.0 ms"
    )
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("chronica gradients: trial: rank 0 measured that priority")
    assert lines[-1].endswith("; switching to priority scheduling")
    assert len(lines) == 2  # the trial, then the decision: once


def test_trial_dropped_when_not_faster_or_dearer_in_cpu():
    slower = AutoTrial()
    assert run(slower, Window(0.100, 0.05), Window(0.120, 0.05)) == ["scheduled", "bucketed"]
    assert slower.settled and slower.decision.startswith("bucketed: rank 0 measured 120.0 ms")
    assert slower.decision.endswith("(scheduling must save 2% and cost no more CPU)")
    dearer = AutoTrial()
    assert run(dearer, Window(0.100, 0.050), Window(0.050, 0.060))[-1] == "bucketed"
    assert dearer.settled and "CPU 60.0 against 50.0 ms" in dearer.decision


def test_bucketed_window_after_the_trial_can_overturn_it():
    # Bucketed was slow by chance before the trial: measured again, it wins.
    trial = AutoTrial()
    engines = run(trial, Window(0.200, 0.05), Window(0.100, 0.05), Window(0.099, 0.05))
    assert engines == ["scheduled", "bucketed", "bucketed"]
    assert trial.decision.startswith("bucketed: ") and " 99.0 ms after" in trial.decision


def test_margin_edges_hold_exactly():
    at_edge = AutoTrial(margin=0.1)  # exactly 10% shorter and exactly 10% more CPU: kept
    run(at_edge, Window(1.0, 1.0), Window(0.9, 1.1), Window(1.0, 1.0))
    assert at_edge.engine == "scheduled"
    beyond = AutoTrial(margin=0.1)
    run(beyond, Window(1.0, 1.0), Window(0.91, 1.0))
    assert beyond.settled and beyond.engine == "bucketed"
    assert MARGIN == AutoTrial().margin


def test_saving_bound_below_min_saving_or_min_saving_one_never_tries(caplog):
    low = AutoTrial(min_saving=0.2)
    with caplog.at_level(logging.INFO, logger="chronica"):
        assert low.observe(Window(0.1, 0.1), saving_bound=0.15) == "bucketed"
    assert low.settled and low.decision == (
        "bucketed: rank 0 measured that priority scheduling would save at most 15.0% of step "
        "time (< min_saving=20%)"
    )
    assert caplog.records[-1].getMessage().endswith("; staying with bucketed all-reduce")
    never = AutoTrial(min_saving=1.0)  # a measured bound can read 100%: still never
    assert never.observe(Window(0.1, 0.1), saving_bound=1.0) == "bucketed"
    assert "never tried at min_saving=100%" in never.decision
    equal = AutoTrial(min_saving=0.2)  # a bound equal to min_saving is tried
    assert equal.observe(Window(0.1, 0.1), saving_bound=0.2) == "scheduled"
    assert equal.decision.startswith("trial: ") and equal.phase == "trial"


def test_decided_once_and_deterministic():
    windows = [Window(0.1, 0.05), Window(0.09, 0.05), Window(0.1, 0.05)]
    a, b = AutoTrial(), AutoTrial()
    assert run(a, *windows) == run(b, *windows) and a.decision == b.decision
    with pytest.raises(ValueError, match="settled"):
        a.observe(Window(0.1, 0.1))
    with pytest.raises(ValueError, match="saving_bound"):
        AutoTrial().observe(Window(0.1, 0.1))
    assert "phase='settled'" in repr(a) and "engine='scheduled'" in repr(a)


def test_bad_arguments():
    with pytest.raises(TypeError, match="min_saving"):
        AutoTrial(min_saving="5%")
    with pytest.raises(ValueError, match="min_saving"):
        AutoTrial(min_saving=1.5)
    with pytest.raises(ValueError, match="margin"):
        AutoTrial(margin=-0.1)
    with pytest.raises(TypeError, match="Window"):
        AutoTrial().observe((0.1, 0.1), saving_bound=0.5)
    with pytest.raises(TypeError, match="step_time"):
        Window("fast", 0.1)
    with pytest.raises(ValueError, match="cpu_time"):
        Window(0.1, float("nan"))
    assert [check_mode(m) for m in MODES] == list(MODES)
    with pytest.raises(ValueError, match="mode='ddp' must be one of"):
        check_mode("ddp")
    with pytest.raises(TypeError, match="mode=None"):
        check_mode(None)
