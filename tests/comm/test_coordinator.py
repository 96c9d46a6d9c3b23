"""chronica.comm.coordinator: a live coordinator on loopback serving real clients, what it
refuses, and how it survives a barrage of hostile frames and its own planner failing."""

import logging
import math
import random

import msgpack
import numpy as np
import pytest
import zmq
from attacks import attack
from workers import scaled

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.gate_process import GateLimits
from chronica.comm.protocol import MAX_REQUEST_BYTES, MAX_WORLD, VERSION, decode, encode
from chronica.core import ScheduleConfig, Scheduler

# Valid requests, and messages only a coordinator sends, as fields.
_SAMPLES = {
    "hello": dict(rank=1, world=4, digest="ab" * 16),
    "fetch": dict(rank=1, epoch=0, first=4),
    "report": dict(rank=1, epoch=0, step=3, load=10.0, seconds=0.5),
    "plan": dict(
        seq=1,
        gen=12345,
        epoch=0,
        first=0,
        idx=np.arange(6, dtype="<i8").tobytes(),
        off=np.array([0, 2, 6], "<i8").tobytes(),
        w=np.ones(2, "<f8").tobytes(),
        load=np.ones(2, "<f8").tobytes(),
    ),
}


def _static_step(scheduler, epoch, step):
    static = scheduler.plan_epoch(epoch)
    return np.sort(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])


def _assert_partitions(scheduler, clients, epoch, first):
    """Every rank gets its part of the window, and together they are each step's samples."""
    plans = [c.plan(epoch, first) for c in clients]
    assert all(p is not None for p in plans)
    for step in range(first, first + plans[0].num_steps):
        got = np.sort(np.concatenate([p.local(step) for p in plans]))
        np.testing.assert_array_equal(got, _static_step(scheduler, epoch, step))
    return plans


def _raw(coordinator):
    """A bare DEALER connected to the coordinator's ROUTER (answers within the scaled wait)."""
    host, port, _ = coordinator.endpoint
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, int(1e3 * scaled(5)))
    raw.connect(f"tcp://{host}:{port}")
    return raw


# -- serving ---------------------------------------------------------------------------


def test_plans_reach_every_rank_and_partition_each_step(scheduler, make_clients):
    with Coordinator(scheduler, port=0) as coordinator:
        clients = make_clients(coordinator, scheduler, range(4))
        assert all(c.connect() for c in clients)
        for first in range(0, scheduler.num_steps(), 4):
            plans = _assert_partitions(scheduler, clients, 0, first)
            for step in range(first, first + plans[0].num_steps):
                for r, (c, p) in enumerate(zip(clients, plans, strict=True)):
                    c.report(0, step, p.loads[step - first], p.loads[step - first] * (r + 1))
        # Windows after the first arrive by PUB before they are asked for.
        assert all(c.stats.published > 0 for c in clients)
        assert sum(c.stats.fallbacks for c in clients) == 0


def test_late_joiner_recovers_missed_plans(scheduler, make_clients):
    with Coordinator(scheduler, port=0) as coordinator:
        (early,) = make_clients(coordinator, scheduler, [0])
        assert early.connect()
        seen = {first: early.plan(0, first) for first in range(0, 12, 4)}
        late, mine = make_clients(coordinator, scheduler, [1, 0])  # mine: rank 0 restarted
        assert late.connect() and mine.connect()
        for first, plan in seen.items():
            np.testing.assert_array_equal(mine.plan(0, first).indices, plan.indices)
            assert late.plan(0, first) is not None
        assert mine.stats.fetched >= 3 and mine.stats.fallbacks == 0


def test_a_prefetch_published_since_hello_is_served_by_pub_alone(
    scheduler, make_clients, wait_until
):
    with Coordinator(scheduler, port=0) as coordinator:
        (client,) = make_clients(coordinator, scheduler, [0])
        assert client.connect()
        assert client.plan(0, 0) is not None  # asked for: answered directly
        # Its PUB copy and the window after it, planned at once, arrive by PUB.
        wait_until(lambda: client._drain() or client.stats.published >= 2)
        client.prefetch(0, 8)  # planned now, after this rank's hello: the PUB copy answers
        wait_until(lambda: client._drain() or client.stats.published >= 3)
        assert client.plan(0, 4) is not None and client.plan(0, 8) is not None
        # The coordinator publishes before it counts the request: let it finish counting.
        wait_until(lambda: coordinator.stats.prefetches_by_pub >= 1)
        assert client.stats.fetched == 1 and coordinator.stats.prefetches_by_pub == 1


def test_mismatched_digest_and_world_fall_back_with_an_error_naming_why(scheduler, caplog):
    with Coordinator(scheduler, port=0) as coordinator, caplog.at_level(logging.ERROR):
        host, port, pub = coordinator.endpoint
        wrong = PlanClient(0, 4, "0" * 32, host, port, pub_port=pub, timeout=scaled(5))
        assert not wrong.connect()
        assert "sizes or sampler arguments" in wrong.refused
        other = PlanClient(0, 8, scheduler.digest, host, port, pub_port=pub, timeout=scaled(5))
        assert not other.connect()
        assert "world" in other.refused
        hellos = coordinator.stats.hellos
        for c in (wrong, other):
            assert c.plan(0, 0) is None  # at once: refused ranks are not kept waiting
            c.report(0, 0, 1.0, 1.0)
            c.close()
        assert coordinator.stats.hellos == hellos  # and they do not ask again
        assert coordinator.stats.refused == {"digest": 1, "world": 1}
    assert sum("refused this rank" in r.getMessage() for r in caplog.records) == 2


def test_bad_messages_are_rejected_and_the_coordinator_keeps_serving(scheduler, make_clients):
    with Coordinator(scheduler, port=0) as coordinator:
        raw = _raw(coordinator)
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
        (good,) = make_clients(coordinator, scheduler, [2])
        assert good.connect()
        assert good.plan(0, 0) is not None
        assert coordinator.stats.rejected == len(bad)
        raw.close(0)


def test_a_refused_fetch_names_its_window_and_stays_short(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        raw = _raw(coordinator)
        raw.send(encode("hello", rank=0, world=4, digest=scheduler.digest))
        assert decode(raw.recv(), 1 << 20)["t"] == "welcome"
        raw.send(encode("fetch", rank=0, epoch=0, first=3))
        answer = decode(raw.recv(), 1 << 20)
        assert (answer["code"], answer["epoch"], answer["first"]) == ("protocol", 0, 3)
        assert "not a window start" in answer["msg"] and len(answer["msg"]) <= 512
        raw.close(0)


def test_a_window_is_planned_once_and_published_in_order(scheduler, make_clients):
    with Coordinator(scheduler, port=0) as coordinator:
        clients = make_clients(coordinator, scheduler, range(4))
        assert all(c.connect() for c in clients)
        first = [c.plan(0, 0) for c in clients]
        again = make_clients(coordinator, scheduler, [0])[0]
        assert again.connect()
        np.testing.assert_array_equal(again.plan(0, 0).indices, first[0].indices)
        assert {p.gen for p in first} == {coordinator.generation}
        assert coordinator.stats.windows == 2  # (0, 0), and (0, 4) planned ahead: once each


def test_port_in_use_is_a_clear_error(scheduler):
    with Coordinator(scheduler, port=0) as first:
        _, port, _ = first.endpoint
        with pytest.raises(RuntimeError, match=f"{port}.*CHRONICA_PORT"):
            Coordinator(scheduler, port=port).start()


def test_start_twice_is_refused_and_close_is_idempotent(scheduler):
    coordinator = Coordinator(scheduler, "127.0.0.1", 0).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            coordinator.start()
        router, pub = coordinator.bound
        assert router.startswith("tcp://127.0.0.1:") and pub != router
    finally:
        coordinator.close()
    coordinator.close()
    with pytest.raises(RuntimeError, match="not running"):
        _ = coordinator.bound


def test_the_repr_shows_the_configuration(scheduler):
    coordinator = Coordinator(scheduler, "127.0.0.1", 0)
    text = repr(coordinator)
    for part in ("world=4", "host='127.0.0.1'", "port=0", "window=4", "horizon=64", "curve=off"):
        assert part in text, text
    with coordinator:
        assert f"endpoint={coordinator.endpoint}" in repr(coordinator)


# -- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, error, match",
    [
        (dict(port=-1), ValueError, "port"),
        (dict(port=65535), ValueError, "port"),  # port + 1 would not exist
        (dict(port="50051"), TypeError, "port"),
        (dict(host=""), ValueError, "host"),
        (dict(host=7), TypeError, "host"),
        (dict(context="ctx"), TypeError, "context"),
        (dict(curve="keys"), TypeError, "curve"),
        (dict(limits={"peer_bytes": 1}), TypeError, "GateLimits"),
    ],
)
def test_coordinator_arguments_are_checked(scheduler, args, error, match):
    with pytest.raises(error, match=match):
        Coordinator(scheduler, **args)


def test_coordinator_needs_a_dynamic_scheduler():
    with pytest.raises(TypeError, match="scheduler"):
        Coordinator("not a scheduler")
    static = Scheduler(np.ones(16), ScheduleConfig(num_replicas=2, batch_size=4))
    with pytest.raises(ValueError, match="dynamic"):
        Coordinator(static)


# -- hostile input and failures ----------------------------------------------------------

# Found by tests/comm/test_protocol.py: a rank whose fit gets an extreme speed ratio made
# the balancing kernel's rounding miss the step's total.
POISON = [(1, 0.0, 1.0), (0, 1.0, 1.0), (1, 7.398790413875484e17, 1.0)]


def test_extreme_feedback_still_gives_every_rank_its_share(scheduler, make_clients, wait_until):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        clients = make_clients(coordinator, scheduler, range(scheduler.config.num_replicas))
        assert all(c.connect() for c in clients)
        for step, (rank, load, seconds) in enumerate(POISON):
            clients[rank].report(0, step, load, seconds)
        wait_until(lambda: coordinator.stats.reports >= len(POISON))
        _assert_partitions(scheduler, clients, 0, 0)


def test_a_planning_failure_costs_one_traceback_not_the_service(
    scheduler, caplog, monkeypatch, make_clients
):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        # A long time-out: a refusal that waited for it would detach the client.
        *liars, honest = make_clients(coordinator, scheduler, [0, 1, 2], timeout=60.0)
        assert all(c.connect() for c in (*liars, honest))

        def broken(epoch, first):  # a planner bug, injected: no input reaches one today
            raise ArithmeticError(f"cannot plan epoch {epoch} step {first}")

        monkeypatch.setattr(coordinator.planner, "plan_window", broken)
        with caplog.at_level(logging.WARNING, logger="chronica"):
            assert honest.plan(0, 0) is None  # refused at once, not after the time-out
            assert honest.attached and honest.stats.refused_fetches == 1
            for _ in range(3):  # a peer repeating what fails
                honest.plan(0, 0)
        assert honest.stats.refused_fetches == 4 and coordinator.stats.refused["internal"] == 4
        assert sum(r.exc_info is not None for r in caplog.records) == 1
        assert coordinator._thread.is_alive()
        (late,) = make_clients(coordinator, scheduler, [3])
        assert late.connect()  # still serving


def _hostile_frames(rng: random.Random, digest: str) -> list[list[bytes]]:
    """A few hundred bad requests (multipart lists, without the routing id)."""
    frames = []
    valid = [encode(kind, **_SAMPLES[kind]) for kind in ("hello", "fetch", "report")]
    for _ in range(120):  # random bytes
        frames.append([rng.randbytes(rng.randint(0, 300))])
    for _ in range(120):  # valid messages with one field broken
        base = msgpack.unpackb(rng.choice(valid))
        name = rng.choice([*base, "extra"])
        base[name] = rng.choice(
            [None, True, -1, 2**64 - 1, math.nan, math.inf, -math.inf, "x" * 100, b"\x00" * 9]
            + [[1, [2, [3]]], {"a": {"b": {}}}, 1e308, 5e-324, 2**40 + 1, MAX_WORLD]
        )
        frames.append([msgpack.packb(base, use_bin_type=True)])
    for frame in valid:  # every truncation of valid requests
        frames += [[frame[:cut]] for cut in range(len(frame))]
    frames += [[b"a", b"b"], [b"", b"", b""], [valid[0], valid[0]]]  # extra frames
    frames += [  # not-yet-greeted requests, wrong worlds and digests, other ranks' slots
        [encode("fetch", rank=0, epoch=0, first=0)],
        [encode("report", rank=0, epoch=0, step=0, load=1.0, seconds=1.0)],
        [encode("hello", rank=0, world=3, digest=digest)],
        [encode("hello", rank=0, world=4, digest="f" * 32)],
        [encode("hello", rank=7, world=4, digest=digest)],
        [encode("welcome", window=4, steps=1)],  # a rank may not send this
        [encode("plan", **_SAMPLES["plan"])],
        [encode("error", code="x", msg="y")],
    ]
    rng.shuffle(frames)
    return frames


@attack(
    "held",
    "500 hostile requests (malformed, oversized, wrong types or versions, several "
    "frames, wrong digest): each refused, plans still served",
)
def test_a_barrage_of_hostile_frames_leaves_the_coordinator_serving(
    scheduler, caplog, make_clients
):
    ctx = zmq.Context.instance()
    # Strangers' requests are rate-limited by the gate and its queue to the coordinator is
    # bounded (both tested in test_security.py); here every hostile frame must reach the
    # coordinator and be answered, even when a busy machine lets the gate forward them one
    # by one (each its own bundle) faster than the coordinator reads.
    limits = GateLimits(stranger_burst=1 << 12, stranger_first=1 << 12, link_hwm=1 << 10)
    with Coordinator(scheduler, "127.0.0.1", 0, limits=limits) as coordinator:
        host, port, _ = coordinator.endpoint
        frames = _hostile_frames(random.Random(8), scheduler.digest)
        attackers = [ctx.socket(zmq.DEALER) for _ in range(5)]
        for sock in attackers:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{host}:{port}")
        with caplog.at_level(logging.WARNING, logger="chronica"):
            for i, parts in enumerate(frames):
                attackers[i % 4].send_multipart(parts)
            poller = zmq.Poller()
            for sock in attackers[:4]:
                poller.register(sock, zmq.POLLIN)
            answers = 0
            while answers < len(frames) and (ready := poller.poll(1e3 * scaled(5))):
                for sock, _ in ready:
                    while sock.poll(0):
                        assert decode(sock.recv(), 1 << 20)["t"] == "error"
                        answers += 1
            good = make_clients(coordinator, scheduler, range(4))
            assert all(c.connect() for c in good)
            _assert_partitions(scheduler, good, 0, 0)
            # A frame over the cap: ZeroMQ drops that connection before anyone reads it.
            attackers[4].send(b"\x00" * (MAX_REQUEST_BYTES + 1))
            _assert_partitions(scheduler, good, 0, 4)
        stats = coordinator.stats
        assert coordinator._thread.is_alive()
        assert answers == stats.rejected == len(frames) > 400  # each refused, and told so
        assert sum(stats.refused.values()) == stats.rejected
        assert stats.refused["frames"] == 3 and stats.refused["protocol"] > 300
        assert stats.refused["hello"] >= 2 and stats.refused["digest"] >= 1
        assert "internal" not in stats.refused
        refusals = [r for r in caplog.records if "refused a message" in r.getMessage()]
        assert 1 <= len(refusals) <= 12  # said, but not one line per hostile frame
        for sock in attackers:
            sock.close(0)


@attack(
    "held",
    "a far epoch fetched mid-job: refused, no window planned twice",
)
def test_far_epochs_are_refused_and_a_window_is_never_planned_twice(scheduler, make_clients):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        first, second, rogue = make_clients(coordinator, scheduler, [0, 1, 2], timeout=2.0)
        assert first.connect() and second.connect() and rogue.connect()
        before = [first.plan(0, 0), second.plan(0, 0)]
        # A peer that can say hello asks for an epoch far ahead: refused at once ("stale"),
        # so the plans the ranks use now are not dropped and re-planned differently.
        assert rogue.plan(10**6, 0) is None and rogue.stats.refused_fetches == 1
        assert coordinator.stats.refused["stale"] == 1
        (late,) = make_clients(coordinator, scheduler, [0], timeout=2.0)
        assert late.connect()
        np.testing.assert_array_equal(late.plan(0, 0).indices, before[0].indices)
        assert coordinator.stats.windows == 2  # (0, 0) and the early (0, 4), once each


@attack(
    "held",
    "hello as a second rank on one connection, or a rank's hello on a second connection",
)
def test_duplicate_hellos_are_counted_and_a_connection_keeps_its_rank(scheduler, make_clients):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        one, two = make_clients(coordinator, scheduler, [1, 1])
        assert one.connect() and two.connect()
        assert coordinator.stats.duplicate_hellos == 1
        assert one.plan(0, 0) is not None and two.plan(0, 0) is not None  # a restarted rank
        raw = _raw(coordinator)
        raw.send(encode("hello", rank=2, world=4, digest=scheduler.digest))
        assert decode(raw.recv(), 1 << 20)["t"] == "welcome"
        for message in (
            encode("hello", rank=3, world=4, digest=scheduler.digest),
            encode("fetch", rank=3, epoch=0, first=0),
        ):
            raw.send(message)
            answer = decode(raw.recv(), 1 << 20)
            assert answer["t"] == "error" and "as rank 2" in answer["msg"]
        raw.close(0)
