"""``chronica.jax.stream``: a sharded stream as an iterator of numpy packed micro-batches, in
one process and in a real 2-process ``jax.distributed`` job."""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("jax")

from stream_source import make_source
from workers import HELPERS, ROOT, base_env, free_port, run_workers

import chronica.jax
from chronica.core.packing import Packing
from chronica.runtime.streaming_exchange import LocalGroup

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def test_one_pass_yields_every_sample_once_then_the_next_pass():
    source = make_source()
    batches = chronica.jax.stream(source, PACKING, **OPTIONS)
    assert "batch_size=12" in repr(batches)
    out = list(batches)
    assert out and all(b["tokens"].shape == (2, 512) for b in out)
    assert all(b["ids"].shape == (1024,) for b in out)
    ids = [i for b in out for i in b["ids"].tolist() if i >= 0]
    assert sorted(ids) == list(range(source.offsets[-1]))
    for b in out:  # the source's tokens are their sample's id
        real = b["segment_ids"] > 0
        assert set(b["tokens"][real].tolist()) == {i for i in b["ids"].tolist() if i >= 0}
    again = list(batches)
    assert sorted(i for b in again for i in b["ids"].tolist() if i >= 0) == sorted(ids)
    assert {int(b["epoch"]) for b in again} == {1}


@pytest.mark.parametrize("random_access", [True, False])
def test_resume_from_state_dict_is_bitwise_in_a_fresh_stream(random_access):
    source = make_source(random_access=random_access)
    full = list(chronica.jax.stream(source, PACKING, **OPTIONS))
    batches, cut = chronica.jax.stream(source, PACKING, **OPTIONS), 9
    for _ in range(cut):
        next(batches)
    state = json.loads(json.dumps(batches.state_dict()))
    batches.close()
    resumed = chronica.jax.stream(source, PACKING, **OPTIONS)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - cut
    for a, b in zip(rest, full[cut:], strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bad_arguments_raise_by_name():
    with pytest.raises(TypeError, match="pad_value"):
        chronica.jax.stream(make_source(), PACKING, pad_value="0", **OPTIONS)


def test_two_jax_processes_stream_every_sample_once_and_resume_bitwise(tmp_path):
    """One job: a whole pass (equal counts, exactly once), a cut and a resume in a fresh
    stream of each process."""
    port, cut = free_port(), 5
    outs = [tmp_path / f"p{r}.json" for r in range(2)]
    worker = str(HELPERS / "jax_stream_worker.py")
    run_workers(
        [
            [sys.executable, worker, str(port), str(r), str(out), str(cut)]
            for r, out in enumerate(outs)
        ],
        base_env(ROOT, JAX_PLATFORMS="cpu"),
        timeout=180,
    )
    reports = [json.loads(out.read_text()) for out in outs]
    full = [r["full"] for r in reports]
    assert len(full[0]) == len(full[1]) > cut
    assert [(b["step"], b["micro"]) for b in full[0]] == [(b["step"], b["micro"]) for b in full[1]]
    ids = [i for rank in full for b in rank for i in b["ids"]]
    assert sorted(ids) == list(range(make_source().offsets[-1]))
    for r in reports:
        assert r["part"] == r["full"][:cut]
        assert r["rest"] == r["full"][cut:]


def test_injected_collectives_and_a_resume_at_another_world_keep_exactly_once():
    """Two ranks as threads (``LocalGroup``) stop mid-pass; one rank finishes the pass."""
    source, cut = make_source(), 6
    group = LocalGroup(2)
    streams = [
        chronica.jax.stream(source, PACKING, collectives=group.rank(r), **OPTIONS) for r in range(2)
    ]
    done = [[], []]

    def run(r):
        done[r] = [next(streams[r]) for _ in range(cut)]
        streams[r].close()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    states = [s.state_dict() for s in streams]
    assert states[0] == states[1]
    alone = chronica.jax.stream(source, PACKING, **OPTIONS)
    alone.load_state_dict(states[0])
    rest = list(alone)
    ids = [i for b in done[0] + done[1] + rest for i in b["ids"].tolist() if i >= 0]
    assert sorted(ids) == list(range(source.offsets[-1]))


def test_a_dynamic_stream_takes_reports_and_keeps_them_in_the_state():
    source = make_source()
    batches = chronica.jax.stream(source, PACKING, kind="dynamic", **OPTIONS)
    out = []
    for b in batches:
        out.append(b)
        if int(b["micro"]) == int(b["num_micro"]) - 1:
            batches.report(1e-3 * (1 + int(b["lengths"].sum())), step=int(b["step"]))
    assert sorted(i for b in out for i in b["ids"].tolist() if i >= 0) == list(
        range(source.offsets[-1])
    )
    state = batches.state_dict()
    assert state["speeds"] == [1.0] and len(state["reports"]) > 0
    assert state["reports_due"]["rank"] == 0
