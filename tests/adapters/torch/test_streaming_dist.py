"""Real 2- and 4-process gloo jobs over a streamed source (tests/helpers/stream_worker.py):
every sample once per pass, equal micro-batch counts, caps held, a mid-window resume in
fresh processes bitwise equal to the uninterrupted run, and a resume at another world size
with exactly-once. The sources' jobs share their launches: one per world and phase (four in
all), each source's passes one after the other in the same process group."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

CUT = 7

# The readers' formats: (format, world of the first job, world of the resumed job).
# (ParquetSource's row groups are covered by the readers' own tests; three jobs keep the
# suite's time down.)
READER_JOBS = [("mds", 2, 2), ("tar", 4, 2), ("hf", 2, 4)]
# Every source's job: the in-memory sources (without and with random access), then the readers.
JOBS = [("list-seq", 2, 2), ("list", 4, 2), *READER_JOBS]


def _launch(root, world, mode, kinds):
    with torch_rendezvous(world) as meeting:
        run_workers(
            [[sys.executable, str(HELPERS / "stream_worker.py"), str(root), mode, str(CUT), *kinds]]
            * world,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE=str(world), OMP_NUM_THREADS="1", **meeting)
                for r in range(world)
            ],
            timeout=240 * len(kinds),
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each source's (first job's ranks, resumed job's ranks), from four launches: the whole
    passes at two and at four ranks, then the resumes at two and at four."""
    root = tmp_path_factory.mktemp("streams")
    jobs = JOBS if importlib.util.find_spec("chronica.runtime.sources") else JOBS[:2]
    for kind, _, _ in jobs:
        (root / kind).mkdir()
    if len(jobs) > 2:
        from stream_formats import write_dataset

        for kind, _, _ in jobs[2:]:
            write_dataset(kind, root / kind / "data")
    for mode, phase in (("full", 1), ("resume", 2)):
        for world in sorted({job[phase] for job in jobs}):
            _launch(root, world, mode, [job[0] for job in jobs if job[phase] == world])

    def read(kind, mode, world):
        return [
            json.loads((root / kind / f"{mode}-{world}-{r}.json").read_text()) for r in range(world)
        ]

    return {kind: (read(kind, "full", w), read(kind, "resume", t)) for kind, w, t in jobs}


def _ids(parts):
    return sorted(i for part in parts for batch in part for i in batch["ids"])


def _check_pass(parts, n):
    assert _ids(parts) == list(range(n))
    assert len({len(part) for part in parts}) == 1
    for part in parts:
        assert all(b["num_tokens"] <= 1024 for b in part)
    steps = [[(b["step"], b["num_micro"]) for b in part] for part in parts]
    assert all(s == steps[0] for s in steps)


@pytest.mark.multiprocess
def test_two_ranks_all_to_all_pass_and_bitwise_resume_in_fresh_processes(runs):
    first, resumed = runs["list-seq"]
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    for r in range(2):
        assert first[r]["part"] + resumed[r]["rest"] == first[r]["full"]
    assert sum(r["bytes_sent"] for r in resumed) > 0


@pytest.mark.multiprocess
def test_four_ranks_pass_and_resume_at_two_ranks_exactly_once(runs):
    first, resumed = runs["list"]
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    assert _ids([r["part"] for r in first] + [r["rest"] for r in resumed]) == list(range(n))
    assert len({len(r["rest"]) for r in resumed}) == 1


@pytest.mark.multiprocess
@pytest.mark.parametrize(("kind", "world", "then"), READER_JOBS, ids=[j[0] for j in READER_JOBS])
def test_readers_formats_pass_and_resume(runs, kind, world, then):
    """Over MDS shards, WebDataset tars and parquet through HF ``datasets`` streaming,
    written here: a whole pass exactly once in equal counts under the
    cap, then a resume in fresh processes: bitwise at the same world, exactly-once at
    another."""
    pytest.importorskip("chronica.runtime.sources")
    first, resumed = runs[kind]
    assert len(first) == world and len(resumed) == then
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    if then == world:
        for r in range(world):
            assert first[r]["part"] + resumed[r]["rest"] == first[r]["full"]
    assert _ids([r["part"] for r in first] + [r["rest"] for r in resumed]) == list(range(n))
    assert len({len(r["rest"]) for r in resumed}) == 1
