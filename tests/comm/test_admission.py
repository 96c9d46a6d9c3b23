"""chronica.comm.admission: the gate's choices when it must choose. A full socket evicts
its oldest unproven connection, never a vouched rank and never the newcomer (unless all
others are vouched); one source cannot hold more than its share; unproven ROUTER
connections are cut at their hello deadline; a fresh connection's first request never
waits behind other strangers' floods."""

from chronica.comm.admission import PUB, ROUTER, Admission


def _table(**options):
    settings = dict(
        max_connections=4,
        per_source=3,
        hello_seconds=5.0,
        stranger_first=2,
        stranger_rate=1.0,
        stranger_burst=1.0,
    )
    settings.update(options)
    return Admission(**settings)


def test_a_full_socket_evicts_its_oldest_stranger_never_a_vouched_rank():
    table = _table(per_source=100)
    for fd in range(4):
        assert table.accept(ROUTER, fd, f"10.0.0.{fd}", now=fd) == []
    table.vouch(0)  # rank 0 said hello
    assert table.accept(ROUTER, 10, "10.0.0.9", now=5) == [1]  # the oldest stranger
    assert table.accept(ROUTER, 11, "10.0.0.9", now=6) == [2]
    table.vouch(3)
    table.vouch(10)
    table.vouch(11)
    assert table.accept(ROUTER, 12, "10.0.0.9", now=7) == [12]  # every other one is a rank
    assert table.count(ROUTER) == 4 and table.count(PUB) == 0


def test_one_source_loses_its_own_oldest_connection_to_its_next():
    table = _table(max_connections=100)
    for fd in range(3):
        table.accept(PUB, fd, "attacker", now=fd)
    table.accept(PUB, 50, "rank-host", now=3)
    assert table.accept(PUB, 3, "attacker", now=4) == [0]
    assert table.accept(PUB, 51, "rank-host", now=5) == []


def test_unproven_router_connections_are_cut_at_their_hello_deadline():
    table = _table(max_connections=100, per_source=100)
    table.accept(ROUTER, 1, "a", now=0.0)
    table.accept(ROUTER, 2, "a", now=1.0)
    table.accept(PUB, 3, "a", now=0.0)  # a subscriber never says hello: no deadline
    table.vouch(2)
    assert table.due(4.9) == []
    assert table.due(5.0) == [1]
    assert table.due(100.0) == []
    table.unvouch(2, now=50.0)  # forgotten by the coordinator: a stranger again
    assert table.due(54.0) == [] and table.due(55.0) == [2]
    assert table.late == 2


def test_a_fresh_connections_first_request_passes_whatever_other_strangers_sent():
    table = _table(max_connections=100, per_source=100)
    for fd in range(64):  # a flood of wrong hellos, one connection each, again and again
        table.accept(ROUTER, fd, "attacker", now=0.0)
    passed = sum(table.allow(fd, now=0.0) for _ in range(5) for fd in range(64))
    assert passed == 64 + 1  # each one's first, then the shared burst of 1
    table.accept(ROUTER, 99, "rank", now=0.0)
    assert table.allow(99, now=0.0)  # the rank's hello
    assert not table.allow(99, now=0.0)  # its second waits for the shared bucket
    assert table.allow(99, now=1.0)


def test_a_strangers_own_bucket_bounds_it_alone():
    table = _table(max_connections=100, per_source=100, stranger_burst=1000, stranger_rate=1000)
    table.accept(ROUTER, 1, "a", now=0.0)
    assert [table.allow(1, now=0.0) for _ in range(4)] == [True, True, False, False]
    assert table.allow(1, now=0.25) and not table.allow(1, now=0.25)  # four a second
    assert not table.allow(7, now=0.0)  # unknown connection


def test_forgotten_connections_leave_no_trace():
    table = _table()
    table.accept(ROUTER, 1, "a", now=0.0)
    table.accept(ROUTER, 1, "b", now=1.0)  # the descriptor reused: the old one is gone
    table.forget(1)
    table.forget(1)
    assert table.count(ROUTER) == 0 and table.connections == {} and table.due(99.0) == []
    assert "Admission(max_connections=4" in repr(table)


def test_a_connection_that_spoke_outlives_any_number_of_silent_ones():
    table = _table(max_connections=4, per_source=4)
    table.accept(ROUTER, 1, "host", now=0.0)
    assert table.allow(1, now=0.0)  # a rank's hello, not yet welcomed
    evicted = [table.accept(ROUTER, fd, "host", now=0.0) for fd in range(10, 100)]
    assert [1] not in evicted and 1 in table.connections
    assert table.accept(ROUTER, 100, "elsewhere", now=0.0) != [1]
