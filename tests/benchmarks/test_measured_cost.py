"""benchmarks/measured_cost.py: the rows of a layout, the fit that recovers a known overhead and
cost (and never a negative coefficient), a plan's predicted times and the two step figures."""

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
