"""chronica.runtime.auto: the mode="auto" trial driven with given windows (no framework, no
timing): the search's order and halving, the cost on accelerators and on CPU, the noise
figure, the decision printed once (WARNING, without any logging set-up), the drift watch
and its hysteresis, the agreed window, candidates and bad arguments."""

import logging
import subprocess
import sys

import numpy as np
import pytest

from chronica.runtime.auto import (
    BUCKETED,
    DRIFT_WINDOWS,
    MAX_WINDOWS_KEPT,
    MEASURE_STEPS,
    MODES,
    WATCH_STEPS,
    AutoTrial,
    Candidate,
    Window,
    candidates,
    check_mode,
)

A = Candidate("scheduled", 256 << 10, 1 << 20)
B = Candidate("scheduled", 1 << 20, 4 << 20)
C = Candidate("scheduled", 4 << 20, 16 << 20)
EXPOSED = Window(0.100, 0.050, after_backward=0.040)  # a bucketed window: 40% exposed


def drive(trial, times, cpu=None):
    """Feed one window per setting the trial asks for: step time ``times[setting]`` (and CPU
    ``cpu[setting]``), bucketed at 0.100 s unless given; the settings asked for, in order."""
    asked = []
    while not trial.settled:
        current = trial.current
        asked.append(current)
        t = times.get(current, 0.100)
        trial.observe(Window(t, (cpu or {}).get(current, 0.050), after_backward=0.04))
    return asked


def test_search_interleaves_bucketed_halves_and_keeps_the_best():
    trial = AutoTrial([A, B, C], accelerator=True)
    assert trial.current == BUCKETED and trial.phase == "measure"
    asked = drive(trial, {A: 0.080, B: 0.090, C: 0.095})
    # measure; round 1, twice: A B bucketed C bucketed; round 2 (best two), twice: A B
    # bucketed; then two fresh windows of the survivor, each beside bucketed ones.
    first, second = [A, B, BUCKETED, C, BUCKETED], [A, B, BUCKETED]
    assert asked == [BUCKETED, *first, *first, *second, *second, A, BUCKETED, A, BUCKETED]
    assert len(asked) * (MEASURE_STEPS + 1) <= trial.budget_steps
    assert trial.current == A and trial.engine == "scheduled"
    assert trial.decision.startswith(
        "scheduled: scheduled (256 KiB partitions, 1 MiB credit) cost 0.800x bucketed "
        "(step time, median of 6 windows beside bucketed ones, 2 of them after the search "
        "at 0.800x; the best of 3 settings searched"
    )


def test_the_windows_that_chose_the_survivor_do_not_decide_for_it():
    """A lucky in the search (80 ms), as slow as bucketed after it: bucketed is kept, once
    the fresh windows leave no doubt (hopeless: 1.000x, where the noise is nil)."""
    trial = AutoTrial([A, B], accelerator=True)
    asked = []
    while not trial.settled:
        asked.append(trial.current)
        searching = len(asked) <= 7  # measure, then A B bucketed twice
        t = 0.080 if trial.current == A and searching else 0.100
        trial.observe(Window(t, after_backward=0.04))
    assert asked[:7] == [BUCKETED, A, B, BUCKETED, A, B, BUCKETED]
    assert asked[7:] == [A, BUCKETED] * 2
    assert trial.current == BUCKETED and "cost 0.900x" in trial.decision
    assert "2 of them after the search at 1.000x" in trial.decision


def keeps(settings, seeds, sigma):
    """How often the trial keeps a scheduled setting when each window's step time is the
    setting's ``settings`` ratio (1.0 where absent) times 100 ms times lognormal noise of
    ``sigma`` (seeded, so deterministic)."""
    kept = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        trial = AutoTrial([A, B, C], accelerator=True, announce=False)
        while not trial.settled:
            t = 0.100 * settings.get(trial.current, 1.0) * float(np.exp(rng.normal(0, sigma)))
            trial.observe(Window(t, after_backward=0.04))
        kept += trial.current != BUCKETED
    return kept / len(seeds)


def test_noise_rarely_makes_a_setting_that_saves_nothing_win():
    # 100 seeded trials each (lognormal window noise): none faster than bucketed (8%): a
    # setting as fast as bucketed kept now and then (harmless); all 5% slower (11%): rarely;
    # one 15% faster: nearly always.
    assert keeps({}, range(100), 0.08) <= 0.20
    assert keeps({A: 1.05, B: 1.05, C: 1.05}, range(100), 0.11) <= 0.05
    assert keeps({A: 0.85}, range(100), 0.08) >= 0.95


def test_a_real_win_under_noise_is_found_within_the_budget():
    """A setting 6% faster than bucketed under 8% window noise: 2 windows cannot tell it,
    the lengthened trial mostly does, within ``budget_steps``; where none is faster,
    bucketed mostly stays (seeded, so deterministic)."""
    found, stayed = 0, 0
    for seed in range(100):
        for wins in (True, False):
            rng = np.random.default_rng(seed)
            trial = AutoTrial([A], accelerator=True, announce=False)
            windows = 0
            while not trial.settled:
                ratio = 0.94 if trial.current == A and wins else 1.0
                t = 0.100 * ratio * float(np.exp(rng.normal(0, 0.08)))
                trial.observe(Window(t, after_backward=0.04))
                windows += 1
            assert windows * (MEASURE_STEPS + 1) <= trial.budget_steps
            found += wins and trial.current == A
            stayed += not wins and trial.current == BUCKETED
    assert found >= 75 and stayed >= 80
    assert keeps({A: 0.94}, range(100), 0.08) >= 0.65  # beside two settings that gain nothing


def test_a_single_setting_gets_two_windows_beside_bucketed_ones():
    trial = AutoTrial([B], accelerator=True)
    assert drive(trial, {B: 0.080}) == [BUCKETED, B, BUCKETED, B, BUCKETED]
    assert trial.budget_steps == (2 + 2 * MAX_WINDOWS_KEPT) * (MEASURE_STEPS + 1)
    assert trial.current == B


def test_not_cheaper_than_margin_keeps_bucketed():
    slower = AutoTrial([A, B], accelerator=True)
    drive(slower, {A: 0.110, B: 0.120})
    assert slower.current == BUCKETED and slower.decision.startswith("bucketed: the best, ")
    assert slower.decision.endswith("it must save more than 2.0%, and 2.0% after the search")


def drive_noisy(trial, setting_s):
    """Bucketed windows alternating 0.100 and 0.120 s (the noise: 18.4%), ``setting_s`` for
    the scheduled one; how many windows of it the trial asked for."""
    bucketed, asked = iter([0.100, 0.120] * 50), 0
    while not trial.settled:
        asked += trial.current != BUCKETED
        t = next(bucketed) if trial.current == BUCKETED else setting_s
        trial.observe(Window(t, after_backward=0.04))
    return asked


def test_noise_that_cannot_tell_asks_for_more_windows_and_decides_on_their_median():
    # 10% cheaper than the bucketed windows beside it, which differ by 18.4%: 2 windows
    # cannot tell (need 27.6%), 4 nor 8 can, 16 can (need 9.8%).
    trial = AutoTrial([A], accelerator=True)
    assert drive_noisy(trial, 0.099) == 16 < MAX_WINDOWS_KEPT
    assert trial.current == A
    assert "median of 16 windows" in trial.decision and "18.4%, 9.8% over 16" in trial.decision


def test_the_extra_windows_are_bounded_and_what_does_not_beat_the_noise_stays_bucketed():
    trial = AutoTrial([A], accelerator=True)  # 4% cheaper: never beats 6.9% of noise
    assert drive_noisy(trial, 0.1055) == MAX_WINDOWS_KEPT
    assert trial.current == BUCKETED and trial.decision.endswith("it must save more than 6.9%")


def test_clear_results_need_no_extra_windows():
    # Hopeless (20% dearer: more than the noise's benefit of the doubt, 27.6% at 2 windows,
    # over the margin) or beyond the noise (40% cheaper): 2 windows decide.
    for setting_s, kept in ((0.150, BUCKETED), (0.060, A)):
        trial = AutoTrial([A], accelerator=True)
        assert drive_noisy(trial, setting_s) == 2
        assert trial.current == kept


def test_extra_cpu_beyond_idle_cores_counts_against_a_setting_on_cpu_only_training():
    # 10 ms shorter, 20 ms more CPU per step; bucketed steps left 5 ms of their core idle.
    times, cpu = {A: 0.090}, {BUCKETED: 0.095, A: 0.115}
    on_cpu = AutoTrial([A], cores=1)
    drive(on_cpu, times, cpu)  # 90 + (20 - 5) = 105 ms against 100: bucketed
    assert on_cpu.current == BUCKETED and "extra CPU beyond idle counted" in on_cpu.decision
    assert "cost 1.050x" in on_cpu.decision
    two_cores = AutoTrial([A], cores=2)  # 105 ms idle: the extra CPU took nothing
    drive(two_cores, times, cpu)
    assert two_cores.current == A and "cost 0.900x" in two_cores.decision
    idle = AutoTrial([A], cores=1)  # bucketed steps at 50 ms of CPU: 50 ms idle absorbs the 20
    drive(idle, times, {A: 0.070})
    assert idle.current == A
    accelerated = AutoTrial([A], accelerator=True)
    drive(accelerated, times, cpu)
    assert accelerated.current == A
    assert not accelerated.measuring_cpu and AutoTrial([A]).measuring_cpu


def test_bound_below_min_saving_or_min_saving_one_never_searches():
    low = AutoTrial([A], min_saving=0.5)
    assert low.observe(Window(0.1, after_backward=0.015)) == BUCKETED and low.settled
    assert low.decision == (
        "bucketed: the ranks measured that priority scheduling would save at most 15.0% of "
        "step time (< min_saving=50%)"
    )
    assert low.window_steps == WATCH_STEPS  # still watched for drift
    never = AutoTrial([A], min_saving=1.0)
    assert never.observe(Window(0.1, after_backward=0.1)) == BUCKETED
    assert "never searched at min_saving=100%" in never.decision and never.window_steps == 0
    with pytest.raises(ValueError, match="settled for good"):
        never.observe(Window(0.1))


def test_a_bound_near_min_saving_is_measured_twice_before_bucketed_stays():
    clear = AutoTrial([A], accelerator=True)  # min_saving 5%: 1% decides at once
    assert clear.observe(Window(0.1, after_backward=0.001)) == BUCKETED and clear.settled
    for second, phase in ((0.008, "search"), (0.004, "settled")):
        trial = AutoTrial([A], accelerator=True)
        assert trial.observe(Window(0.1, after_backward=0.004)) == BUCKETED  # 4%: near
        assert trial.phase == "measure" and not trial.settled
        trial.observe(Window(0.1, after_backward=second))  # the mean of both decides
        assert trial.phase == phase
    assert trial.decision.endswith(
        "at most 4.0% of step time (mean of 2 windows) (< min_saving=5%)"
    )


def test_bound_no_more_than_the_link_leaves_free():
    """Exposed 60 ms of a 100 ms step, but the link is busy 98 ms: 2% at most, not tried."""
    trial = AutoTrial([A])
    window = Window(0.100, after_backward=0.060, link_busy=0.098)
    assert window.saving_bound == pytest.approx(0.02)
    assert trial.observe(window) == BUCKETED and "at most 2.0%" in trial.decision


def test_decision_printed_once_at_warning_and_deterministic(caplog):
    runs = []
    for _ in range(2):
        trial = AutoTrial([A, B], accelerator=True)
        with caplog.at_level(logging.INFO, logger="chronica"):
            caplog.clear()
            drive(trial, {A: 0.08, B: 0.09})
        runs.append((trial.decision, trial.current))
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and trial.decision in warnings[0].getMessage()
    assert runs[0] == runs[1]
    quiet = AutoTrial([A], min_saving=0.9, announce=False)
    with caplog.at_level(logging.INFO, logger="chronica"):
        caplog.clear()
        quiet.observe(EXPOSED)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_printed_decision_appears_without_any_logging_setup():
    """A fresh interpreter that configures no logging still sees the decision on stderr."""
    code = (
        "from chronica.runtime.auto import AutoTrial, Candidate, Window\n"
        "t = AutoTrial([Candidate('scheduled', 1, 4)], min_saving=0.5)\n"
        "t.observe(Window(0.1, after_backward=0.01))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "mode='auto' decided for every rank: bucketed: the ranks measured" in done.stderr


def test_drift_reopens_only_after_consecutive_windows_and_decides_again(caplog):
    trial = AutoTrial([A], accelerator=True)
    drive(trial, {A: 0.080})
    assert trial.current == A and trial.decisions == 1
    steady = Window(0.080, after_backward=0.020)  # communication: 25% of the step
    trial.observe(steady)  # the reference
    trial.observe(Window(0.080, after_backward=0.060))  # one odd window: nothing
    trial.observe(steady)
    assert trial.settled and trial.current == A
    for _ in range(DRIFT_WINDOWS):
        assert trial.settled
        trial.observe(Window(0.080, after_backward=0.070))  # the link got slower
    assert trial.phase == "measure" and trial.current == BUCKETED
    assert trial.decision.startswith("trial: communication took 87.5% of the step")
    with caplog.at_level(logging.INFO, logger="chronica"):
        drive(trial, {A: 0.070})
    assert trial.decisions == 2 and trial.current == A
    assert any("re-decided" in r.getMessage() for r in caplog.records)


def test_reopen_starts_again_from_bucketed():
    trial = AutoTrial([A], accelerator=True)
    drive(trial, {A: 0.080})
    trial.reopen("the link changed")
    assert (trial.phase, trial.current, trial.decision) == (
        "measure",
        BUCKETED,
        "trial: the link changed",
    )
    with pytest.raises(TypeError, match="why"):
        trial.reopen(3)


def test_agreed_window_is_the_mean_over_ranks_whatever_the_order_of_arrival():
    rows = [[0.1, 0.2, 0.03, 0.0], [0.3, 0.4, 0.05, 0.0]]
    agreed = Window.agreed(rows)
    assert agreed.values() == pytest.approx([0.2, 0.3, 0.04, 0.0])
    assert Window.agreed(rows) == agreed  # the same rows, the same floats
    assert Window(0.1, 0.2, 0.03, 0.04).values() == [0.1, 0.2, 0.03, 0.04]


def test_candidates_cover_the_grid_and_the_configured_setting_once():
    found = candidates(8 << 20, 1 << 20, 4 << 20)
    assert found == [A, B, C]
    assert candidates(8 << 20, 512 << 10, 1 << 20)[-1] == Candidate("scheduled", 512 << 10, 1 << 20)
    tiny = candidates(4096, 1024, 2048)  # every partition clipped to the gradients' bytes
    assert tiny == [Candidate("scheduled", 4096, 16384), Candidate("scheduled", 1024, 2048)]
    with pytest.raises(ValueError, match=">= 1"):
        candidates(0, 1, 1)


def test_bad_arguments():
    assert check_mode("auto") == "auto" and "bucketed" in MODES
    with pytest.raises(ValueError, match="one of"):
        check_mode("fast")
    with pytest.raises(TypeError, match="string"):
        check_mode(1)
    with pytest.raises(TypeError, match="settings"):
        AutoTrial([BUCKETED])
    with pytest.raises(TypeError, match="settings"):
        AutoTrial([])
    with pytest.raises(ValueError, match="min_saving"):
        AutoTrial([A], min_saving=1.5)
    with pytest.raises(ValueError, match="cores"):
        AutoTrial([A], cores=0)
    with pytest.raises(TypeError, match="margin"):
        AutoTrial([A], margin="2%")
    with pytest.raises(TypeError, match="Window"):
        AutoTrial([A]).observe((0.1, 0.1))
    with pytest.raises(ValueError, match="non-negative"):
        Window(-1.0)
    with pytest.raises(TypeError, match="seconds"):
        Window(True)
    with pytest.raises(ValueError, match="engine"):
        Candidate("fast")
    with pytest.raises(ValueError, match="partition_bytes"):
        Candidate("scheduled")
    assert "phase='measure'" in repr(AutoTrial([A]))
