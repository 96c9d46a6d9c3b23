"""kind="dynamic" under faults (issue 8): real gloo ranks, rank 0's real ZeroMQ coordinator on
127.0.0.1, every index each rank consumed recorded and checked exactly-once per epoch.

* a rank that stops reporting mid-epoch: no stall, the coordinator keeps planning every
  window from its last model of that rank;
* a coordinator answer delayed past one rank's time-out: that rank falls back (one
  warning), the ranks agree over gloo to take the static plan for that window together,
  and training continues;
* a standalone coordinator killed mid-epoch and started again on its port: the ranks go
  on with the static plan, re-attach, and take the new coordinator's plans;
* a rank killed (SIGKILL) mid-epoch, the job restarted from every rank's checkpointed
  sampler state, as torchrun restarts a failed job: it resumes exactly where it stopped.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dynamic_job import PER_RANK, WINDOW, check_exactly_once, sizes, static_plan
from workers import HELPERS, ROOT, base_env, free_port, free_ports, start_workers, wait_workers

WORKER = HELPERS / "fault_worker.py"
WORLD = 2
SILENT_AFTER, DELAYED_FIRST = 5, 8  # as in fault_worker.py
KILL_AFTER, RESTART_AFTER, CRASH_AFTER = 5, 13, 9


def _outputs(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"rank{rank}.json" for rank in range(WORLD)]


def _start(tmp_path: Path, scenario: str, **extra: str) -> list[subprocess.Popen]:
    """Start the ranks of ``scenario``; rank 0 hosts the coordinator unless ``extra`` names
    a standalone one (CHRONICA_COORDINATOR)."""
    if "CHRONICA_COORDINATOR" not in extra:
        extra["CHRONICA_TEST_PORT"] = str(free_ports(2)[0])
    env = base_env(
        ROOT, WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **extra
    )
    return start_workers(
        [[sys.executable, str(WORKER), str(out), scenario] for out in _outputs(tmp_path)],
        [{**env, "RANK": str(rank)} for rank in range(WORLD)],
    )


def _run(tmp_path: Path, scenario: str) -> tuple[list[dict], str]:
    logs = wait_workers(_start(tmp_path, scenario), timeout=90)
    return [json.loads(out.read_text()) for out in _outputs(tmp_path)], "\n".join(logs)


def _journals(tmp_path: Path) -> list[dict]:
    """Every rank's steps as its journal recorded them (over restarts), in the shape of the
    workers' results; fails if a rank recorded a step twice or skipped one."""
    results = []
    for out in _outputs(tmp_path):
        lines = [json.loads(line) for line in Path(f"{out}.journal").read_text().splitlines()]
        keys = [(epoch, step) for epoch, step, _ in lines]
        steps = static_plan(WORLD, 0).num_steps
        assert keys == [(e, s) for e in range(2) for s in range(steps)], keys
        results.append({"epochs": [[b for e, _, b in lines if e == epoch] for epoch in range(2)]})
    return results


def _wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _coordinator(tmp_path: Path, port: int, name: str) -> subprocess.Popen:
    """``chronica coordinator`` for the workers' sampler, once it serves on ``port``."""
    saved = tmp_path / "sizes.npy"
    np.save(saved, sizes())
    log = tmp_path / f"{name}.log"
    command = [sys.executable, "-m", "chronica.cli", "coordinator", "--sizes", str(saved)]
    command += ["--world", str(WORLD), "--batch-size", str(PER_RANK * WORLD)]
    command += ["--variable-batch", "--window", str(WINDOW), "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=base_env(ROOT), stdout=out, stderr=subprocess.STDOUT)
    _wait_for(lambda: "chronica coordinator on" in log.read_text() or proc.poll() is not None, name)
    assert proc.poll() is None, log.read_text()
    return proc


@pytest.mark.timeout(120)
def test_rank_that_stops_reporting_neither_stalls_nor_loses_a_sample(tmp_path):
    results, log = _run(tmp_path, "silent")
    check_exactly_once(results, WORLD)
    windows = 2 * -(-static_plan(WORLD, 0).num_steps // WINDOW)  # two epochs
    for r in results:
        # No stall: every window came from the coordinator, none waited out a time-out.
        assert r["static_windows"] == 0 and r["client"]["fallbacks"] == 0
        assert r["dynamic_windows"] == len(r["votes"]) == windows
        assert all(any(token) and agreed for token, agreed in r["votes"])
    assert "static plan" not in log
    silent, coordinator = results[-1], results[0]["coordinator"]
    assert silent["reported"] == SILENT_AFTER + 1
    # The coordinator took every report sent and nothing from the silent rank after it
    # stopped; its model of that rank is the last one fitted (from those reports) ...
    assert coordinator["reports"] == sum(r["reported"] for r in results)
    assert coordinator["model_reports"][-1] == SILENT_AFTER + 1
    beta = coordinator["beta"]
    assert beta[-1] > 2 * beta[0]  # ... which still knows the rank is slow (4x) ...
    # ... so the next epoch, planned with no word from it, still gives it smaller batches.
    last = [[len(b) for b in r["epochs"][1]] for r in results]
    full = [s for s in range(len(last[0])) if sum(c[s] for c in last) == PER_RANK * WORLD]
    assert full and np.mean([last[-1][s] for s in full]) < PER_RANK - 1


@pytest.mark.timeout(120)
def test_plan_delayed_past_a_ranks_timeout_falls_back_on_every_rank_together(tmp_path):
    results, log = _run(tmp_path, "delay")
    check_exactly_once(results, WORLD)
    delayed = DELAYED_FIRST // WINDOW  # the delayed window's position in epoch 0's votes
    late, others = results[-1], results[:-1]
    # The rank with the short time-out gave up on the window and voted for the static plan;
    # the others waited long enough to get the coordinator's plan, and voted for it ...
    assert late["votes"][delayed] == [[0] * 4, False]
    assert all(any(r["votes"][delayed][0]) and not r["votes"][delayed][1] for r in others)
    # ... so every rank took the static plan for that window: its own part of each step.
    for r in results:
        static = static_plan(WORLD, 0)
        for step in range(DELAYED_FIRST, DELAYED_FIRST + WINDOW):
            assert sorted(r["epochs"][0][step]) == sorted(static.local(step, r["rank"]))
    # Every rank took the same source for every window, and the coordinator's for most.
    assert len({json.dumps([agreed for _, agreed in r["votes"]]) for r in results}) == 1
    # After its time-out the late rank counts as detached: it says hello again on its next
    # call and is welcomed back within about a second; until then it uses plans the
    # coordinator publishes, and a window not yet published when it needs it falls back at
    # once (no wait), so a second window may go static. Either way the ranks agree, so
    # coverage holds.
    for r in results:
        assert 1 <= r["static_windows"] <= 2 < r["dynamic_windows"]
        assert r["static_windows"] + r["dynamic_windows"] == len(r["votes"])
    assert late["client"]["fallbacks"] == late["static_windows"]
    assert all(r["client"]["fallbacks"] == 0 for r in others)
    # The late rank said so once; the others said nothing.
    assert log.count("rank 1: the coordinator sent no plan for epoch 0 step 8") == 1
    assert log.count("using the static plan") == 1


@pytest.mark.timeout(180)
def test_coordinator_killed_and_restarted_mid_epoch(tmp_path):
    port = free_ports(2)[0]
    first = _coordinator(tmp_path, port, "first")
    ranks = _start(
        tmp_path,
        "coordinator",
        CHRONICA_COORDINATOR=f"127.0.0.1:{port}",
        CHRONICA_TEST_DIR=str(tmp_path),
    )
    second = None
    try:
        _wait_for(lambda: (tmp_path / "kill").exists(), "the kill request")
        first.kill()
        first.wait()
        (tmp_path / "kill.done").touch()
        _wait_for(lambda: (tmp_path / "restart").exists(), "the restart request")
        second = _coordinator(tmp_path, port, "second")
        (tmp_path / "restart.done").touch()
        log = "\n".join(wait_workers(ranks, timeout=120))
    finally:
        for proc in (first, second, *ranks):
            if proc is not None and proc.poll() is None:
                proc.kill()
    results = [json.loads(out.read_text()) for out in _outputs(tmp_path)]
    check_exactly_once(results, WORLD)
    windows = -(-static_plan(WORLD, 0).num_steps // WINDOW)
    votes = [r["votes"] for r in results]
    agreed = [[a for _, a in v] for v in votes]
    assert all(a == agreed[0] for a in agreed)  # one source per window on every rank
    tokens = [[t for t, _ in v] for v in votes]
    gens = np.array([r["gens"] for r in results])  # of the plan each rank's client returned
    before, down, after = (KILL_AFTER + 1) // WINDOW, RESTART_AFTER // WINDOW, windows + 1
    # Before the kill: the first coordinator's plans, the same window on every rank.
    assert all(agreed[0][:before]) and (gens[:, :before] == gens[0, 0]).all()
    assert all(t[:before] == tokens[0][:before] for t in tokens)
    # The first coordinator gone: windows that start while it is down take the static
    # plan on every rank, without waiting for a time-out (nothing listens on the port).
    assert not any(agreed[0][before + 1 : down + 1])
    assert (gens[:, before + 1 : down + 1] == 0).all()
    # Restarted: the ranks re-attached, and from the next epoch's second window on every
    # window is the second coordinator's (a new generation, the same on every rank).
    assert all(agreed[0][after:]) and (gens[:, after:] == gens[0, after]).all()
    assert gens[0, after] != gens[0, 0]
    for r in results:
        assert r["static_windows"] >= down - before and r["dynamic_windows"] >= windows - 1
        assert f"rank {r['rank']}: coordinator is back" in log
    assert log.count("using the static plan") == WORLD  # one warning per rank, not per window


@pytest.mark.timeout(180)
def test_rank_killed_and_job_restarted_from_checkpoints_resumes_exactly(tmp_path):
    ranks = _start(tmp_path, "crash")
    try:
        crashed = ranks[-1]
        _wait_for(lambda: crashed.poll() is not None, "the crash", timeout=120)
        assert crashed.returncode == -9, crashed.communicate()[0][-3000:]
        # The other rank has finished the crashed rank's last step (a collective) and is
        # blocked in the next one; torchrun would now stop it and restart the job.
        journal = Path(f"{_outputs(tmp_path)[0]}.journal")
        _wait_for(
            lambda: journal.exists() and f"[0, {CRASH_AFTER}," in journal.read_text(), "rank 0"
        )
        ranks[0].kill()
        ranks[0].wait()
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    for out in _outputs(tmp_path):  # both stopped after the same step
        assert json.loads(Path(f"{out}.state").read_text())["step"] == CRASH_AFTER + 1
    wait_workers(_start(tmp_path, "resume"), timeout=120)
    check_exactly_once(_journals(tmp_path), WORLD)
