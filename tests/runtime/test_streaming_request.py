"""``stream_request`` and ``stream_face``: a streamed face's keywords become one plan request
and one ``StreamOptions``, each option declared once and documented on every face."""

import inspect

import pytest

from chronica.core import Packing, ScheduleConfig
from chronica.core.streaming import StreamOptions
from chronica.runtime.streaming_exchange import LocalGroup
from chronica.runtime.streaming_request import stream_face, stream_request

PACKING = Packing(max_tokens=64)


def _request(options, **given):
    given.setdefault("packing", PACKING)
    given.setdefault("batch_size", 8)
    return stream_request(options, collectives=LocalGroup(2).rank(1), face="face", **given)


def test_keywords_split_into_the_plan_and_the_stream_options():
    config, stream = _request({"seed": 3, "kind": "dynamic", "buffer_size": 5})
    assert (config.num_replicas, config.batch_size, config.seed) == (2, 8, 3)
    assert config.kind == "dynamic" and config.packing == PACKING
    assert stream == StreamOptions(buffer_size=5)


def test_whole_objects_are_taken_as_given():
    config = ScheduleConfig(num_replicas=2, batch_size=8, packing=PACKING, seed=9)
    stream = StreamOptions(window_steps=3)
    assert _request({}, packing=None, batch_size=None, config=config, stream=stream) == (
        config,
        stream,
    )


def test_an_option_given_twice_or_unknown_is_refused_by_name():
    stream = StreamOptions()
    with pytest.raises(ValueError, match=r"window_steps inside it"):
        _request({"window_steps": 3}, stream=stream)
    with pytest.raises(TypeError, match="stream="):
        _request({}, stream={"window_steps": 3})
    config = ScheduleConfig(num_replicas=2, batch_size=8, packing=PACKING)
    with pytest.raises(ValueError, match="packing"):
        _request({}, batch_size=None, config=config)
    with pytest.raises(ValueError, match="seed"):
        _request({"seed": 1}, packing=None, batch_size=None, config=config)
    with pytest.raises(TypeError, match=r"did you mean 'buffer_size'"):
        _request({"bufer_size": 3})
    with pytest.raises(ValueError, match=r"config\.num_replicas=4"):
        _request(
            {},
            packing=None,
            batch_size=None,
            config=ScheduleConfig(num_replicas=4, batch_size=8, packing=PACKING),
        )


def test_a_stream_face_lists_and_documents_every_option():
    @stream_face
    class Face:
        """A face."""

        def __init__(self, source, packing=None, *, batch_size=None, **options):
            self.options = options

    parameters = inspect.signature(Face.__init__).parameters
    for name in (*StreamOptions.field_names(), *ScheduleConfig.option_names()):
        assert name in parameters, name
        assert name == "packing" or f"    {name}: " in (Face.__doc__ or "")
    assert parameters["buffer_size"].default == 1024
    assert parameters["packing"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
