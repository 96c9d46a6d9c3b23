"""Argument checks shared by every layer: one rule per kind of value, one exception policy.

Policy: a bad *value* of a public argument raises ``ValueError`` whose message starts with
``name=value`` and says what is accepted (and, where one exists, how to fix it). Integers
accept Python and numpy integers (as torch does) but not ``bool``; numbers accept any real
Python or numpy number but not ``bool``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_bool", "check_int", "check_number", "check_seconds", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy integer (a ``bool`` is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(
    name: str, value: Any, low: int | None = None, high: int | None = None, hint: str = ""
) -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]`` (either bound may be
    ``None``: open); else ``ValueError`` naming ``name``, with ``hint`` appended."""
    if low is not None and high is not None:
        accepted = f"an int in [{low}, {high}]"
    elif low is not None:
        accepted = f"an int >= {low}"
    elif high is not None:
        accepted = f"an int <= {high}"
    else:
        accepted = "an int"
    if not is_int(value):
        raise ValueError(f"{name}={value!r} must be {accepted}{hint}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name}={value!r} must be {accepted}{hint}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (numpy's included); else ``ValueError``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r} must be True or False")
    return bool(value)


def check_number(
    name: str, value: Any, low: float | None = None, high: float | None = None, hint: str = ""
) -> float:
    """``value`` as a finite ``float`` in ``[low, high]`` (bounds may be ``None``); a
    ``bool`` is refused. ``ValueError`` names ``name``, with ``hint`` appended."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    number = float(value) if ok else math.nan
    if (
        not math.isfinite(number)
        or (low is not None and number < low)
        or (high is not None and number > high)
    ):
        bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
        if low is not None and high is None:
            bounds = f" >= {low}"
        raise ValueError(f"{name}={value!r} must be a finite number{bounds}{hint}")
    return number


def check_seconds(name: str, value: Any) -> float:
    """A positive, finite duration in seconds; else ``ValueError`` naming ``name``."""
    seconds = check_number(name, value, 0.0, hint=" (seconds)")
    if seconds <= 0:
        raise ValueError(f"{name}={value!r} must be > 0 seconds and finite")
    return seconds
