"""Argument checks shared by every layer: one rule per kind of value, one exception policy.

Policy: a public argument of the wrong *type* raises ``TypeError``, one of the right type
but a bad *value* raises ``ValueError``; either message starts with ``name=value`` and says
what is accepted (and, where one exists, how to fix it). Integers accept Python and numpy
integers (as torch does) but not ``bool``; numbers accept any real Python or numpy number
but not ``bool``.

Example::

    >>> check_int("epochs", 3, 1)
    3
    >>> check_int("epochs", "3", 1)
    Traceback (most recent call last):
    TypeError: epochs='3' must be an int >= 1
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_bool", "check_int", "check_number", "check_seconds", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy integer (a ``bool`` is not).

    Args:
        value: anything.
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(
    name: str, value: Any, low: int | None = None, high: int | None = None, hint: str = ""
) -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]``; else ``TypeError``
    (not an integer) or ``ValueError`` (out of bounds) naming ``name``.

    Args:
        name: the argument's name, as the user wrote it.
        value: the argument's value.
        low: the smallest accepted value (``None``: unbounded).
        high: the largest accepted value (``None``: unbounded).
        hint: appended to the message (what the argument is, how to fix it).
    """
    if low is not None and high is not None:
        accepted = f"an int in [{low}, {high}]"
    elif low is not None:
        accepted = f"an int >= {low}"
    elif high is not None:
        accepted = f"an int <= {high}"
    else:
        accepted = "an int"
    if not is_int(value):
        raise TypeError(f"{name}={value!r} must be {accepted}{hint}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name}={value!r} must be {accepted}{hint}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (numpy's included); else ``TypeError``.

    Args:
        name: the argument's name.
        value: the argument's value.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be True or False")
    return bool(value)


def check_number(
    name: str, value: Any, low: float | None = None, high: float | None = None, hint: str = ""
) -> float:
    """``value`` as a finite ``float`` in ``[low, high]`` (bounds may be ``None``); a
    ``bool`` or a non-number raises ``TypeError``, a non-finite or out-of-bounds number
    ``ValueError``, naming ``name``.

    Args:
        name: the argument's name.
        value: the argument's value.
        low: the smallest accepted value (``None``: unbounded).
        high: the largest accepted value (``None``: unbounded).
        hint: appended to the message.
    """
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
    if low is not None and high is None:
        bounds = f" >= {low}"
    if not ok:
        raise TypeError(f"{name}={value!r} must be a finite number{bounds}{hint}")
    number = float(value)
    if (
        not math.isfinite(number)
        or (low is not None and number < low)
        or (high is not None and number > high)
    ):
        raise ValueError(f"{name}={value!r} must be a finite number{bounds}{hint}")
    return number


def check_seconds(name: str, value: Any) -> float:
    """A positive, finite duration in seconds; else ``TypeError``/``ValueError`` naming
    ``name``.

    Args:
        name: the argument's name.
        value: the duration in seconds.
    """
    seconds = check_number(name, value, 0.0, hint=" (seconds)")
    if seconds <= 0:
        raise ValueError(f"{name}={value!r} must be > 0 seconds and finite")
    return seconds
