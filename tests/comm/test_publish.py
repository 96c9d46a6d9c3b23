"""A window's messages as the coordinator publishes them: the batched encoder
(``protocol.plan_messages``) writes exactly the bytes of the per-rank one
(``protocol.plan_message``), which ``decode`` checks, and the gate relays every rank's
message from the three frames of the link to that rank alone."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.gate_process import readable
from chronica.comm.protocol import decode, plan_message, plan_messages, topic
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.packing import Packing


def _window(world: int, steps: int, per_step: int, seed: int) -> tuple[np.ndarray, ...]:
    """Random columns of a window: up to ``2 * per_step`` indices per rank and step."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 2 * per_step + 1, (steps, world))
    runs = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
    indices = rng.integers(0, 1 << 40, int(runs[-1]))
    offsets = np.vstack([np.zeros((1, world), np.int64), np.cumsum(counts, axis=0)])
    return indices, runs, offsets, rng.random((steps, world)), 1e3 * rng.random((steps, world))


# Per-rank index bytes on both sides of msgpack's bin8 / bin16 / bin32 boundaries, empty
# parts, one step, and scalars in each of msgpack's integer widths.
@pytest.mark.parametrize(
    "world, steps, per_step",
    [(64, 8, 16), (5, 4, 1), (3, 2, 0), (4, 1, 16), (2, 3, 3000), (2, 1, 9000)],
)
@pytest.mark.parametrize(
    "seq, gen, epoch, first",
    [(0, 1, 0, 0), (127, 128, 255, 256), (70_000, (1 << 31) - 1, 1 << 32, (1 << 40) - 8)],
)
def test_batched_messages_are_the_per_rank_bytes(world, steps, per_step, seq, gen, epoch, first):
    indices, runs, offsets, weights, loads = _window(world, steps, per_step, seed=world + steps)
    got = plan_messages(seq, gen, epoch, first, indices, runs, offsets, weights, loads)
    assert got == [
        plan_message(
            seq,
            gen,
            epoch,
            first,
            indices[runs[r] : runs[r + 1]],
            offsets[:, r],
            weights[:, r],
            loads[:, r],
        )
        for r in range(world)
    ]
    plan = decode(got[-1], 1 << 24)["plan"]
    assert (plan.seq, plan.gen, plan.epoch, plan.first) == (seq, gen, epoch, first)
    np.testing.assert_array_equal(plan.indices, indices[runs[-2] :])


@pytest.mark.parametrize("packed", [False, True])
def test_a_published_window_is_each_ranks_own_part(packed):
    sizes = np.random.default_rng(1).lognormal(5, 1, 900)
    config = ScheduleConfig(6, 96, kind="dynamic", variable_batch=True, window=4)
    if packed:
        packing = Packing(256, row_length=128, tokens_per_step=6000, long_documents="split")
        config = ScheduleConfig(6, None, kind="dynamic", window=4, packing=packing)
    coordinator = Coordinator(Scheduler(np.ceil(np.clip(sizes, 1, 256)), config), "127.0.0.1", 0)
    for rank in range(6):  # rank 2 is slow: the window is not the static one
        coordinator.planner.observe(rank, 0, 1.0, 2.0 if rank == 2 else 1.0)
    plan = coordinator.planner.plan_window(0, 4)
    parts = coordinator._parts(plan, 9)
    assert parts == [coordinator._part(plan, r, 9) for r in range(6)]
    if packed:
        return
    for rank, payload in enumerate(parts):  # straight from the window's arrays
        steps = range(plan.num_steps)
        mine = [plan.indices[plan.bounds[s, rank] : plan.bounds[s, rank + 1]] for s in steps]
        assert payload == plan_message(
            9,
            coordinator.generation,
            0,
            4,
            np.concatenate(mine),
            np.concatenate([[0], np.cumsum([m.shape[0] for m in mine])]),
            plan.loss_weights[:, rank],
            plan.loads[:, rank],
        )


def test_the_gate_relays_each_rank_its_own_message():
    sizes = np.random.default_rng(2).lognormal(5, 1, 2000)
    config = ScheduleConfig(5, 80, kind="dynamic", variable_batch=True, window=4)
    scheduler = Scheduler(sizes, config)
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        assert coordinator.endpoint is not None
        host, port, pub = coordinator.endpoint
        context = zmq.Context()
        poller = zmq.Poller()
        subs = []
        for rank in range(5):
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, topic(rank))
            sub.connect(f"tcp://{host}:{pub}")
            poller.register(sub, zmq.POLLIN)
            subs.append(sub)
        client = PlanClient(0, 5, scheduler.digest, host, port, pub_port=pub, timeout=30.0)
        got: list[list[bytes]] = [[] for _ in subs]
        try:
            assert client.connect()
            # Subscriptions reach the gate on their own time (PUB drops what no subscriber
            # holds yet): windows are fetched, one after another, until each rank has some.
            for epoch in range(20):
                for first in range(0, scheduler.num_steps(), 4):
                    assert client.plan(epoch, first) is not None
                    ready = dict(poller.poll(100))
                    for rank, sub in enumerate(subs):
                        while sub in ready and readable(sub):
                            name, payload = sub.recv_multipart()
                            assert name == topic(rank)
                            message = decode(payload, 1 << 24)
                            key = (message["epoch"], message["first"])
                            plan = coordinator.planner.planned(*key)
                            assert payload == coordinator._part(plan, rank, message["seq"])
                            got[rank].append(payload)
                if all(got):
                    break
            assert all(got)
        finally:
            client.close()
            for sub in subs:
                sub.close(0)
            context.term()
