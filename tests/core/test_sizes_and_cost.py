import numpy as np
import pytest

from chronica.core import CostModel, as_cost_model, resolve_sizes, sizes_digest, validate_sizes


class WithSizeof:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __sizeof__(self, index):
        return index * 2


class WithSizesAttr(list):
    sizes = (3, 1, 2)


class WithSizesMethod(list):
    def sizes(self):
        return np.array([5.0, 6.0])


def test_sources_in_order_of_precedence():
    assert resolve_sizes(WithSizeof(4)).tolist() == [0, 2, 4, 6]
    assert resolve_sizes(WithSizesAttr([0, 0, 0])).tolist() == [3, 1, 2]
    assert resolve_sizes(WithSizesMethod([0, 0])).tolist() == [5, 6]
    assert resolve_sizes(WithSizeof(2), sizes=[9, 9]).tolist() == [9, 9]
    assert resolve_sizes(list(range(3))).tolist() == [1, 1, 1]
    assert resolve_sizes(sizes=np.arange(3, dtype=np.int32)).dtype == np.float64


@pytest.mark.parametrize(
    "sizes,match",
    [
        ([1.0, float("nan")], r"sizes\[1\] is nan; .*finite"),
        ([1.0, float("inf")], r"sizes\[1\].*finite"),
        ([1, -2], r"sizes\[1\] is -2; .*non-negative"),
        ([[1, 2]], "1-D"),
        (["a", "b"], "integers or floats"),
        ([True, False], "integers or floats"),
        ([[1], [2, 3]], "1-D array"),
    ],
)
def test_bad_sizes_are_named(sizes, match):
    with pytest.raises(ValueError, match=match):
        validate_sizes(sizes)


def test_length_mismatch_names_both_lengths():
    with pytest.raises(ValueError, match="3 entries but the data set has 4"):
        resolve_sizes(list(range(4)), sizes=[1, 2, 3])


def test_sizeof_without_index_is_explained():
    class Broken(list):
        def __sizeof__(self):
            return 1

    with pytest.raises(ValueError, match="must take an index"):
        resolve_sizes(Broken([1, 2]))


def test_unsized_dataset_is_refused():
    with pytest.raises(ValueError, match="no len"):
        resolve_sizes(iter([1, 2]))


def test_validated_sizes_are_read_only_and_digest_is_content_based():
    s = validate_sizes([1, 2, 3])
    with pytest.raises(ValueError):
        s[0] = 5
    assert sizes_digest(s) == sizes_digest(validate_sizes(np.array([1.0, 2.0, 3.0])))
    assert sizes_digest(s) != sizes_digest(validate_sizes([1, 2, 4]))


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
    "bad,match",
    [("cubic", "not a known model"), ((1, 2), "not understood"), (3.0, "not understood")],
)
def test_bad_cost_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        as_cost_model(bad)


@pytest.mark.parametrize("coeffs", [(-1, 1, 0), (0, float("nan"), 0), (0, 0, 0)])
def test_bad_coefficients(coeffs):
    with pytest.raises(ValueError, match="cost"):
        CostModel(*coeffs)


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
