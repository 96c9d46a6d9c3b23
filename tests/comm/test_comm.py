"""The coordinator and its clients over real ZeroMQ sockets on loopback, in one process."""

import logging
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st
from thread_total import ThreadTotal
from workers import free_ports

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.protocol import (
    MAX_REQUEST_BYTES,
    VERSION,
    ProtocolError,
    decode,
    encode,
    plan_message,
)
from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.session import DynamicSession


@pytest.fixture
def scheduler():
    sizes = np.random.default_rng(0).lognormal(5, 1, 2000)
    config = ScheduleConfig(
        num_replicas=4, batch_size=64, kind="dynamic", variable_batch=True, window=4
    )
    return Scheduler(sizes, config)


def _client(coordinator, scheduler, rank, digest=None, timeout=5.0):
    host, port, pub = coordinator.endpoint
    return PlanClient(
        rank,
        scheduler.config.num_replicas,
        digest or scheduler.digest,
        host,
        port,
        pub_port=pub,
        timeout=timeout,
    )


def test_plans_reach_every_rank_and_partition_each_step(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        clients = [_client(coordinator, scheduler, r) for r in range(4)]
        assert all(c.connect() for c in clients)
        static = scheduler.plan_epoch(0)
        for first in range(0, scheduler.num_steps(), 4):
            plans = [c.plan(0, first) for c in clients]
            for step in range(first, first + plans[0].num_steps):
                got = np.sort(np.concatenate([p.local(step) for p in plans]))
                expect = np.sort(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
                np.testing.assert_array_equal(got, expect)
                for r, (c, p) in enumerate(zip(clients, plans, strict=True)):
                    c.report(0, step, p.loads[step - first], p.loads[step - first] * (r + 1))
        # Windows after the first arrive by PUB before they are asked for.
        assert all(c.stats.published > 0 for c in clients)
        assert sum(c.stats.fallbacks for c in clients) == 0
        for c in clients:
            c.close()


def test_late_joiner_recovers_missed_plans(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        early = _client(coordinator, scheduler, 0)
        assert early.connect()
        seen = {first: early.plan(0, first) for first in range(0, 12, 4)}
        late = _client(coordinator, scheduler, 1)
        assert late.connect()
        mine = _client(coordinator, scheduler, 0)  # a restarted rank 0 asks again
        assert mine.connect()
        for first, plan in seen.items():
            np.testing.assert_array_equal(mine.plan(0, first).indices, plan.indices)
            assert late.plan(0, first) is not None
        assert mine.stats.fetched >= 3 and mine.stats.fallbacks == 0
        for c in (early, late, mine):
            c.close()


def test_mismatched_digest_and_world_fall_back_with_an_error_naming_why(scheduler, caplog):
    with Coordinator(scheduler, port=0) as coordinator, caplog.at_level(logging.ERROR):
        wrong = _client(coordinator, scheduler, 0, digest="0" * 32)
        assert not wrong.connect()
        assert "sizes or sampler arguments" in wrong.refused
        host, port, pub = coordinator.endpoint
        other = PlanClient(0, 8, scheduler.digest, host, port, pub_port=pub, timeout=5)
        assert not other.connect()
        assert "world" in other.refused
        hellos = coordinator.stats.hellos
        for c in (wrong, other):
            assert c.plan(0, 0) is None  # at once: refused ranks are not kept waiting
            c.report(0, 0, 1.0, 1.0)
            c.close()
        assert coordinator.stats.hellos == hellos  # and they do not ask again
    assert sum("refused this rank" in r.getMessage() for r in caplog.records) == 2


def test_bad_messages_are_rejected_and_the_coordinator_keeps_serving(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        host, port, _ = coordinator.endpoint
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.RCVTIMEO, 5000)
        raw.connect(f"tcp://{host}:{port}")
        bad = [
            b"\xc1garbage",  # not msgpack
            msgpack.packb([1, 2, 3]),  # not a map
            msgpack.packb({"v": VERSION + 1, "t": "hello"}),  # wrong version
            msgpack.packb({"v": VERSION, "t": "pickle"}),  # unknown type
            encode("fetch", rank=0, epoch=0),  # missing field
            encode("fetch", rank=99, epoch=0, first=0),  # rank outside the world
            encode("fetch", rank=0, epoch=0, first=3),  # not a window start
            encode("report", rank=0, epoch=0, step=0, load=float("nan"), seconds=1.0),
            encode("report", rank=0, epoch=0, step=0, load=1.0, seconds=-1.0),
            encode("hello", rank=True, world=4, digest="x"),  # a bool is not a rank
        ]
        for payload in bad:
            raw.send(payload)
            answer = decode(raw.recv(), 1 << 20)
            assert answer["t"] == "error" and answer["code"] == "protocol"
        raw.send(b"x" * (MAX_REQUEST_BYTES + 1))  # oversized: ZeroMQ drops the connection
        assert coordinator.stats.rejected == len(bad)
        good = _client(coordinator, scheduler, 2)
        assert good.connect()
        assert good.plan(0, 0) is not None
        raw.close(0)
        good.close()


def test_port_in_use_is_a_clear_error(scheduler):
    with Coordinator(scheduler, port=0) as first:
        _, port, _ = first.endpoint
        with pytest.raises(RuntimeError, match=f"{port}.*CHRONICA_PORT"):
            Coordinator(scheduler, port=port).start()


def test_unreachable_coordinator_falls_back_quickly(scheduler, caplog):
    client = PlanClient(0, 4, scheduler.digest, "127.0.0.1", 1, timeout=0.3)
    with caplog.at_level("WARNING", logger="chronica"):
        assert not client.connect()
        assert client.plan(0, 0) is None
        assert client.plan(0, 4) is None
    assert sum("static plan" in r.getMessage() for r in caplog.records) == 1  # warned once
    client.close()


def test_plan_message_round_trip():
    payload = plan_message(
        7, 99, 2, 16, np.arange(10), np.array([0, 4, 10]), np.ones(2), np.array([3.0, 4.0])
    )
    plan = decode(payload, 1 << 20)["plan"]
    assert (plan.seq, plan.gen, plan.epoch, plan.first, plan.num_steps) == (7, 99, 2, 16, 2)
    np.testing.assert_array_equal(plan.local(17), np.arange(4, 10))


_THREE_STEPS = dict(w=np.ones(3, "<f8").tobytes(), load=np.ones(3, "<f8").tobytes())
_FOUR_STEPS = dict(w=np.ones(4, "<f8").tobytes(), load=np.ones(4, "<f8").tobytes())


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(off=np.array([0, 5], "<i8").tobytes()), "offsets"),
        (dict(idx=b"\x00" * 7), "8-byte"),
        (dict(w=np.array([np.inf], "<f8").tobytes()), "finite"),
        (dict(load=np.array([np.nan], "<f8").tobytes()), "finite"),
        (dict(load=np.array([-np.inf], "<f8").tobytes()), "finite"),
        (dict(w=np.array([-1.0], "<f8").tobytes(), load=np.array([np.inf]).tobytes()), "finite"),
        (dict(w=np.array([-1e-300], "<f8").tobytes()), "weights and loads must be >= 0"),
        (dict(load=np.array([-2.0], "<f8").tobytes()), "weights and loads must be >= 0"),
        (dict(off=np.array([0, 3, 2, 4], "<i8").tobytes(), **_THREE_STEPS), "offsets must rise"),
        # every int64 difference of these, wrapped, is >= 0 (an earlier check passed them)
        (dict(off=np.array([0, 2**63 - 1, -(2**63), -1, 4]).tobytes(), **_FOUR_STEPS), "rise"),
        (dict(idx=np.array([-1, 0, 1, 2], "<i8").tobytes()), ">= 0"),
        (dict(gen=0), "'gen'"),
    ],
)
def test_malformed_plans_are_refused(fields, match):
    message = dict(
        seq=0,
        gen=1,
        epoch=0,
        first=0,
        idx=np.arange(4, dtype="<i8").tobytes(),
        off=np.array([0, 4], "<i8").tobytes(),
        w=np.ones(1, "<f8").tobytes(),
        load=np.ones(1, "<f8").tobytes(),
    )
    message.update(fields)
    with pytest.raises(ProtocolError, match=match):
        decode(encode("plan", **message), 1 << 20)


@given(st.binary(max_size=MAX_REQUEST_BYTES + 64))
def test_decoder_never_fails_other_than_with_protocol_error(blob):
    try:
        decode(blob)
    except ProtocolError:
        pass


@pytest.mark.parametrize("coordinators", ["one", "two"])
def test_ranks_use_a_window_only_if_all_hold_the_same_planning_of_it(coordinators):
    """Two coordinators plan the same windows differently (each has its own generation, as
    a restarted coordinator has): ranks served by different ones must not mix their plans,
    or a step would train some samples twice and others never."""
    sizes = np.random.default_rng(1).lognormal(5, 1, 600)
    config = ScheduleConfig(num_replicas=2, batch_size=32, kind="dynamic", variable_batch=True)
    scheduler = Scheduler(sizes, config)
    port, other = free_ports(2)[0], free_ports(2)[0]
    total = ThreadTotal(2)
    with Coordinator(scheduler, "127.0.0.1", other) as second:
        # The second coordinator hears that rank 1 is slow; the first hears nothing.
        for step in range(scheduler.num_steps()):
            second.planner.observe(1, step, 1.0, 3.0)
        sessions: list[DynamicSession] = []
        got: dict[int, list] = {}

        def run(rank: int) -> None:
            session = DynamicSession(
                scheduler,
                rank,
                host="127.0.0.1",
                port=other if rank == 1 and coordinators == "two" else port,
                agree=total.agreement(rank),
            )
            sessions.append(session)
            got[rank] = [(step, indices.tolist()) for step, indices, _, _ in session.steps(0)]

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for session in sessions:
            session.close()
    static = scheduler.plan_epoch(0)
    for step in range(static.num_steps):
        both = sorted(got[0][step][1] + got[1][step][1])
        assert both == sorted(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
    windows = -(-static.num_steps // config.window)
    for session in sessions:
        if coordinators == "one":
            assert session.windows_dynamic == windows
        else:
            assert session.windows_static == windows


def test_fetch_ahead_must_be_a_bool():
    assert decode(encode("fetch", rank=0, epoch=0, first=0, ahead=True))["ahead"] is True
    with pytest.raises(ProtocolError, match="'ahead'"):
        decode(encode("fetch", rank=0, epoch=0, first=0, ahead=1))


def test_a_prefetch_published_since_hello_is_served_by_pub_alone(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        client = _client(coordinator, scheduler, 0)
        assert client.connect()
        assert client.plan(0, 0) is not None  # asked for: answered directly
        deadline = time.monotonic() + 5
        while client.stats.published < 2 and client._wait(deadline):
            pass  # the window after it, planned at once, arrives by PUB
        client.prefetch(0, 8)  # planned now, after this rank's hello: the PUB copy answers
        while client.stats.published < 3 and client._wait(deadline):
            pass
        assert client.plan(0, 4) is not None and client.plan(0, 8) is not None
        # The coordinator publishes before it counts the request: let it finish counting.
        while coordinator.stats.prefetches_by_pub < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.stats.fetched == 1 and coordinator.stats.prefetches_by_pub == 1
        client.close()
