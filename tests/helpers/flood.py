"""A connection flood against a coordinator's gate, run as its own process:
``python flood.py HOST ROUTER_PORT PUB_PORT IDLE HELLOS SECONDS``.

* ``IDLE`` raw TCP connections, half to each port, that never speak; each one the gate cuts
  is opened again at once, so the pressure stays;
* ``HELLOS`` ZeroMQ DEALER connections saying ``hello`` with a wrong digest, over and over
  (under CURVE they hold no key, so their handshakes fail instead).

Prints ``ready`` once every idle connection was opened, then ``done opened=N`` (connections
opened in all) when ``SECONDS`` have passed.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time

import zmq

from chronica.comm.protocol import encode


def _open(selector: selectors.BaseSelector, host: str, port: int) -> bool:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect_ex((host, port))
        selector.register(sock, selectors.EVENT_READ, port)
    except OSError:
        sock.close()
        return False
    return True


def main() -> None:
    host, router, pub, idle, hellos, seconds = sys.argv[1:7]
    ports = (int(router), int(pub))
    selector = selectors.DefaultSelector()
    opened = sum(_open(selector, host, ports[i % 2]) for i in range(int(idle)))
    context = zmq.Context()
    dealers = []
    for _ in range(int(hellos)):
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, 4)
        dealer.connect(f"tcp://{host}:{ports[0]}")
        dealers.append(dealer)
    wrong = encode("hello", rank=0, world=2, digest="f" * 32)
    print("ready", flush=True)
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        for dealer in dealers:
            try:
                dealer.send(wrong, zmq.NOBLOCK)
            except zmq.Again:
                pass
            while dealer.poll(0):
                dealer.recv()
        for key, _ in selector.select(timeout=0.01):
            sock = key.fileobj
            try:
                data = sock.recv(4096)  # the gate's greeting, or the end
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                opened += _open(selector, host, key.data)
    print(f"done opened={opened}", flush=True)
    context.destroy(linger=0)


if __name__ == "__main__":
    main()
