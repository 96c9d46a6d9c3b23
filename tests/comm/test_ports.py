"""``free_port``: consecutive free ports drawn below the kernel's ephemeral range."""

from __future__ import annotations

import socket
from contextlib import ExitStack

import pytest

from chronica.comm import ports
from chronica.comm.ports import free_port


@pytest.mark.parametrize("count", [1, 2, 5])
def test_the_ports_are_free_consecutive_and_below_the_ephemeral_range(count: int) -> None:
    for _ in range(20):
        port = free_port(count)
        assert ports._LOWEST <= port and port + count <= ports._ephemeral_low()
        with ExitStack() as stack:  # every port of the run binds now
            for offset in range(count):
                stack.enter_context(socket.socket()).bind(("127.0.0.1", port + offset))


def test_a_port_held_by_a_server_is_never_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_port(5)
    with ExitStack() as stack:
        for offset in (0, 1, 3):  # base + 2 and base + 4 stay free
            stack.enter_context(socket.socket()).bind(("127.0.0.1", base + offset))
        monkeypatch.setattr(ports, "_LOWEST", base)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: base + 5)
        assert {free_port() for _ in range(50)} == {base + 2, base + 4}
        with pytest.raises(OSError, match="no 2 consecutive free TCP ports"):
            free_port(2)


@pytest.mark.parametrize(
    ("count", "error", "words"),
    [
        ("2", TypeError, "must be an int"),
        (True, TypeError, "must be an int"),
        (0, ValueError, "at least 1"),
    ],
)
def test_a_wrong_count_is_refused_by_name(count: object, error: type, words: str) -> None:
    with pytest.raises(error, match=f"count=.* {words}"):
        free_port(count)  # type: ignore[arg-type]
