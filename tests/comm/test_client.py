"""chronica.comm.client: a rank's PlanClient. It never blocks training past its time-out,
falls back to the static plan when the coordinator is away or refuses, re-attaches when it
is back, and checks every argument."""

import logging
import math
import time
import tracemalloc

import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st
from workers import free_ports, scaled

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.protocol import MAX_WORLD, encode, topic


def test_an_unreachable_coordinator_falls_back_and_warns_once(scheduler, caplog):
    # Nothing listens on port 1 of loopback: every call falls back, none waits for long.
    client = PlanClient(0, 4, scheduler.digest, "127.0.0.1", 1, timeout=0.3)
    with caplog.at_level("WARNING", logger="chronica"):
        assert not client.connect()
        assert client.plan(0, 0) is None
        assert client.plan(0, 4) is None
        client.prefetch(0, 8)  # detached: nothing is sent, nothing fails
        client.report(0, 0, 1.0, 1.0)
    assert not client.attached and client.stats.fallbacks == 2
    assert sum("static plan" in r.getMessage() for r in caplog.records) == 1  # warned once
    client.close()
    client.close()  # idempotent


def test_a_restarted_coordinator_is_greeted_again(scheduler, make_clients):
    """A coordinator that does not know a connection answers 'hello first'; the client
    greets it again and re-sends its fetch within the same wait."""
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        (client,) = make_clients(coordinator, scheduler, [3])
        assert client.connect()
        coordinator._peers.clear()  # what a restart forgets
        assert client.plan(0, 0) is not None
        assert client.stats.fallbacks == 0 and coordinator.stats.refused["hello"] == 1


def test_a_client_re_attaches_to_a_coordinator_back_on_its_port(scheduler, caplog):
    port = free_ports(2)[0]
    client = PlanClient(1, 4, scheduler.digest, "127.0.0.1", port, timeout=scaled(5))
    with caplog.at_level("WARNING", logger="chronica"):
        with Coordinator(scheduler, "127.0.0.1", port):
            assert client.connect() and client.plan(0, 0) is not None
        assert client.plan(0, 8, timeout=0.3) is None  # gone: the static plan serves
        assert not client.attached
        with Coordinator(scheduler, "127.0.0.1", port):
            assert client.connect(timeout=scaled(10))  # the same client, no new socket
            assert client.plan(0, 0) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("coordinator is back" in m for m in messages)
    assert client.stats.fallbacks == 1
    client.close()


def test_reports_reach_the_coordinator_with_their_work(scheduler, make_clients, wait_until):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        (client,) = make_clients(coordinator, scheduler, [0])
        assert client.connect()
        assert client.window == scheduler.config.window
        client.report(0, 0, 2.0, 0.5)
        client.report(0, 1, 2.0, 0.5, work=np.array([1.0, 100.0, 1e4]))
        wait_until(lambda: coordinator.stats.reports >= 2)
        assert coordinator.stats.rejected == 0


def test_the_repr_shows_the_configuration(scheduler):
    client = PlanClient(2, 4, scheduler.digest, "127.0.0.1", 5000, timeout=1.5)
    try:
        text = repr(client)
        for part in (
            "rank=2",
            "world=4",
            "host='127.0.0.1'",
            "port=5000",
            "pub_port=5001",
            "timeout=1.5",
            "curve=off",
            "attached=False",
        ):
            assert part in text, text
    finally:
        client.close()


# -- arguments -------------------------------------------------------------------------

not_ints = st.one_of(
    st.none(), st.booleans(), st.floats(), st.text(max_size=3), st.just([1]), st.just(1.5)
)


@given(not_ints)
def test_a_rank_that_is_no_int_is_a_type_error(rank):
    with pytest.raises(TypeError, match="rank"):
        PlanClient(rank, 4, "d", "127.0.0.1", 5000)


@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=4)))
def test_a_rank_outside_the_world_is_a_value_error(rank):
    with pytest.raises(ValueError, match="rank"):
        PlanClient(rank, 4, "d", "127.0.0.1", 5000)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_WORLD + 1)))
def test_a_world_out_of_range_is_a_value_error(world):
    with pytest.raises(ValueError, match="world"):
        PlanClient(0, world, "d", "127.0.0.1", 5000)


@given(not_ints)
def test_a_world_that_is_no_int_is_a_type_error(world):
    with pytest.raises(TypeError, match="world"):
        PlanClient(0, world, "d", "127.0.0.1", 5000)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_ports_out_of_range_are_value_errors(port):
    with pytest.raises(ValueError, match="port"):
        PlanClient(0, 4, "d", "127.0.0.1", port)
    with pytest.raises(ValueError, match="pub_port"):
        PlanClient(0, 4, "d", "127.0.0.1", 5000, pub_port=port)


@given(not_ints.filter(lambda value: value is not None))
def test_ports_that_are_no_ints_are_type_errors(port):
    with pytest.raises(TypeError, match="port"):
        PlanClient(0, 4, "d", "127.0.0.1", port)
    with pytest.raises(TypeError, match="pub_port"):
        PlanClient(0, 4, "d", "127.0.0.1", 5000, pub_port=port)


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("digest", "", ValueError),
        ("digest", None, TypeError),
        ("digest", "x" * 129, ValueError),
        ("host", "", ValueError),
        ("host", "  ", ValueError),
        ("host", None, TypeError),
        ("timeout", 0, ValueError),
        ("timeout", -1.0, ValueError),
        ("timeout", math.nan, ValueError),
        ("timeout", math.inf, ValueError),
        ("timeout", "10", TypeError),
        ("max_plan_bytes", 0, ValueError),
        ("max_plan_bytes", 1 << 40, ValueError),
        ("max_plan_bytes", 2.5, TypeError),
        ("context", "ctx", TypeError),
        ("curve", "keys", TypeError),
    ],
)
def test_client_arguments_are_checked(name, value, error):
    args = dict(rank=0, world=4, digest="d", host="127.0.0.1", port=5000)
    args[name] = value
    with pytest.raises(error, match=name):
        PlanClient(**args)


def test_the_log_names_the_rank(scheduler, caplog):
    client = PlanClient(3, 4, scheduler.digest, "127.0.0.1", 1, timeout=0.1)
    with caplog.at_level(logging.WARNING, logger="chronica"):
        client.connect()
    client.close()
    assert any(r.getMessage().startswith("chronica: rank 3:") for r in caplog.records)


def _bombs() -> list[bytes]:
    """Frames of about 800 KB that msgpack accepts (every container within its limits):
    a map whose value nests empty arrays 400,000 deep, and one holding 3 × 64 × 64 × 64
    empty arrays; before the decoder checked the shape, each cost seconds and tens of MiB."""
    head = b"\x82\xa1v\x03\xa1t"
    deep = head + b"\x91" * 400_000 + b"\x90"
    cube = b"\xdc\x00\x40" + (b"\xdc\x00\x40" + (b"\xdc\x00\x40" + b"\x90" * 64) * 64) * 64
    wide = head + b"\x93" + cube * 3
    return [deep, wide]


def test_a_nested_bomb_costs_a_rank_neither_its_deadline_nor_memory(scheduler):
    """A coordinator (or whoever can publish to the rank) answers with nested-container
    bombs on both sockets: ``plan(timeout=1)`` returns at its deadline, refusing each bomb
    at its first nested byte, and the rank's Python memory grows by less than 8 MiB."""
    context = zmq.Context()
    router, publisher = context.socket(zmq.ROUTER), context.socket(zmq.XPUB)
    for sock in (router, publisher):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    pub_port = publisher.bind_to_random_port("tcp://127.0.0.1")
    client = PlanClient(
        0, 2, scheduler.digest, "127.0.0.1", port, pub_port=pub_port, max_plan_bytes=1 << 20
    )
    try:
        assert publisher.poll(scaled(10) * 1000)  # the rank's subscription: PUB reaches it
        publisher.recv()
        client.prefetch(0, 0)  # a DEALER frame, so the ROUTER learns the rank's identity
        assert router.poll(scaled(10) * 1000)
        identity, _ = router.recv_multipart()
        router.send_multipart([identity, encode("welcome", window=16, steps=64)])
        assert client.connect(timeout=scaled(10))
        bombs = _bombs() * 8
        for bomb in bombs:
            router.send_multipart([identity, bomb])
            publisher.send_multipart([topic(0), bomb])
        assert client._dealer.poll(scaled(10) * 1000) and client._sub.poll(scaled(10) * 1000)
        tracemalloc.start()
        start = time.monotonic()
        assert client.plan(0, 0, timeout=1.0) is None
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert client.stats.rejected >= 2
        assert peak < 8 << 20, f"decoding the bombs took {peak >> 20} MiB"
        assert elapsed < scaled(1.2), f"plan(timeout=1) returned after {elapsed:.2f} s"
    finally:
        client.close()
        context.destroy(linger=0)
