"""chronica.comm.gate_process: what the gate's loop stands on, tested in this process:
readiness of a socket, the kernel's byte count of a connection, cutting one, the resident
memory reading, and the limits' defaults. The loop itself runs in test_gate.py's gates."""

import os
import socket

import zmq
from workers import scaled

from chronica.comm.gate_process import (
    HARD_BYTES,
    PEER_BYTES,
    SOFT_BYTES,
    GateLimits,
    _cut,
    _received,
    _Resident,
    readable,
)


def _connected_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def test_readable_says_whether_a_message_waits():
    context = zmq.Context.instance()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://readable-test")
    b.connect("inproc://readable-test")
    try:
        assert not readable(b)
        a.send(b"x")
        assert b.poll(int(1e3 * scaled(5)))
        assert readable(b)
        b.recv()
        assert not readable(b)
    finally:
        a.close(0)
        b.close(0)


def test_the_kernel_counts_what_a_connection_received():
    client, server = _connected_pair()
    try:
        assert _received(server.fileno()) == 0
        client.sendall(b"x" * 1000)
        server.settimeout(scaled(5))
        got = b""
        while len(got) < 1000:
            got += server.recv(1000)
        assert _received(server.fileno()) == 1000
    finally:
        client.close()
        server.close()


def test_a_descriptor_that_is_no_tcp_connection_counts_nothing():
    read, write = os.pipe()
    try:
        assert _received(read) is None
        _cut(read)  # not a socket: nothing to do, nothing raised
    finally:
        os.close(read)
        os.close(write)
    assert _received(read) is None  # closed


def test_cutting_a_connection_ends_it_for_the_peer():
    client, server = _connected_pair()
    try:
        _cut(server.fileno())
        server.close()
        client.settimeout(scaled(5))
        try:
            assert client.recv(1) == b""  # closed...
        except ConnectionResetError:
            pass  # ...or reset: either way the peer is gone
    finally:
        client.close()


def test_resident_memory_is_read_in_bytes():
    resident = _Resident()
    before = resident()
    block = bytearray(32 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert before > 1 << 20 and resident() >= before + (16 << 20)


def test_the_limits_default_to_the_module_constants():
    limits = GateLimits()
    assert (limits.soft_bytes, limits.hard_bytes) == (
        SOFT_BYTES,
        HARD_BYTES,
    ) and HARD_BYTES > SOFT_BYTES
    assert limits.peer_bytes == PEER_BYTES == 1 << 20 and limits.stranger_burst is None
    assert GateLimits(stranger_rate=5).stranger_rate == 5
