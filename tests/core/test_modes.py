"""chronica.core.modes: the kinds as objects that own their rules."""

from __future__ import annotations

import pickle

import pytest

from chronica.core import ScheduleConfig
from chronica.core.modes import DYNAMIC, GUIDED, KINDS, MODES, STATIC, Mode, as_mode


def test_names_and_objects_give_the_same_mode():
    assert KINDS == ("static", "guided", "dynamic")
    for name, mode in MODES.items():
        assert as_mode(name) is mode and as_mode(mode) is mode
        assert str(mode) == name and mode == name and hash(mode) == hash(name)
        assert pickle.loads(pickle.dumps(mode)) is mode
    assert STATIC != GUIDED and STATIC != "guided"
    assert repr(DYNAMIC) == "chronica.core.modes.DYNAMIC"


def test_bad_kinds_are_refused_by_type_and_by_value():
    with pytest.raises(TypeError, match=r"kind=3 must be one of"):
        as_mode(3)
    with pytest.raises(ValueError, match=r"kind='fast' is not one of \('static', 'guided'"):
        as_mode("fast")


def test_each_mode_says_what_it_does():
    assert [m.opens_session for m in (STATIC, GUIDED, DYNAMIC)] == [False, False, True]
    assert [m.groups_by_size for m in (STATIC, GUIDED, DYNAMIC)] == [False, True, False]
    assert STATIC.elastic_refusal is None and GUIDED.elastic_refusal is None
    assert "cannot continue an epoch at another world size" in (DYNAMIC.elastic_refusal or "")


def test_batch_and_packing_rules_follow_the_mode_and_exact():
    exact = ScheduleConfig(num_replicas=2)
    pool = ScheduleConfig(num_replicas=2, batch_size=4, exact=False)
    assert not STATIC.needs_batch(exact) and STATIC.needs_batch(pool)
    assert GUIDED.needs_batch(exact) and DYNAMIC.needs_batch(exact)
    assert STATIC.packs(exact) and not STATIC.packs(pool)
    assert DYNAMIC.packs(exact) and not GUIDED.packs(exact)


def test_only_the_dynamic_mode_has_digest_fields():
    config = ScheduleConfig(num_replicas=2, batch_size=4, kind="dynamic", variable_batch=True)
    assert DYNAMIC.describe(config) == [True, 16, 1, 4]
    assert STATIC.describe(config) is None and GUIDED.describe(config) is None


def test_the_mode_checks_the_options_of_its_kind():
    with pytest.raises(ValueError, match="variable_batch=True needs kind='dynamic'"):
        ScheduleConfig(num_replicas=2, batch_size=4, kind="guided", variable_batch=True)
    with pytest.raises(ValueError, match=r"1 <= min_batch <= 2 <= max_batch"):
        ScheduleConfig(num_replicas=2, batch_size=4, kind="dynamic", max_batch=1)


def test_a_mode_is_a_class_of_its_own():
    assert all(isinstance(mode, Mode) for mode in MODES.values())
    assert len({type(mode) for mode in MODES.values()}) == len(MODES)
