"""``chronica.core.packing.options.Packing``: validation by field, defaults, digest tuple
and repr."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chronica.core.packing import (
    Packing,
)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 8, "row_length": 0}, "row_length"),
        ({"max_tokens": 8, "row_length": 9}, "row_length"),
        ({"max_tokens": 8, "tokens_per_step": 0}, "tokens_per_step"),
        ({"max_tokens": 8, "micro_batches": 0}, "micro_batches"),
        ({"max_tokens": 8, "long_documents": "drop"}, "long_documents"),
        ({"max_tokens": 8, "loss": "mean"}, "loss"),
    ],
)
def test_a_wrong_value_is_a_value_error_naming_the_field(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        Packing(**kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"max_tokens": 8.0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 8, "row_length": 2.5}, "row_length"),
        ({"max_tokens": 8, "tokens_per_step": 1.5}, "tokens_per_step"),
        ({"max_tokens": 8, "micro_batches": "2"}, "micro_batches"),
        ({"max_tokens": 8, "long_documents": None}, "long_documents"),
        ({"max_tokens": 8, "loss": 1}, "loss"),
    ],
)
def test_a_wrong_type_is_a_type_error_naming_the_field(kwargs, name):
    with pytest.raises(TypeError, match=rf"^{name}="):
        Packing(**kwargs)


def test_choices_are_named_in_the_message():
    with pytest.raises(ValueError, match=r"\('error', 'split', 'truncate'\)"):
        Packing(max_tokens=8, long_documents="drop")
    with pytest.raises(ValueError, match=r"\('token', 'sample', 'loss_token'\)"):
        Packing(max_tokens=8, loss="mean")


def test_packing_fills_in_defaults_and_stores_python_ints():
    packing = Packing(max_tokens=np.int64(10), row_length=np.int32(3), micro_batches=np.int8(2))
    assert packing.rows == 3 and packing.length == 3
    assert all(type(v) is int for v in (packing.max_tokens, packing.row_length))
    assert type(packing.micro_batches) is int
    assert json.loads(json.dumps(packing.to_tuple())) == [
        10,
        3,
        None,
        2,
        "error",
        "token",
        "rank",
        1,
        1,
        None,
        None,
    ]
    flat = Packing(max_tokens=8)
    assert flat.row_length == 8 and flat.rows == 1 and flat.length == 8


@pytest.mark.parametrize(
    "packing,shown",
    [
        (Packing(max_tokens=8), "Packing(max_tokens=8)"),
        (Packing(max_tokens=8, row_length=8), "Packing(max_tokens=8)"),
        (
            Packing(8, 2, 64, 3, "split", "sample"),
            "Packing(max_tokens=8, row_length=2, tokens_per_step=64, micro_batches=3, "
            "long_documents='split', loss='sample')",
        ),
    ],
)
def test_repr_shows_the_configuration_and_rebuilds_an_equal_packing(packing, shown):
    assert repr(packing) == shown
    assert eval(shown, {"Packing": Packing}) == packing


def test_packing_is_frozen_and_hashable():
    packing = Packing(max_tokens=8)
    with pytest.raises(AttributeError):
        packing.max_tokens = 9  # type: ignore[misc]
    assert hash(packing) == hash(Packing(max_tokens=8, row_length=8))


def test_the_package_exports_every_public_name_of_its_rooms():
    import chronica.core.packing as package
    from chronica.core.packing import documents, epoch, options, planner, step, weights

    names = {
        "BALANCES",
        "LONG_DOCUMENTS",
        "LOSS_NORMALISATIONS",
        "PackedEpoch",
        "PackedStep",
        "Packing",
        "Pieces",
        "StepPlan",
        "fill_empty",
        "in_pipeline_order",
        "micro_weights",
        "pack_epoch",
        "pack_step",
        "pack_steps",
        "pieces",
        "plan_step",
        "step_starts",
    }
    assert set(package.__all__) == names
    rooms = (documents, epoch, options, planner, step, weights)
    assert names == {name for room in rooms for name in room.__all__}
    for name in names:
        assert any(getattr(room, name, None) is getattr(package, name) for room in rooms)
