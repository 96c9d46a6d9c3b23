"""A 2-process gloo job trains a tiny causal transformer (DDP) on packed, balanced
micro-batches of an MDS stream written here (tests/helpers/stream_train_worker.py); the same
job saved mid-window, killed, and resumed in fresh processes ends with parameters bitwise
equal to the uninterrupted run's."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

WORLD, CUT = 2, 4  # global step 4 opens window 2 of K = 2 steps: the cut is mid-window


def _write_stream(folder):
    """6 MDS shards of 16 documents each: token ids in [0, 32), 4 to 48 tokens long."""
    from chronica.runtime.sources import write_mds

    rng = np.random.default_rng(11)
    shards = [
        [{"input_ids": rng.integers(0, 32, n, dtype=np.int32)} for n in rng.integers(4, 49, 16)]
        for _ in range(6)
    ]
    write_mds(folder, shards, {"input_ids": "ndarray:int32"})


def _launch(data, out, modes):
    import torch

    with torch_rendezvous(WORLD) as meeting:
        run_workers(
            [
                [sys.executable, str(HELPERS / "stream_train_worker.py"), str(data), str(out),
                 ",".join(modes), str(CUT)]
            ] * WORLD,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", **meeting)
                for r in range(WORLD)
            ],
            timeout=180,
        )  # fmt: skip
    return [
        [torch.load(out / f"{mode}-{r}.pt", weights_only=False) for r in range(WORLD)]
        for mode in modes
    ]


@pytest.mark.multiprocess
def test_training_killed_mid_window_and_resumed_ends_bitwise_equal(tmp_path):
    import torch

    _write_stream(tmp_path / "data")
    # The uninterrupted run, then (same processes, fresh model) the one killed at the cut;
    # the resume in fresh processes.
    full, part = _launch(tmp_path / "data", tmp_path, ["full", "part"])
    (rest,) = _launch(tmp_path / "data", tmp_path, ["rest"])

    steps = full[0]["steps"]
    assert steps == list(range(len(steps))) and len(steps) == 12  # 96 documents, 8 a step
    stream = part[0]["stream"]
    assert part[0]["steps"] == steps[: CUT + 1]
    assert stream == part[1]["stream"]  # the stream's state is global
    assert stream["step"] < CUT + 1 < stream["step"] + 2 and stream["consumed"] > 0
    for r in range(WORLD):
        assert rest[r]["steps"] == steps[CUT + 1 :]
        final, resumed = full[r]["params"], rest[r]["params"]
        assert final.keys() == resumed.keys()
        for name in final:
            assert torch.equal(final[name], resumed[name]), name
            assert torch.equal(final[name], full[0]["params"][name]), name
    trained = [n for n in final if not torch.equal(final[n], part[0]["params"][n])]
    assert len(trained) == len(final)  # the steps after the cut moved every parameter
