"""Feedback control: time models, water-filling, hysteresis and the window planner."""

import itertools

import numpy as np
import pytest
import reference
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.controller import (
    BatchController,
    ControllerOptions,
    RankTimeModel,
    _changed,
    _robust_line,
    water_fill,
)


def _brute_force_best(total, alpha, beta, unit, low, high):
    """The smallest possible top predicted time over every integer split."""
    w = len(alpha)
    best = np.inf
    for counts in itertools.product(range(low, high + 1), repeat=w):
        if sum(counts) == total:
            best = min(best, max(alpha[r] + beta[r] * unit * counts[r] for r in range(w)))
    return best


@given(
    w=st.integers(2, 4),
    data=st.data(),
)
def test_water_fill_is_exact_bounded_and_near_optimal(w, data):
    low = data.draw(st.integers(0, 3))
    high = data.draw(st.integers(max(low, 1), 9))
    total = data.draw(st.integers(w * low, w * high))
    alpha = np.array(data.draw(st.lists(st.floats(0, 5), min_size=w, max_size=w)))
    beta = np.array(data.draw(st.lists(st.floats(0.1, 10), min_size=w, max_size=w)))
    counts = water_fill(total, alpha, beta, 1.0, low, high)
    assert counts.sum() == total
    assert (counts >= low).all() and (counts <= high).all()
    top = (alpha + beta * counts).max()
    # Rounding costs at most one sample of the slowest rank over the real-valued optimum.
    assert top <= _brute_force_best(total, alpha, beta, 1.0, low, high) + beta.max() + 1e-9


@given(
    exponents=st.lists(st.integers(-30, 30), min_size=2, max_size=6),
    low=st.integers(0, 2),
)
def test_water_fill_stays_exact_under_extreme_speed_ratios(exponents, low):
    beta = 10.0 ** np.array(exponents, dtype=np.float64)
    total = 128 + len(beta) * low
    counts = water_fill(total, np.zeros(len(beta)), beta, 1.0, low, total)
    assert counts.sum() == total and (counts >= low).all()


def test_water_fill_refuses_a_degenerate_model():
    with pytest.raises(ValueError, match="finite"):
        water_fill(128, np.zeros(4), np.array([1.0, np.inf, 1.0, 1.0]), 1.0, 1, 128)
    with pytest.raises(ValueError, match="finite"):
        water_fill(128, np.array([0.0, np.nan, 0.0, 0.0]), np.ones(4), 1.0, 1, 128)


def test_water_fill_hl8_is_speed_proportional():
    speeds = np.array([6.0, 6.0, 4.0, 32.0])
    counts = water_fill(128, np.zeros(4), 1 / speeds, 1.0, 1, 128)
    assert counts.tolist() == [16, 16, 11, 85]
    assert water_fill(128, np.zeros(4), 1 / speeds, 1.0, 20, 60).tolist() == [24, 24, 20, 60]
    with pytest.raises(ValueError, match="cannot be split"):
        water_fill(128, np.zeros(4), np.ones(4), 1.0, 40, 60)


def test_time_model_recovers_line_despite_outliers_and_noise():
    rng = np.random.default_rng(0)
    model = RankTimeModel(2)
    for i in range(40):
        load = rng.uniform(100, 1000)
        noise = 1 + 0.002 * rng.standard_normal()
        seconds = (0.05 + 0.002 * load) * noise
        if i % 13 == 5:
            seconds *= 6  # a garbage collection
        model.observe(0, load, seconds)
    alpha, beta = model.params()
    assert alpha[0] == pytest.approx(0.05, rel=0.3)
    assert beta[0] == pytest.approx(0.002, rel=0.05)
    # Rank 1 has no reports: it borrows the others' fit.
    assert (alpha[1], beta[1]) == (alpha[0], beta[0])


def test_time_model_forgets_after_a_change_of_speed():
    model = RankTimeModel(1, ControllerOptions(change_run=3))
    for _ in range(30):
        model.observe(0, 100.0, 1.0)
    for _ in range(3):
        model.observe(0, 100.0, 4.0)  # four times slower from now on
    _, beta = model.params()
    assert beta[0] == pytest.approx(0.04, rel=1e-6)
    assert model.reports(0) == 3


def test_bad_reports_are_ignored():
    model = RankTimeModel(1)
    for bad in (float("nan"), float("inf"), -1.0):
        model.observe(0, 1.0, bad)
    assert model.reports(0) == 0
    assert model.params()[1].tolist() == [1.0]


def test_controller_keeps_counts_within_the_hysteresis_band():
    controller = BatchController(4, 1, 128, ControllerOptions(hysteresis=0.05))
    equal = controller.counts(128, np.zeros(4), np.ones(4), 1.0)
    assert equal.tolist() == [32, 32, 32, 32]
    # 3% faster: not worth a change.
    nearly = controller.counts(128, np.zeros(4), np.array([1, 1, 1, 0.97]), 1.0)
    assert nearly.tolist() == equal.tolist()
    hl8 = controller.counts(128, np.zeros(4), 1 / np.array([6.0, 6, 4, 32]), 1.0)
    assert hl8.tolist() == [16, 16, 11, 85]
    # A trailing step of 20 samples keeps the proportions and adds up.
    tail = controller.counts(20, np.zeros(4), 1 / np.array([6.0, 6, 4, 32]), 1.0)
    assert tail.sum() == 20 and tail[3] == tail.max()


@given(
    st.integers(1, 48),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.sampled_from([0.0, 0.01, 1.0]),
)
def test_robust_fit_kernels_match_the_numpy_reference(n, seed, memory, ridge):
    rng = np.random.default_rng(seed)
    loads = rng.choice([0.0, 50.0, 400.0], n) if seed % 3 == 0 else rng.uniform(0, 1000, n)
    times = 0.05 + 0.002 * loads * rng.lognormal(0, 0.1, n)
    times[rng.random(n) < 0.1] *= 6  # outliers
    ok, alpha, beta = _robust_line(loads, times, memory, ridge, 4)
    expect = reference.robust_line(loads, times, memory, ridge, 4)
    assert ok == (expect is not None)
    if ok:
        # Summation order differs (sequential here, pairwise in numpy): rounding only.
        np.testing.assert_allclose([alpha, beta], expect, rtol=1e-9, atol=1e-15)
        for error in (0.01, 0.15):
            tail = slice(max(n - 3, 0), n)
            assert _changed(loads[tail], times[tail], alpha, beta, error) == reference.changed(
                loads[tail], times[tail], alpha, beta, error
            )


@pytest.mark.parametrize(
    "kwargs,error,name",
    [
        ({"memory": 0.0}, ValueError, "memory"),
        ({"memory": 1.5}, ValueError, "memory"),
        ({"memory": "0.9"}, TypeError, "memory"),
        ({"history": 1}, ValueError, "history"),
        ({"history": 4.0}, TypeError, "history"),
        ({"hysteresis": 1.0}, ValueError, "hysteresis"),
        ({"hysteresis": None}, TypeError, "hysteresis"),
        ({"change_run": 48}, ValueError, "change_run"),
        ({"change_run": 0}, ValueError, "change_run"),
        ({"change_run": 2.0}, TypeError, "change_run"),
        ({"change_error": 0.0}, ValueError, "change_error"),
        ({"ridge": -1.0}, ValueError, "ridge"),
        ({"ridge": float("inf")}, ValueError, "ridge"),
    ],
)
def test_controller_options_refuse_by_field_and_class(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name}="):
        ControllerOptions(**kwargs)


def test_controller_options_repr_shows_what_differs_from_the_defaults():
    assert repr(ControllerOptions()) == "ControllerOptions()"
    options = ControllerOptions(memory=0.5, change_run=4)
    assert repr(options) == "ControllerOptions(memory=0.5, change_run=4)"
    assert eval(repr(options), {"ControllerOptions": ControllerOptions}) == options
