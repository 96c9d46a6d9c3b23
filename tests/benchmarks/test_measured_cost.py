"""benchmarks/measured_cost.py: the rows of a layout, the fit that recovers a known overhead and
cost (and never a negative coefficient), a plan's predicted times and the two step figures."""

import itertools

import numpy as np
import pytest

from benchmarks import measured_cost as mc
from chronica import CostModel


def _rows(lengths_per_batch, overhead, truth):
    return np.array(
        [
            [len(b), b.sum(), (b.astype(float) ** 2).sum(), overhead + truth(b.astype(float)).sum()]
            for b in lengths_per_batch
        ]
    )


def test_features_are_documents_tokens_and_squares_per_micro_batch_rank_by_rank():
    layout = [[np.array([0, 2]), np.array([1])], [np.array([3]), np.array([], dtype=np.int64)]]
    rows = mc.features(layout, np.array([1, 2, 3, 4]))
    np.testing.assert_array_equal(rows, [[2, 4, 10], [1, 2, 4], [1, 4, 16], [0, 0, 0]])


def test_the_fit_recovers_overhead_and_cost():
    rng = np.random.default_rng(0)
    batches = [rng.integers(16, 2048, rng.integers(1, 12)) for _ in range(40)]
    truth = CostModel(2e-4, 1e-5, 3e-8)
    overhead, model = mc.fit(_rows(batches, 5e-3, truth))
    assert overhead == pytest.approx(5e-3, rel=1e-6)
    assert model.to_tuple() == pytest.approx(truth.to_tuple(), rel=1e-5)


def test_the_fit_sets_a_coefficient_to_zero_rather_than_below():
    rng = np.random.default_rng(1)
    batches = [rng.integers(16, 2048, rng.integers(1, 12)) for _ in range(40)]
    rows = _rows(batches, 0.0, CostModel(0.0, 1e-5, 3e-8))
    rows[:, 3] -= 1e-4 * rows[:, 0]  # a negative per-document term: the least-squares sign
    overhead, model = mc.fit(rows)
    assert overhead >= 0 and min(model.to_tuple()) >= 0
    assert model.a == 0.0


@pytest.mark.parametrize("rows", [np.zeros((3, 3)), np.zeros((0, 4)), np.ones((2, 4, 1))])
def test_the_fit_refuses_rows_of_another_shape(rows):
    with pytest.raises(ValueError, match="documents, tokens, squares, seconds"):
        mc.fit(rows)


def test_the_fit_refuses_rows_with_no_per_document_cost():
    rows = np.array([[1, 10, 100, 1.0], [2, 20, 200, 1.0], [3, 5, 25, 1.0], [1, 7, 49, 1.0]])
    with pytest.raises(ValueError, match="no positive per-document cost"):
        mc.fit(rows)


def test_predicted_times_and_the_lockstep_and_rank_steps():
    lengths = np.array([10, 20, 30, 40])
    layout = [[np.array([0]), np.array([1, 2])], [np.array([3]), np.array([], dtype=np.int64)]]
    times = mc.predicted(layout, lengths, 0.5, CostModel(1.0, 1.0, 0.0))
    np.testing.assert_allclose(times, [[11.5, 52.5], [41.5, 0.5]])
    assert mc.lockstep(times) == pytest.approx(41.5 + 52.5)
    assert mc.rank_step(times) == pytest.approx(64.0)


def test_relative_errors_are_one_row_per_micro_batch_one_column_per_rank():
    predicted = [np.array([[1.0, 2.0], [4.0, 5.0]]), np.array([[10.0], [20.0]])]
    measured = [np.array([[1.1, 2.0], [3.0, 5.5]]), np.array([[9.0], [22.0]])]
    errors = mc.relative_errors(measured, predicted)
    np.testing.assert_allclose(errors, [[0.1, -0.25], [0.0, 0.1], [-0.1, 0.1]])


@pytest.mark.parametrize(
    "measured,predicted",
    [([np.ones((2, 2))], []), ([np.ones((2, 2))], [np.ones((2, 3))]), ([np.ones(2)], [np.ones(2)])],
)
def test_relative_errors_refuse_batches_that_do_not_match(measured, predicted):
    with pytest.raises(ValueError, match="same"):
        mc.relative_errors(measured, predicted)


def test_without_noise_the_noisy_lockstep_is_the_lockstep():
    times = np.array([[1.0, 3.0, 2.0], [2.0, 1.0, 2.0]])
    assert mc.noisy_lockstep(times, np.zeros((4, 2))) == pytest.approx(mc.lockstep(times))
    assert mc.noisy_lockstep(times, np.zeros(3)) == pytest.approx(mc.lockstep(times))


def test_noise_lifts_equal_micro_batches_by_half_the_mean_difference():
    # max(1 + e0, 1 + e1) = 1 + (e0 + e1) / 2 + |e0 - e1| / 2
    rng = np.random.default_rng(2)
    errors = rng.normal(0, 0.05, (50, 2))
    lift = np.mean(errors.mean(axis=1) + np.abs(errors[:, 0] - errors[:, 1]) / 2)
    times = np.full((2, 3), 2.0)
    assert mc.noisy_lockstep(times, errors) == pytest.approx(6.0 * (1 + lift))


def _joint_reference(times, errors):
    return sum(
        np.mean([max(t * (1 + e) for t, e in zip(column, row, strict=True)) for row in errors])
        for column in times.T
    )


def _independent_reference(times, errors):
    total = 0.0
    for column in times.T:
        draws = list(itertools.product(errors, repeat=len(column)))
        total += np.mean([max(t * (1 + e) for t, e in zip(column, d, strict=True)) for d in draws])
    return total


@pytest.mark.parametrize("seed", range(4))
def test_the_noisy_lockstep_is_the_expectation_over_the_draws(seed):
    rng = np.random.default_rng(seed)
    times = rng.uniform(0.5, 2.0, (3, 4))
    joint = rng.normal(0, 0.1, (7, 3))
    independent = rng.normal(0, 0.1, 5)
    assert mc.noisy_lockstep(times, joint) == pytest.approx(_joint_reference(times, joint))
    assert mc.noisy_lockstep(times, independent) == pytest.approx(
        _independent_reference(times, independent)
    )


@pytest.mark.parametrize(
    "times,errors",
    [
        (np.ones(3), np.zeros(3)),
        (np.ones((2, 3)), np.zeros((4, 3))),
        (np.ones((2, 3)), np.zeros(0)),
    ],
)
def test_the_noisy_lockstep_refuses_shapes_that_do_not_fit(times, errors):
    with pytest.raises(ValueError, match="must be"):
        mc.noisy_lockstep(times, errors)
