"""Real 2- and 4-process gloo jobs over a streamed source (tests/helpers/stream_worker.py):
every sample once per pass, equal micro-batch counts, caps held, a mid-window resume in
fresh processes bitwise equal to the uninterrupted run, and a resume at another world size
with exactly-once. One launch per world and phase, several assertions each."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous

CUT = 7


def _launch(folder, world, mode, kind):
    with torch_rendezvous(world) as meeting:
        run_workers(
            [
                [
                    sys.executable,
                    str(HELPERS / "stream_worker.py"),
                    str(folder),
                    mode,
                    kind,
                    str(CUT),
                ]
            ]
            * world,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE=str(world), OMP_NUM_THREADS="1", **meeting)
                for r in range(world)
            ],
            timeout=240,
        )
    return [json.loads((folder / f"{mode}-{world}-{r}.json").read_text()) for r in range(world)]


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
def test_two_ranks_all_to_all_pass_and_bitwise_resume_in_fresh_processes(tmp_path):
    first = _launch(tmp_path, 2, "full", "list-seq")
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    resumed = _launch(tmp_path, 2, "resume", "list-seq")
    for r in range(2):
        assert first[r]["part"] + resumed[r]["rest"] == first[r]["full"]
    assert sum(r["bytes_sent"] for r in resumed) > 0


@pytest.mark.multiprocess
def test_four_ranks_pass_and_resume_at_two_ranks_exactly_once(tmp_path):
    first = _launch(tmp_path, 4, "full", "list")
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    resumed = _launch(tmp_path, 2, "resume", "list")
    assert _ids([r["part"] for r in first] + [r["rest"] for r in resumed]) == list(range(n))
    assert len({len(r["rest"]) for r in resumed}) == 1


# The readers' formats: (format, world of the first job, world of the resumed job).
# (ParquetSource's row groups are covered by the readers' own tests; three jobs keep the
# suite's time down.)
READER_JOBS = [("mds", 2, 2), ("tar", 4, 2), ("hf", 2, 4)]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("kind", "world", "then"), READER_JOBS, ids=[j[0] for j in READER_JOBS])
def test_readers_formats_pass_and_resume(tmp_path, kind, world, then):
    """Over MDS shards, WebDataset tars and parquet through HF ``datasets`` streaming,
    written here: a whole pass exactly once in equal counts under the
    cap, then a resume in fresh processes: bitwise at the same world, exactly-once at
    another."""
    pytest.importorskip("chronica.runtime.sources")
    from stream_formats import write_dataset

    write_dataset(kind, tmp_path / "data")
    first = _launch(tmp_path, world, "full", kind)
    n = first[0]["num_samples"]
    _check_pass([r["full"] for r in first], n)
    resumed = _launch(tmp_path, then, "resume", kind)
    if then == world:
        for r in range(world):
            assert first[r]["part"] + resumed[r]["rest"] == first[r]["full"]
    assert _ids([r["part"] for r in first] + [r["rest"] for r in resumed]) == list(range(n))
    assert len({len(r["rest"]) for r in resumed}) == 1
