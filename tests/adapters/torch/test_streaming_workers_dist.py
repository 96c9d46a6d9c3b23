"""A real 2-process gloo job over MDS shards, and one over parquet files, read by
DataLoader workers (``StreamingDataset.loader``, tests/helpers/stream_workers_job.py):
every sample once per pass, equal micro-batch counts, caps held, the micro-batches
byte-identical to the single-process path's, a mid-window resume in fresh processes
bitwise equal to the uninterrupted run, and (over MDS: the engine's, whatever the format)
a resume at one rank with exactly-once."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("chronica.runtime.sources")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

WORLD, CUT, WORKERS = 2, 7, 1  # micro-batch 7 is mid-window; the workers fetch ahead of it
# The worlds each format's job resumes at (parquet: the same world alone, to keep it short).
RESUMED = {"mds": (WORLD, 1), "parquet": (WORLD,)}


def _launch(kind, data, out, world, mode):
    arguments = [kind, str(data), str(out), mode, str(CUT), str(WORKERS)]
    with torch_rendezvous(world) as meeting:
        run_workers(
            [[sys.executable, str(HELPERS / "stream_workers_job.py"), *arguments]] * world,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE=str(world), OMP_NUM_THREADS="1", **meeting)
                for r in range(world)
            ],
            timeout=240,
        )
    return [json.loads((out / f"{mode}-{world}-{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=sorted(RESUMED))
def runs(request, tmp_path_factory):
    """The full job's ranks, and the resumed job's ranks by world size."""
    from stream_formats import write_dataset

    kind = request.param
    root = tmp_path_factory.mktemp(f"workers-{kind}")
    write_dataset(kind, root / "data")
    data = root / "data"
    first = _launch(kind, data, root, WORLD, "full")
    return first, {w: _launch(kind, data, root, w, "resume") for w in RESUMED[kind]}


def _ids(parts):
    return sorted(i for part in parts for batch in part for i in batch["ids"])


@pytest.mark.multiprocess
def test_workers_pass_is_exactly_once_and_the_single_process_one(runs):
    first, _ = runs
    n = first[0]["num_samples"]
    parts = [r["full"] for r in first]
    assert _ids(parts) == list(range(n))
    assert len({len(part) for part in parts}) == 1
    assert all(b["num_tokens"] <= 1024 for part in parts for b in part)
    steps = [[(b["step"], b["num_micro"]) for b in part] for part in parts]
    assert all(s == steps[0] for s in steps)
    for r in first:
        assert r["full"] == r["single"]


@pytest.mark.multiprocess
def test_workers_resume_bitwise_and_at_another_world_exactly_once(runs):
    first, resumed = runs
    n = first[0]["num_samples"]
    for r in range(WORLD):
        assert first[r]["part"] + resumed[WORLD][r]["rest"] == first[r]["full"]
    for ranks in resumed.values():
        assert _ids([r["part"] for r in first] + [r["rest"] for r in ranks]) == list(range(n))
