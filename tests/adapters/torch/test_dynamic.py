"""kind="dynamic" end to end: real gloo ranks, a real ZeroMQ coordinator, real faults."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from workers import HELPERS, free_port, free_ports

from chronica.core import ScheduleConfig, Scheduler

WORKER = HELPERS / "dynamic_worker.py"
N, PER_RANK = 300, 8


def _static_plan(world: int, epoch: int):
    sizes = np.random.default_rng(0).lognormal(4, 1, N).astype(int) + 1
    config = ScheduleConfig(
        num_replicas=world,
        batch_size=PER_RANK * world,
        kind="dynamic",
        variable_batch=True,
        window=4,
    )
    return Scheduler(sizes, config).plan_epoch(epoch)


def _launch(tmp_path, world, scenario, env_extra=None):
    master, coordinator = free_port(), free_ports(2)[0]
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master),
            **(env_extra or {}),
        )
        out = tmp_path / f"rank{rank}.json"
        args = [sys.executable, str(WORKER), str(out), scenario, str(coordinator), str(tmp_path)]
        procs.append((subprocess.Popen(args, env=env), out))
    return procs


def _collect(procs, timeout=240):
    try:
        for proc, _ in procs:
            assert proc.wait(timeout=timeout) == 0
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    return [json.loads(out.read_text()) for _, out in procs]


def _check_exactly_once(results, world):
    """Every step holds exactly the static plan's samples of that step, split over ranks;
    every rank ran the same number of steps."""
    for epoch in range(2):
        static = _static_plan(world, epoch)
        assert {len(r["epochs"][epoch]) for r in results} == {static.num_steps}
        for step in range(static.num_steps):
            got = sorted(i for r in results for i in r["epochs"][epoch][step])
            expect = sorted(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
            assert got == expect, (epoch, step)


@pytest.mark.parametrize("world", [2, 3])
def test_dynamic_ranks_cover_every_step_once_with_exact_gradients(tmp_path, world):
    results = _collect(_launch(tmp_path, world, "train"))
    _check_exactly_once(results, world)
    for r in results:
        assert r["static_windows"] == 0  # the coordinator delivered every window
        assert r["grad_error"] < 1e-6  # loss weights make the average the whole-step mean
    # The slow last rank ends up with smaller local batches, the global batch unchanged.
    last_epoch = [[len(b) for b in r["epochs"][1]] for r in results]
    full = [s for s in range(len(last_epoch[0])) if sum(c[s] for c in last_epoch) == 8 * world]
    assert np.mean([last_epoch[-1][s] for s in full]) < 8 - 1
    for s in full:
        weights = [r["weights"][1][s] for r in results]
        assert sum(weights) == pytest.approx(world)


def test_coordinator_killed_mid_epoch_falls_back_without_losing_a_sample(tmp_path):
    world = 2
    router = free_ports(2)[0]
    sizes = np.random.default_rng(0).lognormal(4, 1, N).astype(int) + 1
    np.save(tmp_path / "sizes.npy", sizes)
    coordinator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chronica.comm.standalone",
            "--sizes",
            str(tmp_path / "sizes.npy"),
            "--world",
            str(world),
            "--batch-size",
            str(PER_RANK * world),
            "--variable-batch",
            "--window",
            "4",
            "--port",
            str(router),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "chronica coordinator on" in coordinator.stdout.readline()
        procs = _launch(tmp_path, world, "kill", {"CHRONICA_COORDINATOR": f"127.0.0.1:{router}"})
        deadline = time.monotonic() + 120
        while not (tmp_path / "killme").exists():
            assert time.monotonic() < deadline
            assert all(p.poll() is None for p, _ in procs)
            time.sleep(0.02)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=30)
        (tmp_path / "killed").touch()
        results = _collect(procs)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    _check_exactly_once(results, world)
    for r in results:
        assert r["dynamic_windows"] >= 1  # before the kill
        assert r["static_windows"] >= 1  # after it
        assert r["grad_error"] < 1e-6
    # Every rank took the same source for every window (agreed over gloo).
    assert len({(r["dynamic_windows"], r["static_windows"]) for r in results}) == 1
