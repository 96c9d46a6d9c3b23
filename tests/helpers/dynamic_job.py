"""The kind="dynamic" job of the adapters' multi-process tests, shared by the tests
(tests/adapters/{torch,tf,jax}) and their worker scripts (dynamic_worker.py,
tf_dynamic_worker.py, jax_dynamic_worker.py, fault_worker.py): the data set's sizes and
per-sample features, the static plan every step is checked against, the exactly-once check,
the mid-epoch kill handshake and a standalone coordinator a test kills on request.

Framework-free (numpy and chronica.core), so every worker can import it: the scripts run
from this folder, and the tests have it on sys.path (tests/conftest.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from workers import ROOT, base_env

from chronica.core import EpochPlan, ScheduleConfig, Scheduler

__all__ = [
    "KILL_AT",
    "PER_RANK",
    "WINDOW",
    "N",
    "check_exactly_once",
    "features",
    "kill_point",
    "sizes",
    "standalone_coordinator",
    "static_plan",
    "wait_for",
]

# Samples, samples per rank of a global batch, steps per planned window.
N, PER_RANK, WINDOW = 300, 8, 4
# (epoch, step) at which the "kill" scenario's workers stop until the coordinator is killed.
KILL_AT = (0, 3)


def sizes() -> np.ndarray:
    """Every sample's size (tokens)."""
    return np.random.default_rng(0).lognormal(4, 1, N).astype(int) + 1


def features(indices) -> tuple[np.ndarray, np.ndarray]:
    """Fixed float64 inputs (4 columns) and targets per sample index."""
    i = np.asarray(indices, dtype=np.float64)
    x = np.stack([np.sin(i), np.cos(i * 0.7), i / N, np.ones_like(i)], 1)
    return x, np.tanh(i * 0.01)


def static_plan(world: int, epoch: int) -> EpochPlan:
    """The job's static plan of ``epoch`` at ``world`` ranks: what the dynamic steps must
    hold, step by step, and what a rank falls back to without a coordinator."""
    config = ScheduleConfig(
        num_replicas=world,
        batch_size=PER_RANK * world,
        kind="dynamic",
        variable_batch=True,
        window=WINDOW,
    )
    return Scheduler(sizes(), config).plan_epoch(epoch)


def check_exactly_once(results: Sequence[dict], world: int, epochs: int = 2) -> None:
    """Every rank ran every step of every epoch; every step holds exactly the static plan's
    samples of that step (its padding included), split over the ranks; so each epoch
    covers every sample once, apart from the plan's padding. ``results[r]["epochs"][e]``
    is rank r's batches (index lists) of epoch e."""
    for epoch in range(epochs):
        static = static_plan(world, epoch)
        assert [len(r["epochs"][epoch]) for r in results] == [static.num_steps] * world
        for step in range(static.num_steps):
            got = sorted(i for r in results for i in r["epochs"][epoch][step])
            expect = sorted(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
            assert got == expect, (epoch, step)
        consumed = [i for r in results for batch in r["epochs"][epoch] for i in batch]
        assert sorted(consumed) == sorted(static.indices)
        assert set(consumed) == set(range(N))


def wait_for(path: Path, timeout: float = 60.0) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)


def kill_point(sync: Path, rank: int, timeout: float = 60.0) -> None:
    """A worker at ``KILL_AT``: rank 0 asks the test to kill the coordinator
    (``sync/killme``), and every rank waits until it has (``sync/killed``)."""
    if rank == 0:
        (sync / "killme").touch()
    wait_for(sync / "killed", timeout)


@contextmanager
def standalone_coordinator(
    folder: Path, world: int, port: int
) -> Iterator[Callable[[Sequence[subprocess.Popen]], None]]:
    """Run ``python -m chronica.comm.standalone`` for the job at ``world`` ranks on ``port``
    (and the next), its sizes saved in ``folder``, once it serves. Yields
    ``kill_on_request(workers)``: waits for the workers' ``folder/killme`` (failing if a
    worker ends first), SIGKILLs the coordinator and touches ``folder/killed``. The
    coordinator does not outlive the block."""
    np.save(folder / "sizes.npy", sizes())
    command = [sys.executable, "-m", "chronica.comm.standalone"]
    command += ["--sizes", str(folder / "sizes.npy"), "--world", str(world)]
    command += ["--batch-size", str(PER_RANK * world), "--variable-batch"]
    command += ["--window", str(WINDOW), "--port", str(port)]
    coordinator = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=base_env(ROOT))

    def kill_on_request(workers: Sequence[subprocess.Popen], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not (folder / "killme").exists():
            assert time.monotonic() < deadline, "the workers did not reach the kill point"
            assert all(p.poll() is None for p in workers), "a worker ended early"
            time.sleep(0.02)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=30)
        (folder / "killed").touch()

    try:
        assert "chronica coordinator on" in coordinator.stdout.readline()
        yield kill_on_request
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        coordinator.wait(timeout=30)
        coordinator.stdout.close()
