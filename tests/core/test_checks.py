"""chronica.core.checks: one rule per kind of value, TypeError for types, ValueError for values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chronica.core.checks import check_bool, check_int, check_number, check_seconds, is_int


def test_integers_are_python_or_numpy_but_not_bool():
    assert is_int(3) and is_int(np.int8(3)) and is_int(np.uint64(3))
    assert not is_int(True) and not is_int(np.bool_(True)) and not is_int(3.0)
    assert check_int("n", np.int64(5), 1) == 5 and type(check_int("n", np.int64(5))) is int


@pytest.mark.parametrize(
    ("value", "low", "high", "error", "message"),
    [
        ("3", 1, None, TypeError, r"n='3' must be an int >= 1 \(hint\)"),
        (True, None, None, TypeError, r"n=True must be an int \(hint\)"),
        (2.0, 0, 5, TypeError, r"n=2\.0 must be an int in \[0, 5\]"),
        (0, 1, None, ValueError, r"n=0 must be an int >= 1"),
        (6, 0, 5, ValueError, r"n=6 must be an int in \[0, 5\]"),
        (1, None, 0, ValueError, r"n=1 must be an int <= 0"),
    ],
)
def test_check_int_names_the_argument_and_what_is_accepted(value, low, high, error, message):
    with pytest.raises(error, match=message):
        check_int("n", value, low, high, hint=" (hint)")


def test_check_bool_takes_python_and_numpy_bools_only():
    assert check_bool("flag", np.bool_(True)) is True
    with pytest.raises(TypeError, match=r"flag=1 must be True or False"):
        check_bool("flag", 1)


def test_check_number_refuses_types_then_values():
    assert check_number("x", np.float32(0.5), 0, 1) == 0.5
    with pytest.raises(TypeError, match=r"x='1' must be a finite number in \[0, 1\]"):
        check_number("x", "1", 0, 1)
    with pytest.raises(TypeError, match=r"x=True must be a finite number"):
        check_number("x", True)
    with pytest.raises(ValueError, match=r"x=nan must be a finite number >= 0"):
        check_number("x", math.nan, 0)
    with pytest.raises(ValueError, match=r"x=2 must be a finite number in \[0, 1\] \(why\)"):
        check_number("x", 2, 0, 1, hint=" (why)")


def test_check_seconds_wants_a_positive_finite_duration():
    assert check_seconds("timeout", 2) == 2.0
    with pytest.raises(ValueError, match=r"timeout=0 must be > 0 seconds"):
        check_seconds("timeout", 0)
    with pytest.raises(ValueError, match=r"timeout=inf must be a finite number"):
        check_seconds("timeout", math.inf)
    with pytest.raises(TypeError, match=r"timeout=None must be a finite number"):
        check_seconds("timeout", None)
