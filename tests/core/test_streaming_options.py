"""``StreamOptions`` and ``check_stream_config``: validated once, errors name the field and
the fix, a stream refuses the plan options it cannot honour."""

import dataclasses

import pytest

from chronica.core import ControllerOptions, Packing, ScheduleConfig
from chronica.core.streaming import StreamOptions, check_stream_config

PACKING = Packing(max_tokens=64)


def _config(**options):
    options.setdefault("packing", PACKING)
    return ScheduleConfig(num_replicas=2, batch_size=8, **options)


def test_defaults_repr_and_frozen():
    options = StreamOptions()
    assert (options.window_steps, options.buffer_size, options.infinite) == (2, 1024, False)
    assert repr(StreamOptions(window_steps=4)) == (
        "StreamOptions(window_steps=4, buffer_size=1024, infinite=False)"
    )
    assert StreamOptions.field_names() == ("window_steps", "buffer_size", "infinite")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.buffer_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("window_steps", 0, ValueError),
        ("window_steps", 1.5, TypeError),
        ("buffer_size", 0, ValueError),
        ("buffer_size", "8", TypeError),
        ("infinite", 1, TypeError),
    ],
)
def test_wrong_values_name_the_field(field, value, error):
    with pytest.raises(error, match=field):
        StreamOptions(**{field: value})


def test_a_stream_takes_static_and_dynamic_packed_plans():
    for config in (_config(), _config(kind="dynamic"), _config(seed=4, cost="quadratic")):
        assert check_stream_config(config) is config
    tuned = _config(kind="dynamic", controller=ControllerOptions(history=8))
    assert check_stream_config(tuned).controller.history == 8


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"shuffle": False}, "shuffle=.*buffer_size"),
        ({"window": 4}, "window=4.*window_steps"),
        ({"drop_last": True}, "drop_last"),
        ({"jitter": 0.3}, "jitter"),
        ({"groups": (0, 1)}, "groups"),
        ({"kind": "dynamic", "min_batch": 1}, "min_batch"),
    ],
)
def test_plan_options_a_stream_cannot_honour_are_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        check_stream_config(_config(**options))


def test_a_stream_must_pack_whole_documents():
    with pytest.raises(TypeError, match="ScheduleConfig"):
        check_stream_config(PACKING)
    with pytest.raises(ValueError, match=r"packing=chronica\.Packing"):
        check_stream_config(ScheduleConfig(num_replicas=2, batch_size=8))
    with pytest.raises(ValueError, match="split"):
        check_stream_config(_config(packing=Packing(max_tokens=64, long_documents="split")))
