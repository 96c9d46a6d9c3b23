"""chronica.runtime.options: DynamicOptions, the transport of kind="dynamic"."""

from __future__ import annotations

import dataclasses

import pytest

from chronica.runtime import DynamicOptions


def test_defaults_and_values_are_kept_frozen():
    options = DynamicOptions()
    assert (options.host, options.port, options.timeout) == (None, None, 10.0)
    given = DynamicOptions("10.0.0.1", 0, 3)
    assert (given.host, given.port, given.timeout) == ("10.0.0.1", 0, 3.0)
    assert given == DynamicOptions(host="10.0.0.1", port=0, timeout=3.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.port = 1  # type: ignore[misc]
    assert repr(given) == "DynamicOptions(host='10.0.0.1', port=0, timeout=3.0)"


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("timeout", 0, ValueError, "timeout=0 must be > 0 seconds"),
        ("timeout", float("nan"), ValueError, "timeout=nan must be a finite number"),
        ("timeout", "3", TypeError, "timeout='3' must be a finite number"),
        ("port", 70000, ValueError, r"port=70000 must be an int in \[0, 65534\]"),
        ("port", "80", TypeError, r"port='80' must be an int in \[0, 65534\]"),
        ("host", " ", ValueError, "host=' ' must be a host name or address"),
        ("host", 127, TypeError, "host=127 must be a host name or address"),
    ],
)
def test_bad_values_are_refused_by_name(field, value, error, message):
    with pytest.raises(error, match=message):
        DynamicOptions(**{field: value})


@pytest.mark.parametrize("field", ["window", "min_batch", "max_batch", "controller"])
def test_plan_options_moved_to_the_plan_request_and_the_error_says_where(field):
    with pytest.raises(
        TypeError, match=rf"DynamicOptions\({field}=\.\.\.\) moved: .* pass {field}="
    ):
        DynamicOptions(**{field: 4})
    with pytest.raises(TypeError, match="unexpected keyword argument 'hots'"):
        DynamicOptions(hots="x")  # type: ignore[call-arg]
