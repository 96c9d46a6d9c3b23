"""``chronica.jax.GrainStream``: the streamed micro-batches as a Grain ``IterDataset``, equal
to ``chronica.jax.stream``'s, resumed bitwise through Grain's ``get_state`` / ``set_state``
(also through a ``.map`` after it), and wrong arguments refused when it is made."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("grain")

from stream_source import make_source

import chronica.jax
from chronica.core.packing import Packing

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_one_pass_is_the_jax_streams_micro_batches():
    expected = list(chronica.jax.stream(make_source(), PACKING, **OPTIONS))
    dataset = chronica.jax.GrainStream(make_source(), PACKING, **OPTIONS)
    assert "batch_size=12" in repr(dataset)
    assert _same(list(dataset), expected)
    assert _same(list(dataset), expected)  # every iter() starts the stream again


@pytest.mark.parametrize("mapped", [False, True])
def test_grains_checkpoint_state_resumes_bitwise(mapped):
    def dataset():
        data = chronica.jax.GrainStream(make_source(random_access=False), PACKING, **OPTIONS)
        return data.map(lambda b: {**b, "double": b["tokens"] * 2}) if mapped else data

    everything = list(dataset())
    first = iter(dataset())
    head = [next(first) for _ in range(5)]  # mid-window
    state = json.loads(json.dumps(first.get_state()))  # as a checkpoint stores it
    first.close()
    again = iter(dataset())
    again.set_state(state)
    assert _same(head + list(again), everything)


def test_wrong_arguments_fail_when_the_dataset_is_made():
    with pytest.raises(ValueError, match="batch_size"):
        chronica.jax.GrainStream(make_source(), PACKING, batch_size=0)
