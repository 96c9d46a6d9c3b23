"""chronica.runtime.request: a face's call -> one plan request -> a stream."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from chronica.core import ScheduleConfig
from chronica.runtime import DynamicOptions
from chronica.runtime.request import (
    given_options,
    groups_from_environment,
    open_stream,
    plan_face,
    plan_request,
    resolve_world,
)


def _request(options=None, **kwargs):
    base = dict(batch_size=8, num_replicas=2, rank=0, face="face")
    return plan_request(options or {}, **{**base, **kwargs})


def test_world_comes_from_arguments_config_or_the_framework():
    assert resolve_world(np.int64(4), np.int64(3), None) == (4, 3)
    assert resolve_world(None, None, lambda: (2, 1)) == (2, 1)
    config = ScheduleConfig(num_replicas=2, batch_size=8)
    assert resolve_world(None, 1, None, config=config) == (2, 1)
    with pytest.raises(
        ValueError, match=r"Invalid rank 4, rank should be in the interval \[0, 3\]"
    ):
        resolve_world(4, 4, None)
    with pytest.raises(ValueError, match="num_replicas and rank are required: pass both"):
        resolve_world(None, 0, None, "pass both")


def test_options_build_the_config_every_face_would_build():
    config, rank = _request({"kind": "guided", "seed": 3, "window": 4}, rank=1)
    assert rank == 1
    assert config == ScheduleConfig(num_replicas=2, batch_size=8, kind="guided", seed=3, window=4)
    assert config.mode.groups_by_size


def test_a_given_config_is_used_as_is_and_refuses_options_beside_it():
    config = ScheduleConfig(num_replicas=2, batch_size=8, kind="guided")
    assert _request(config=config, batch_size=None)[0] is config
    assert _request(config=config, batch_size=8)[0] is config
    with pytest.raises(ValueError, match="pass seed inside it"):
        _request({"seed": 3}, config=config, batch_size=None)
    with pytest.raises(ValueError, match="pass batch_size inside it"):
        _request(config=config, batch_size=16)
    with pytest.raises(ValueError, match=r"config\.num_replicas=2 differs from the world size 4"):
        _request(config=config, batch_size=None, num_replicas=4)
    with pytest.raises(TypeError, match=r"config=\{\} must be a chronica\.ScheduleConfig"):
        _request(config={})


def test_a_dynamic_config_goes_with_transport_options():
    # The two objects are passed side by side: the plan in one, the transport in the other.
    config = ScheduleConfig(num_replicas=2, batch_size=8, kind="dynamic", window=4)
    options = DynamicOptions(port=0, timeout=3.0)
    assert _request(config=config, batch_size=None, dynamic=options)[0] is config
    with pytest.raises(TypeError, match=r"dynamic=.* must be a chronica\.runtime\.DynamicOptions"):
        _request(dynamic={"window": 4})


def test_unknown_options_are_refused_as_python_refuses_keywords():
    with pytest.raises(TypeError, match=r"face\(\) got an unexpected keyword argument 'windw'; "
                       r"did you mean 'window'\?"):  # fmt: skip
        _request({"windw": 4})
    with pytest.raises(TypeError, match=r"plan options are the fields of chronica\.ScheduleConfig"):
        _request({"num_replicas": 4})


def test_errors_name_the_faces_batch_argument():
    with pytest.raises(ValueError, match=r"^global_batch_size=10 \(global\) must be a multiple"):
        _request(batch_size=10, num_replicas=4, batch_name="global_batch_size")
    with pytest.raises(TypeError, match=r"^global_batch_size='8' must be an int"):
        _request(batch_size="8", batch_name="global_batch_size")
    with pytest.raises(ValueError, match=r"global_batch_size \(the global batch .*\) is required"):
        _request(batch_size=None, batch_name="global_batch_size", needs_step=True)
    # A token budget is a step size too.
    from chronica.core import Packing

    packing = Packing(max_tokens=64, tokens_per_step=256)
    config, _ = _request({"packing": packing}, batch_size=None, needs_step=True)
    assert config.packing == packing
    with pytest.raises(ValueError, match=r"config\.batch_size .* is required"):
        _request(config=ScheduleConfig(num_replicas=2), batch_size=None, needs_step=True)


def test_partitioned_shuffles_take_nodes_from_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert groups_from_environment(4) == [0, 0, 1, 1]
    config, _ = _request({"shuffle": "local"}, num_replicas=4)
    assert config.groups == (0, 0, 1, 1)
    assert _request(num_replicas=4)[0].groups is None  # only partitioned policies
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3 does not divide the world size 4"):
        _request({"shuffle": "local"}, num_replicas=4)


def test_given_options_drop_what_equals_the_defaults():
    assert given_options(shuffle=True, seed=0, drop_last=False) == {}
    assert given_options(shuffle=False, seed=np.int64(0), drop_last=True) == {
        "shuffle": False,
        "seed": np.int64(0),
        "drop_last": True,
    }


class _Face:
    """A made-up face.

    Args:
        data: what it serves.
    """

    def __init__(self, data, *, seed_of_data=0, **options):
        self.config, _ = plan_request(
            options, batch_size=4, num_replicas=2, rank=0, face=type(self).__name__
        )


def test_plan_face_documents_and_signs_every_option_it_does_not_name():
    face = plan_face(_Face)
    params = inspect.signature(face).parameters
    for name in ScheduleConfig.option_names():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"\n    {name}: " in face.__doc__
    assert params["window"].default == 16
    assert "seed_of_data" in params and "options" not in params
    assert face(None, window=5).config.window == 5

    class NoOptions:
        def __init__(self, data):
            pass

    with pytest.raises(TypeError, match=r"must end with \*\*options"):
        plan_face(NoOptions)


def test_open_stream_runs_a_dynamic_config_with_transport_options():
    # ScheduleConfig(kind="dynamic") with DynamicOptions(timeout=...) beside it: one rank,
    # a real coordinator on an OS-picked port; every sample of every step exactly once.
    sizes = np.arange(1, 41, dtype=np.float64)
    config = ScheduleConfig(num_replicas=1, batch_size=8, kind="dynamic", window=2)
    stream = open_stream(sizes, config, 0, dynamic=DynamicOptions(port=0, timeout=30.0))
    try:
        assert stream.session is not None
        seen = []
        stream.set_epoch(0)
        for batch in stream.batches():
            seen.extend(batch.indices.tolist())
            stream.report(0.01)
        assert sorted(seen) == list(range(40))
        assert stream.session.windows_dynamic >= 1
    finally:
        stream.close()
