"""chronica.comm.gate: the gate process relays one-frame requests up and answers down,
refuses requests of several frames, names the port a bind failed on, and closes cleanly.
What it bounds under attack (byte budgets, strangers' rate, a killed gate) is in
test_security.py; how it publishes a window, in test_publish.py; the gate's own loop and
its helpers, in test_gate_process.py."""

import socket

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
