"""``chronica.tf.stream``: a sharded stream as a ``tf.data.Dataset`` of packed micro-batches,
in one process and in a real 2-worker ``MultiWorkerMirroredStrategy`` job."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stream_source import make_source  # noqa: E402
from workers import HELPERS, ROOT, base_env, free_port, run_workers  # noqa: E402

import chronica.tf  # noqa: E402
from chronica.core.packing import Packing  # noqa: E402

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def elements(dataset) -> list[dict]:
    return [{k: v.numpy() for k, v in e.items()} for e in dataset]


def test_one_pass_yields_every_sample_once_in_static_shapes():
    source = make_source()
    batches = chronica.tf.stream(source, PACKING, **OPTIONS)
    assert "batch_size=12" in repr(batches)
    out = elements(batches.dataset)
    assert out and all(e["tokens"].shape == (2, 512) for e in out)
    ids = [i for e in out for i in e["ids"].tolist() if i >= 0]
    assert sorted(ids) == list(range(source.offsets[-1]))
    for e in out:  # the source's tokens are their sample's id
        real = e["segment_ids"] > 0
        assert set(e["tokens"][real].tolist()) == {i for i in e["ids"].tolist() if i >= 0}
    # One element per micro-batch: num_micro of each step, in order.
    steps = {}
    for e in out:
        steps.setdefault(int(e["step"]), []).append(int(e["micro"]))
    assert all(m == list(range(len(m))) for m in steps.values())
    # A second iteration is the next pass.
    again = elements(batches.dataset)
    assert sorted(i for e in again for i in e["ids"].tolist() if i >= 0) == sorted(ids)
    assert {int(e["epoch"]) for e in again} == {1}


def test_resume_from_a_delivered_element_is_bitwise_in_a_fresh_stream():
    source = make_source(random_access=False)
    full = elements(chronica.tf.stream(source, PACKING, **OPTIONS).dataset)
    batches, cut = chronica.tf.stream(source, PACKING, **OPTIONS), 7
    for n, element in enumerate(batches.dataset.prefetch(4), start=1):
        if n == cut:
            state = batches.get_state(delivered=element)
            break
    batches.close()
    resumed = chronica.tf.stream(source, PACKING, **OPTIONS)
    resumed.set_state(json.loads(json.dumps(state)))
    rest = elements(resumed.dataset)
    assert len(rest) == len(full) - cut
    for a, b in zip(rest, full[cut:], strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bad_arguments_raise_by_name():
    source = make_source()
    with pytest.raises(TypeError, match="key"):
        chronica.tf.stream(source, PACKING, key=3, **OPTIONS)
    batches = chronica.tf.stream(source, PACKING, **OPTIONS)
    with pytest.raises(TypeError, match="delivered"):
        batches.get_state(delivered=[1])
    with pytest.raises(ValueError, match="delivered"):
        batches.get_state(delivered={"step": 99, "micro": 0})


def test_two_workers_stream_every_sample_once_and_resume_bitwise(tmp_path):
    """One job: a whole pass with an all-reduce per element (equal counts), then a cut
    through a prefetching pipeline and a resume in a fresh stream."""
    ports, cut = f"{free_port()},{free_port()}", 5
    outs = [tmp_path / f"w{r}.json" for r in range(2)]
    worker = str(HELPERS / "tf_stream_worker.py")
    env = base_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    run_workers(
        [[sys.executable, worker, str(r), ports, str(out), str(cut)] for r, out in enumerate(outs)],
        env,
        timeout=240,
    )
    reports = [json.loads(out.read_text()) for out in outs]
    full = [r["full"] for r in reports]
    assert len(full[0]) == len(full[1]) > cut
    assert [(e["step"], e["micro"]) for e in full[0]] == [(e["step"], e["micro"]) for e in full[1]]
    ids = [i for rank in full for e in rank for i in e["ids"]]
    assert sorted(ids) == list(range(make_source().offsets[-1]))
    for r in reports:
        assert r["part"] == r["full"][:cut]
        assert r["rest"] == r["full"][cut:]
