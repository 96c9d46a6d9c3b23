"""chronica.core.config: ScheduleConfig, the one plan request."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from chronica.core import ControllerOptions, Packing, ScheduleConfig
from chronica.core.modes import DYNAMIC, GUIDED, STATIC


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(num_replicas=0), ValueError, "num_replicas"),
        (dict(num_replicas=2.0), TypeError, "num_replicas"),
        (dict(num_replicas=4, batch_size=10), ValueError, "multiple of num_replicas"),
        (dict(num_replicas=4, batch_size=-4), ValueError, "batch_size"),
        (
            dict(num_replicas=4, batch_size=8, kind="dynamic", exact=False),
            ValueError,
            "exact=False",
        ),
        (dict(num_replicas=4, batch_size=8, kind="dynamic", min_batch=3), ValueError, "min_batch"),
        (dict(num_replicas=4, batch_size=8, kind="dynamic", window=0), ValueError, "window"),
        (dict(num_replicas=4, batch_size=8, window="8"), TypeError, "window"),
        (dict(num_replicas=4, batch_size=8, variable_batch=True), ValueError, "variable_batch"),
        (dict(num_replicas=4, batch_size=8, variable_batch=1), TypeError, "variable_batch"),
        (dict(num_replicas=4, batch_size=8, kind="fancy"), ValueError, "kind"),
        (dict(num_replicas=4, batch_size=8, kind=1), TypeError, "kind"),
        (dict(num_replicas=4, kind="guided"), ValueError, "needs batch_size"),
        (dict(num_replicas=4, kind="dynamic"), ValueError, "needs batch_size"),
        (dict(num_replicas=4, seed=1.5), TypeError, "seed"),
        (dict(num_replicas=4, shuffle="yes"), ValueError, "shuffle"),
        (dict(num_replicas=4, jitter=2.0), ValueError, "jitter"),
        (dict(num_replicas=4, cost="cubic"), ValueError, "cost"),
        (dict(num_replicas=4, packing={"max_tokens": 8}), TypeError, "packing"),
        (
            dict(num_replicas=4, batch_size=8, kind="dynamic", controller={}),
            TypeError,
            "controller",
        ),
        (
            dict(num_replicas=4, batch_size=8, kind="guided", packing=Packing(max_tokens=8)),
            ValueError,
            "cannot be packed",
        ),
        (
            dict(num_replicas=4, batch_size=8, packing=Packing(8, tokens_per_step=64)),
            ValueError,
            "exactly one step size",
        ),
        (
            dict(num_replicas=4, batch_size=8, packing=Packing(8, loss="loss_token")),
            ValueError,
            r"loss_token.*plan_step",
        ),
        (
            dict(
                num_replicas=4,
                batch_size=8,
                packing=Packing(8, context_parallel=2, pad_multiple=4),
            ),
            ValueError,
            r"context_parallel=2.*chronica\.plan_step",
        ),
    ],
)
def test_bad_configuration_is_named_with_the_right_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        ScheduleConfig(**kwargs)


def test_kinds_are_stored_as_modes_and_compare_as_their_names():
    config = ScheduleConfig(num_replicas=2, batch_size=4, kind="dynamic")
    assert config.kind is DYNAMIC and config.mode is DYNAMIC
    assert config.kind == "dynamic"
    assert ScheduleConfig(num_replicas=2, batch_size=4, kind=GUIDED) == ScheduleConfig(
        num_replicas=2, batch_size=4, kind="guided"
    )
    assert ScheduleConfig(num_replicas=2).mode is STATIC
    assert pickle.loads(pickle.dumps(config)).mode is DYNAMIC


def test_numpy_integers_are_stored_as_python_ints():
    config = ScheduleConfig(num_replicas=np.int64(4), batch_size=np.int32(8), seed=np.int64(3))
    assert type(config.num_replicas) is int and type(config.batch_size) is int
    assert type(config.seed) is int


def test_digest_depends_on_every_plan_field_and_kind_fields_only_where_the_kind_uses_them():
    base = ScheduleConfig(num_replicas=4, batch_size=8)
    digests = {base.digest("s")}
    for change in (
        dict(batch_size=16),
        dict(kind="guided"),
        dict(exact=False),
        dict(shuffle=False),
        dict(seed=1),
        dict(drop_last=True),
        dict(cost="quadratic"),
        dict(jitter=0.2),
        dict(groups=(0, 0, 1, 1)),
        dict(kind="dynamic"),
        dict(kind="dynamic", window=4),
        dict(kind="dynamic", variable_batch=True),
        dict(packing=Packing(max_tokens=64)),
    ):
        digests.add(dataclasses.replace(base, **change).digest("s"))
    assert len(digests) == 14
    assert base.digest("s") != base.digest("t")
    # The window shapes only dynamic plans: a static digest ignores it.
    assert dataclasses.replace(base, window=4).digest("s") == base.digest("s")
    assert base.describe("s")["kind"] == "static" and base.describe("s")["dynamic"] is None


def test_digests_of_unpacked_configurations_are_stable():
    # Saved states carry digests: they must not move when code moves.
    config = ScheduleConfig(num_replicas=4, batch_size=8, kind="dynamic", seed=7)
    assert config.describe("s")["dynamic"] == [False, 16, 1, 8]
    assert config.digest("s") == ScheduleConfig(4, 8, kind="dynamic", seed=7).digest("s")


def test_option_names_are_every_field_the_faces_take():
    names = ScheduleConfig.option_names()
    fields = [f.name for f in dataclasses.fields(ScheduleConfig)]
    assert list(names) == [f for f in fields if f not in ("num_replicas", "batch_size")]
    defaults = ScheduleConfig.option_defaults()
    assert set(defaults) == set(names)
    assert defaults["controller"] == ControllerOptions() and defaults["kind"] is STATIC
    # Every option is documented in the Args: section the faces' docs are made from.
    doc = ScheduleConfig.__doc__ or ""
    for name in (*fields,):
        assert f"\n        {name}: " in doc


def test_repr_shows_the_world_the_batch_and_what_differs_from_the_defaults():
    config = ScheduleConfig(num_replicas=2, batch_size=4, kind="dynamic", window=8)
    assert repr(config) == "ScheduleConfig(num_replicas=2, batch_size=4, kind='dynamic', window=8)"
    assert repr(ScheduleConfig(num_replicas=3)) == "ScheduleConfig(num_replicas=3, batch_size=None)"
