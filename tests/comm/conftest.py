"""Shared fixtures of the comm tests: a dynamic scheduler and clients of a live coordinator.

Every coordinator binds 127.0.0.1 on ports the OS picks (``port=0``); waits are bounded by
``workers.scaled`` so a busy machine only makes them longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pytest
from workers import scaled

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.core import ScheduleConfig, Scheduler


@pytest.fixture(scope="module")
def scheduler() -> Scheduler:
    """4 ranks, windows of 4 steps, 2000 samples of log-normal sizes."""
    sizes = np.random.default_rng(0).lognormal(5, 1, 2000)
    config = ScheduleConfig(
        num_replicas=4, batch_size=64, kind="dynamic", variable_batch=True, window=4
    )
    return Scheduler(sizes, config)


def _clients(
    coordinator: Coordinator, scheduler: Scheduler, ranks: Iterable[int], timeout: float = 5.0
) -> list[PlanClient]:
    """A ``PlanClient`` of ``coordinator`` for each of ``ranks``."""
    assert coordinator.endpoint is not None
    host, port, pub = coordinator.endpoint
    world, digest = scheduler.config.num_replicas, scheduler.digest
    return [
        PlanClient(r, world, digest, host, port, pub_port=pub, timeout=scaled(timeout))
        for r in ranks
    ]


def _wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Return once ``condition()`` holds (the coordinator's thread counts it); fail after
    ``scaled(seconds)``."""
    deadline = time.monotonic() + scaled(seconds)
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)


@pytest.fixture
def make_clients() -> Iterator[Callable[..., list[PlanClient]]]:
    """``make_clients(coordinator, scheduler, ranks, timeout=5.0)``: a ``PlanClient`` of
    ``coordinator`` for each of ``ranks``, each closed when the test ends."""
    made: list[PlanClient] = []

    def make(*args, **kwargs) -> list[PlanClient]:
        new = _clients(*args, **kwargs)
        made.extend(new)
        return new

    yield make
    for client in made:
        client.close()


@pytest.fixture
def wait_until() -> Callable[..., None]:
    """``wait_until(condition, seconds=5.0)``: return once ``condition()`` holds (a count
    the coordinator's thread keeps, say); fail after ``scaled(seconds)``."""
    return _wait_until
