"""chronica.comm.peers: which connection speaks for which rank, bounded, and the job's
progress (the slowest current connection's position)."""

import pytest

from chronica.comm.peers import Peers
from chronica.comm.protocol import ProtocolError


def test_a_hello_admits_a_connection_once():
    peers = Peers(limit=8)
    first = peers.greet(b"a", rank=0, windows=3)
    assert first.new and not first.duplicate and first.forgotten == ()
    again = peers.greet(b"a", rank=0, windows=5)
    assert not again.new and not again.duplicate
    assert peers.joined(b"a") == 5 and len(peers) == 1


def test_a_connection_speaks_for_one_rank():
    peers = Peers(limit=8)
    peers.greet(b"a", rank=0, windows=0)
    with pytest.raises(ProtocolError, match="one connection speaks for one rank") as error:
        peers.greet(b"a", rank=1, windows=0)
    assert error.value.code == "protocol"
    with pytest.raises(ProtocolError, match="as rank 0, not rank 1"):
        peers.check(b"a", 1)
    peers.check(b"a", 0)


def test_a_connection_that_did_not_say_hello_is_told_to():
    with pytest.raises(ProtocolError, match="say hello first") as error:
        Peers(limit=8).check(b"stranger", 0)
    assert error.value.code == "hello"


def test_a_second_connection_for_a_rank_is_a_duplicate_and_takes_over():
    peers = Peers(limit=8)
    peers.greet(b"old", rank=2, windows=0)
    peers.moved(b"old", 0, 0)
    assert peers.greet(b"new", rank=2, windows=0).duplicate
    peers.moved(b"new", 0, 8)
    assert peers.progress() == (0, 8)  # the rank's current connection counts, not the old


def test_the_oldest_connections_are_forgotten_beyond_the_limit():
    peers = Peers(limit=2)
    peers.greet(b"a", 0, 0)
    peers.greet(b"b", 1, 0)
    peers.check(b"a", 0)  # a request makes a connection the newest
    assert peers.greet(b"c", 2, 0).forgotten == (b"b",)
    assert len(peers) == 2
    with pytest.raises(ProtocolError, match="say hello first"):
        peers.check(b"b", 1)


def test_progress_is_the_earliest_position_of_the_ranks():
    peers = Peers(limit=8)
    assert peers.progress() is None
    for identity, rank in ((b"a", 0), (b"b", 1)):
        peers.greet(identity, rank, 0)
    peers.moved(b"a", 1, 4)
    assert peers.progress() == (1, 4)  # b has not said where it is yet
    peers.moved(b"b", 0, 12)
    assert peers.progress() == (0, 12)
    peers.clear()
    assert peers.progress() is None and len(peers) == 0


def test_the_limit_is_checked_and_shown():
    assert repr(Peers(limit=3)) == "Peers(limit=3, connections=0)"
    with pytest.raises(ValueError, match="limit"):
        Peers(limit=0)
    with pytest.raises(TypeError, match="limit"):
        Peers(limit="8")
