"""Sample sizes (``chronica.core.sizes``): the sources in order of precedence, the checks
they pass once (named by position), read-only results and a content-based digest."""

import numpy as np
import pytest

from chronica.core import resolve_sizes, sizes_digest, validate_sizes
from chronica.core.sizes import defines_sizeof


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
        ([[1], [2, 3]], "1-D array"),
    ],
)
def test_bad_sizes_are_named(sizes, match):
    with pytest.raises(ValueError, match=match):
        validate_sizes(sizes)


@pytest.mark.parametrize("sizes", [["a", "b"], [True, False], [None, 1]])
def test_sizes_of_the_wrong_type_are_a_type_error(sizes):
    with pytest.raises(TypeError, match=r"^sizes must hold integers or floats"):
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


def test_validated_sizes_are_contiguous_float64_of_the_expected_length():
    out = validate_sizes(np.array([3, 1, 2], dtype=np.int32)[::-1], expected_len=3)
    assert out.dtype == np.float64 and out.flags.c_contiguous
    assert out.tolist() == [2.0, 1.0, 3.0]
    with pytest.raises(ValueError, match="lengths has 2 entries but the data set has 3"):
        validate_sizes([1, 2], expected_len=3, name="lengths")


def test_defines_sizeof_only_for_a_python_override():
    assert defines_sizeof(WithSizeof([1, 2]))
    assert not defines_sizeof([1, 2])
    assert not defines_sizeof(WithSizesAttr([1]))


def test_an_empty_data_set_has_empty_sizes():
    assert resolve_sizes([], sizes=[]).shape == (0,)
    assert sizes_digest(validate_sizes([])) == sizes_digest(validate_sizes(np.empty(0)))
