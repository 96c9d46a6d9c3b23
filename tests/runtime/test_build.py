"""chronica.runtime.build: a face's arguments assembled into one ScheduleConfig and a
RankStream (the world from the arguments or the framework, the configuration's checks)."""

import json

import numpy as np
import pytest

from chronica.core import ScheduleConfig
from chronica.runtime.build import open_stream, resolve_world, schedule_config


def _sizes(n=203, seed=0):
    return np.random.default_rng(seed).lognormal(3, 1, n).astype(int) + 1


def test_world_and_config_assembly_refuse_bad_arguments_by_name():
    assert resolve_world(np.int64(4), np.int64(3), None) == (4, 3)
    assert resolve_world(None, None, lambda: (2, 1)) == (2, 1)
    with pytest.raises(
        ValueError, match=r"Invalid rank 4, rank should be in the interval \[0, 3\]"
    ):
        resolve_world(4, 4, None)
    with pytest.raises(ValueError, match="num_replicas and rank are required: pass both"):
        resolve_world(None, 0, None, "pass both")
    config = ScheduleConfig(num_replicas=2, batch_size=8)
    assert resolve_world(None, 1, None, config=config) == (2, 1)
    kw = {"kind": "static", "exact": True, "shuffle": True, "seed": 0, "drop_last": False,
          "cost": None, "groups": None, "variable_batch": False, "packing": None}  # fmt: skip
    assert schedule_config(config, 2, None, kw, None) is config
    with pytest.raises(ValueError, match="pass seed inside it"):
        schedule_config(config, 2, None, {**kw, "seed": 3}, None)
    with pytest.raises(ValueError, match=r"config\.num_replicas=2 differs from the world size 4"):
        schedule_config(config, 4, None, kw, None)
    with pytest.raises(ValueError, match=r"^global_batch_size=10 \(global\) must be a multiple"):
        schedule_config(None, 4, 10, kw, None, batch_name="global_batch_size")
    with pytest.raises(ValueError, match=r"dynamic=.* must be a chronica\.runtime\.DynamicOptions"):
        schedule_config(None, 4, 8, kw, {"window": 4})


def test_numpy_integers_plan_and_save_as_python_ints_do():
    numpy_config = ScheduleConfig(
        num_replicas=np.int64(4), batch_size=np.int32(16), seed=np.int64(3), window=np.int16(4)
    )
    python_config = ScheduleConfig(num_replicas=4, batch_size=16, seed=3, window=4)
    a = open_stream(_sizes(), numpy_config, np.int64(2))
    b = open_stream(_sizes(), python_config, 2)
    assert a.scheduler.digest == b.scheduler.digest
    assert [x.indices.tolist() for x in a.batches()] == [x.indices.tolist() for x in b.batches()]
    assert json.dumps(a.state()) == json.dumps(b.state())
