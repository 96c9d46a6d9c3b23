"""chronica.comm.gate: the gate process relays one-frame requests up and answers down,
refuses requests of several frames, names the port a bind failed on, and closes cleanly.
What it bounds under attack (byte budgets, strangers' rate, a killed gate) is in
test_security.py; how it publishes a window, in test_publish.py; the gate's own loop and
its helpers, in test_gate_process.py."""

import os
import signal
import socket
import time

import pytest
import zmq
from workers import scaled

from chronica.comm.gate import Gate
from chronica.comm.gate_process import GateLimits


def _recv(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(int(1e3 * scaled(10))), "nothing arrived in time"
    return sock.recv_multipart()


@pytest.fixture
def gate():
    gate = Gate(zmq.Context.instance(), "127.0.0.1", (0, 0), world=2)
    gate.bind()
    gate.open()
    yield gate
    gate.close()


@pytest.fixture
def dealer(gate):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{gate.ports[0]}")
    yield sock
    sock.close(0)


def test_a_request_goes_up_and_its_answer_comes_down(gate, dealer):
    assert gate.pid() is not None and gate.ports[0] != gate.ports[1] != 0
    dealer.send(b"a request")
    tag, identity, payload = _recv(gate.link)
    assert (tag, payload) == (b"m", b"a request")
    gate.link.send_multipart([b"s", identity, b"an answer"])
    assert _recv(dealer) == [b"an answer"]


def test_a_request_of_several_frames_never_reaches_the_coordinator(gate, dealer):
    dealer.send_multipart([b"one", b"two"])
    dealer.send(b"then a good one")
    seen = [_recv(gate.link), _recv(gate.link)]
    assert seen[0][0] == b"f"  # a note naming the connection, not the frames
    assert len(seen[0]) == 2 and seen[1][0] == b"m" and seen[1][2] == b"then a good one"


def test_a_bind_failure_names_the_port_and_its_role():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gate = Gate(zmq.Context.instance(), "127.0.0.1", (0, port), world=1)
        try:
            with pytest.raises(OSError):
                gate.bind()
            assert gate.failed_port == (port, "pub")
        finally:
            gate.close()


def test_close_ends_the_gate_process_and_is_idempotent():
    gate = Gate(zmq.Context.instance(), "127.0.0.1", (0, 0), world=1, limits=GateLimits())
    gate.bind()
    gate.open()
    pid = gate.pid()
    assert pid is not None and gate.alive()
    gate.close()
    gate.close()
    assert gate.pid() is None and gate.link is None


def test_a_gate_that_keeps_dying_is_restarted_at_once_up_to_its_bound(caplog):
    """Killed again and again, a gate is replaced at once up to ``restarts_per_minute``
    times a minute; beyond, the next start waits and one warning says why."""
    limits = GateLimits(restarts_per_minute=2)
    gate = Gate(zmq.Context.instance(), "127.0.0.1", (0, 0), world=1, limits=limits)
    gate.bind()
    gate.open()
    try:
        with caplog.at_level("WARNING", logger="chronica"):
            for _ in range(2):
                os.kill(gate.pid(), signal.SIGKILL)
                gate._child.wait(scaled(30))
                deadline = time.monotonic() + scaled(30)
                while not gate.alive():  # started again at once, with no pause
                    assert time.monotonic() < deadline
            os.kill(gate.pid(), signal.SIGKILL)
            gate._child.wait(scaled(30))
            assert not gate.alive() and not gate.alive()  # the third waits out the minute
        assert gate.restarts == 3 and gate.pid() is None
        bound = [r.getMessage() for r in caplog.records if "in the last minute" in r.getMessage()]
        assert len(bound) == 1 and "ended 2 times in the last minute" in bound[0]
    finally:
        gate.close()
