"""chronica.runtime.options: DynamicOptions validates its transport fields on construction
(the plan options window/min_batch/max_batch are ScheduleConfig's, checked with it)."""

import pytest

from chronica.runtime import DynamicOptions


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("timeout", 0, "timeout=0 must be > 0 seconds"),
        ("timeout", float("nan"), "timeout=nan must be a finite number"),
        ("port", 70000, r"port=70000 must be an int in \[0, 65534\]"),
        ("host", " ", "host=' ' must be a host name or address"),
    ],
)
def test_dynamic_options_refuse_bad_transport_values_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        DynamicOptions(**{field: value})


def test_dynamic_options_keep_the_transport_they_were_given():
    options = DynamicOptions(host="127.0.0.1", port=0, timeout=2.5)
    assert (options.host, options.port, options.timeout) == ("127.0.0.1", 0, 2.5)
