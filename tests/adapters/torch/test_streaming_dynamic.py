"""A real 2-process gloo job over a ``kind="dynamic"`` stream
(tests/helpers/stream_dynamic_worker.py): rank 1's training step is three times slower, its
measured step times travel in the windows' all-gather, and later windows give it fewer
tokens; every sample once, equal micro-batch counts, and a resume in fresh processes from
each rank's own state keeps both."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

CUT = 13


def _launch(folder, mode):
    with torch_rendezvous(2) as meeting:
        run_workers(
            [[sys.executable, str(HELPERS / "stream_dynamic_worker.py"), str(folder), mode,
              str(CUT)]] * 2,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE="2", OMP_NUM_THREADS="1", **meeting)
                for r in range(2)
            ],
            timeout=240,
        )  # fmt: skip
    return [json.loads((folder / f"{mode}-{r}.json").read_text()) for r in range(2)]


def _ids(parts):
    return sorted(i for part in parts for batch in part for i in batch[0])


def _tokens(part, steps):
    return sum(batch[1] for batch in part if batch[2] in steps)


@pytest.mark.multiprocess
def test_a_slower_rank_gets_fewer_tokens_and_a_resume_keeps_exactly_once(tmp_path):
    first = _launch(tmp_path, "full")
    n = first[0]["num_samples"]
    full = [rank["full"] for rank in first]
    assert _ids(full) == list(range(n))
    assert [b[2:] for b in full[0]] == [b[2:] for b in full[1]]  # equal counts per step
    steps = sorted({b[2] for b in full[0]})
    late = set(steps[len(steps) // 2 :])
    assert _tokens(full[1], late) < 0.6 * _tokens(full[0], late)
    speeds = first[0]["speeds"]
    assert speeds == first[1]["speeds"] and speeds[0] > speeds[1]
    rest = [rank["rest"] for rank in _launch(tmp_path, "resume")]
    parts = [rank["part"] + more for rank, more in zip(first, rest, strict=True)]
    assert _ids(parts) == list(range(n))
    assert [b[2:] for b in parts[0]] == [b[2:] for b in parts[1]]
