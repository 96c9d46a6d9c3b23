"""Cost models (``chronica.core.cost``): the polynomial vectorised, named and tuple forms,
FLOP counts of a transformer, least-squares calibration, and refusals by class and name."""

import numpy as np
import pytest

from chronica.core import CostModel, as_cost_model


def test_cost_models_vectorised():
    s = np.array([0.0, 1.0, 10.0])
    np.testing.assert_array_equal(CostModel.linear()(s), s)
    np.testing.assert_array_equal(CostModel.affine(2, 3)(s), 2 + 3 * s)
    np.testing.assert_array_equal(CostModel.quadratic(1, 2, 3)(s), 1 + 2 * s + 3 * s * s)
    np.testing.assert_array_equal(CostModel.attention(4)(s), s * s + 32 * s)
    assert as_cost_model("quadratic") == CostModel(0, 0, 1)
    assert as_cost_model((1, 2, 3)) == CostModel(1, 2, 3)
    assert as_cost_model(None) == CostModel.linear()


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ("cubic", ValueError, "not a known model"),
        ((1, 2), ValueError, "three coefficients"),
        (3.0, TypeError, "not understood"),
        ([0, 1, 0], TypeError, "not understood"),
    ],
)
def test_bad_cost_is_named(bad, error, match):
    with pytest.raises(error, match=rf"^cost=.*{match}"):
        as_cost_model(bad)


@pytest.mark.parametrize("coeffs", [(-1, 1, 0), (0, float("nan"), 0), (0, 0, 0)])
def test_bad_coefficients(coeffs):
    with pytest.raises(ValueError, match="cost"):
        CostModel(*coeffs)


@pytest.mark.parametrize("coeffs", [("1", 1, 0), (0, None, 0), (0, 1, True)])
def test_coefficients_of_the_wrong_type_are_a_type_error(coeffs):
    with pytest.raises(TypeError, match=r"^cost coefficient [abc]=.* must be a real number"):
        CostModel(*coeffs)


def test_numpy_coefficients_are_accepted_and_the_repr_shows_them():
    model = CostModel(np.float32(0.5), np.int64(2), 0.0)
    assert model(np.array([1.0])).tolist() == [2.5]
    assert repr(CostModel.affine(1, 2)) == "CostModel(a=1.0, b=2.0, c=0.0)"


def test_a_larger_size_never_costs_less():
    sizes = np.linspace(0, 1e4, 101)
    for model in (CostModel.linear(), CostModel.attention(64), CostModel(3, 0, 1e-3)):
        costs = model(sizes)
        assert (np.diff(costs) >= 0).all() and (costs >= 0).all()


def test_transformer_cost_counts_training_flops():
    # GPT-2 small: about 6 FLOPs per parameter per token (85M in the blocks, 38.6M in the
    # vocabulary projection), and 12 layers x 4 x 768 x 3 / 2 per causal token pair.
    model = CostModel.transformer(768, 12, 12, vocab=50257)
    blocks = 12 * (4 * 768 * 768 + 8 * 768 * 768)
    assert model.b == 3 * 2 * (blocks + 768 * 50257)
    assert model.c == 3 * 12 * 4 * 768 / 2
    assert model.a == 0
    full = CostModel.transformer(768, 12, 12, causal=False)
    assert full.c == 2 * model.c
    grouped = CostModel.transformer(1024, 4, 8, head_dim=64)  # narrower attention
    assert grouped.c == 3 * 4 * 4 * 8 * 64 / 2
    with pytest.raises(ValueError, match="hidden=100 is not a multiple of heads=12"):
        CostModel.transformer(100, 2, 12)


def test_fit_recovers_the_coefficients_of_exact_measurements():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 2000, (40, 6))
    counts = np.full(40, 6)
    tokens, squares = lengths.sum(1), (lengths**2).sum(1)
    seconds = 0.01 * counts + 2e-4 * tokens + 3e-8 * squares
    fitted = CostModel.fit(counts, tokens, squares, seconds)
    assert fitted.to_tuple() == pytest.approx((0.01, 2e-4, 3e-8), rel=1e-6)
    # Linear work fits no quadratic term, and coefficients never go negative.
    linear = CostModel.fit(counts, tokens, squares, 5e-4 * tokens)
    assert linear.to_tuple() == pytest.approx((0.0, 5e-4, 0.0), abs=1e-12)
    with pytest.raises(ValueError, match="fit no positive cost"):
        CostModel.fit(counts, tokens, squares, -tokens)
    with pytest.raises(ValueError, match="equally long"):
        CostModel.fit([1], [2, 3], [4], [5])
