"""A 2-process DDP job whose ``DataLoader`` has 2 workers (they fetch batches ahead of the
training loop) is killed mid-epoch and resumed in new processes from the sampler state it
checkpointed after its last step: the resumed run trains exactly the rest of the epoch."""

from __future__ import annotations

import json
import signal
import sys

from delivery_worker import EPOCH, GLOBAL_BATCH, KILL_AT
from integration_checks import WORLD, planned
from workers import HELPERS, ROOT, base_env, scaled, start_workers, torch_rendezvous


def _run(mode: str, folder, expect: int) -> list[dict]:
    outs = [folder / f"{mode}{rank}.json" for rank in range(WORLD)]
    with torch_rendezvous(WORLD) as meeting:
        env = base_env(ROOT, WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", **meeting)
        worker = [sys.executable, str(HELPERS / "delivery_worker.py"), mode]
        procs = start_workers(
            [[*worker, str(outs[r]), str(folder / f"state{r}.json")] for r in range(WORLD)],
            [{**env, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(WORLD)],
        )
        try:
            logs = [p.communicate(timeout=scaled(180))[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == expect, log[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def test_a_job_killed_mid_epoch_resumes_with_exactly_the_rest_of_the_epoch(tmp_path):
    first = _run("first", tmp_path, -signal.SIGKILL)
    resumed = _run("resumed", tmp_path, 0)
    plan = planned(first[0]["sizes"], GLOBAL_BATCH, EPOCH + 1)
    for rank in range(WORLD):
        trained = first[rank]["received"]
        assert len(trained) == KILL_AT  # killed while its workers had fetched more
        expected = [i for step in plan[rank][EPOCH] for i in step]
        received = [i for batch in trained + resumed[rank]["received"] for i in batch]
        assert received == expected  # nothing skipped, nothing trained twice
