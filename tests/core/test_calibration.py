"""Online calibration of a packed job's cost coefficients and rank speeds."""

import numpy as np
import pytest

from chronica.core import CostModel
from chronica.core.calibration import CostCalibration

TRUE = CostModel(2e-3, 1e-5, 3e-9)


def _work(rng):
    lengths = rng.integers(10, 4000, rng.integers(3, 20)).astype(float)
    return np.array([lengths.shape[0], lengths.sum(), (lengths**2).sum()])


def _feed(calibration, slowness, reports, rng, noise=0.0):
    for _ in range(reports):
        for rank, slow in enumerate(slowness):
            work = _work(rng)
            seconds = slow * float(work @ np.array(TRUE.to_tuple()))
            calibration.observe(rank, work, seconds * (1 + noise * rng.standard_normal()))


def test_exact_reports_give_the_coefficients_up_to_scale_and_the_speeds():
    rng = np.random.default_rng(0)
    slowness = np.array([1.0, 1.0, 3.0, 1.5])
    calibration = CostCalibration(4, CostModel.linear())
    _feed(calibration, slowness, 12, rng)
    fitted = np.array(calibration.model().to_tuple())
    truth = np.array(TRUE.to_tuple())
    np.testing.assert_allclose(fitted / fitted[1], truth / truth[1], rtol=1e-6)
    speeds = calibration.speeds()
    np.testing.assert_allclose(speeds / speeds[0], slowness[0] / slowness, rtol=1e-6)


def test_noisy_reports_come_close():
    rng = np.random.default_rng(1)
    slowness = np.array([1.0, 2.0])
    calibration = CostCalibration(2, CostModel.linear(), history=48)
    _feed(calibration, slowness, 40, rng, noise=0.02)
    speeds = calibration.speeds()
    assert speeds[0] / speeds[1] == pytest.approx(2.0, rel=0.03)
    fitted = calibration.model()
    assert fitted.c / fitted.b == pytest.approx(TRUE.c / TRUE.b, rel=0.25)  # 2% noise


def test_the_prior_stands_until_enough_reports_and_bad_ones_are_ignored():
    prior = CostModel.transformer(64, 2, 4)
    calibration = CostCalibration(3, prior, min_reports=8)
    rng = np.random.default_rng(2)
    for bad in ([np.nan, 1, 1], [1, -1, 1], [0, 0, 0], [1, 2]):
        calibration.observe(0, np.array(bad, dtype=float), 1.0)
    calibration.observe(0, _work(rng), float("inf"))
    calibration.observe(0, _work(rng), 0.0)
    _feed(calibration, [1.0, 1.0], 3, rng)  # 6 good reports: still too few
    assert calibration.model() == prior
    assert calibration.speeds().tolist() == [1.0, 1.0, 1.0]
    _feed(calibration, [1.0, 1.0], 1, rng)
    assert calibration.model() != prior
    assert calibration.speeds()[2] == pytest.approx(np.median(calibration.speeds()[:2]))


def test_arguments_are_refused_by_name_and_class():
    with pytest.raises(TypeError, match=r"^prior=.* must be a chronica.core.CostModel"):
        CostCalibration(2, (0, 1, 0))
    with pytest.raises(ValueError, match=r"^num_ranks=0"):
        CostCalibration(0, CostModel.linear())
    with pytest.raises(TypeError, match=r"^history="):
        CostCalibration(2, CostModel.linear(), history=4.0)
    with pytest.raises(ValueError, match=r"^min_reports=0"):
        CostCalibration(2, CostModel.linear(), min_reports=0)


def test_repr_shows_the_configuration():
    calibration = CostCalibration(3, CostModel.affine(1, 2), history=10, min_reports=4)
    assert repr(calibration) == (
        "CostCalibration(num_ranks=3, prior=CostModel(a=1.0, b=2.0, c=0.0), history=10, "
        "min_reports=4)"
    )
