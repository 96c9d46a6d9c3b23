"""Which connections the gate keeps when it must choose: real ranks first.

One job: the gate's table of accepted TCP connections (by file descriptor) and the choices
it makes about them, without any I/O (the gate cuts what this module names):

* a connection is *vouched* once it proved itself: on the ROUTER socket, a valid ``hello``
  (the coordinator admits it); on the PUB socket, a subscription to one rank's topic.
  Vouched connections are never evicted to make room;
* a full socket (``max_connections``) makes room for a new connection by evicting its
  oldest unvouched one that never sent a request (then, if none, its oldest unvouched
  one), never by refusing the newcomer, so a rank that joins or rejoins always gets in,
  and once it spoke no flood of silent connections can evict it before the coordinator
  welcomes it; one source address holding ``per_source`` unvouched connections of a
  socket loses its oldest (silent first) to its next;
* an unvouched ROUTER connection is cut ``hello_seconds`` after it was accepted (libzmq
  alone would let an idle one sit through its 30 s handshake interval);
* requests of unvouched connections pass through two token buckets: the connection's own
  (``stranger_first`` at once, then four a second), and, beyond a connection's first
  request, the strangers' shared one (``stranger_rate`` a second). A fresh connection's
  hello therefore never waits behind other strangers' floods.

Only the standard library: the gate loads this module by its path, without the package.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Admission"]

ROUTER, PUB = 0, 1
# A stranger connection's own bucket refills this many requests a second.
_OWN_RATE = 4.0


class _Connection:
    __slots__ = ("asked", "kind", "since", "source", "spoke", "stamp", "tokens", "vouched")

    def __init__(self, kind: int, source: str, now: float, tokens: float) -> None:
        self.kind, self.source, self.since = kind, source, now
        self.vouched, self.spoke = False, False
        self.tokens, self.stamp, self.asked = tokens, now, 0


class Admission:
    """The gate's connections and what it keeps of them (see the module docstring).

    Guarantees: a socket never holds more than ``max_connections`` connections unless all
    of them are vouched; a newcomer is refused only then; ``due`` names every unvouched
    ROUTER connection older than ``hello_seconds``; ``allow`` passes at most
    ``stranger_first`` requests of a stranger connection at once and four a second after
    that, and of all strangers' second and later requests at most ``stranger_rate`` a
    second after a burst of ``stranger_burst``.

    Args:
        max_connections: connections per socket.
        per_source: unvouched connections per socket and source address.
        hello_seconds: how long an unvouched ROUTER connection may stay.
        stranger_first: requests a stranger connection may send at once.
        stranger_rate: strangers' later requests per second, all together.
        stranger_burst: the burst of those.

    Example::

        >>> table = Admission(2, 2, 5.0, 4, 256, 64)
        >>> table.accept(ROUTER, 7, "10.0.0.2", now=0.0), table.accept(ROUTER, 8, "10.0.0.3", 0.0)
        ([], [])
        >>> table.accept(ROUTER, 9, "10.0.0.4", now=1.0)  # full: the oldest stranger goes
        [7]
    """

    def __init__(
        self,
        max_connections: int,
        per_source: int,
        hello_seconds: float,
        stranger_first: int,
        stranger_rate: float,
        stranger_burst: float,
    ) -> None:
        self.max_connections, self.per_source = max_connections, per_source
        self.hello_seconds, self.first = hello_seconds, stranger_first
        self.rate, self.burst = stranger_rate, stranger_burst
        self.tokens, self.stamp = stranger_burst, 0.0
        self.connections: dict[int, _Connection] = {}
        # Unvouched connections by (socket, whether they sent a request), oldest first, and
        # by (socket, source).
        self._waiting: dict[tuple[int, bool], OrderedDict[int, None]] = {
            (kind, spoke): OrderedDict() for kind in (ROUTER, PUB) for spoke in (False, True)
        }
        self._sources: dict[tuple[int, str], OrderedDict[int, None]] = {}
        self._counts = [0, 0]
        self.evicted = 0
        self.late = 0

    def __repr__(self) -> str:
        return (
            f"Admission(max_connections={self.max_connections}, per_source={self.per_source}, "
            f"hello_seconds={self.hello_seconds}, connections={self._counts})"
        )

    def accept(self, kind: int, fd: int, source: str, now: float) -> list[int]:
        """A connection ``fd`` from ``source`` was accepted on socket ``kind``: the
        connections to cut now (the oldest strangers making room; the newcomer itself only
        when every other connection of the socket is vouched).

        Args:
            kind: ``ROUTER`` (0) or ``PUB`` (1).
            fd: its file descriptor.
            source: the peer's address.
            now: the time (``time.monotonic()``).
        """
        self.forget(fd)  # a reused descriptor: the old connection is gone
        cut: list[int] = []
        mine = self._sources.get((kind, source))
        if mine is not None and len(mine) >= self.per_source:
            silent = (old for old in mine if not self.connections[old].spoke)
            cut.append(next(silent, next(iter(mine))))
        elif self._counts[kind] >= self.max_connections:
            queue = self._waiting[kind, False] or self._waiting[kind, True]
            if not queue:
                return [fd]
            cut.append(next(iter(queue)))
        for old in cut:
            self.evicted += 1
            self.forget(old)
        self.connections[fd] = _Connection(kind, source, now, float(self.first))
        self._counts[kind] += 1
        self._wait(fd)
        return cut

    def vouch(self, fd: int) -> None:
        """``fd`` proved itself (a valid hello, a rank's subscription): never evicted.

        Args:
            fd: the connection.
        """
        connection = self.connections.get(fd)
        if connection is not None and not connection.vouched:
            connection.vouched = True
            self._unwait(fd)

    def unvouch(self, fd: int, now: float) -> None:
        """``fd`` is a stranger again (the coordinator forgot it): its hello deadline
        starts over.

        Args:
            fd: the connection.
            now: the time.
        """
        connection = self.connections.get(fd)
        if connection is not None and connection.vouched:
            connection.vouched, connection.since = False, now
            self._wait(fd)

    def allow(self, fd: int, now: float) -> bool:
        """Whether a request of stranger connection ``fd`` passes to the coordinator.

        Args:
            fd: the connection (unknown: refused).
            now: the time.
        """
        connection = self.connections.get(fd)
        if connection is None:
            return False
        if not connection.spoke and not connection.vouched:
            self._unwait(fd)
            connection.spoke = True
            self._wait(fd)
        own = min(self.first, connection.tokens + (now - connection.stamp) * _OWN_RATE)
        connection.stamp = now
        if own < 1:
            connection.tokens = own
            return False
        if connection.asked:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens < 1:
                connection.tokens = own
                return False
            self.tokens -= 1
        connection.tokens = own - 1
        connection.asked += 1
        return True

    def due(self, now: float) -> list[int]:
        """The connections to cut now: unvouched ROUTER ones past their hello deadline
        (each named once; they are forgotten here).

        Args:
            now: the time.
        """
        out = []
        limit = now - self.hello_seconds
        for spoke in (False, True):
            for fd in self._waiting[ROUTER, spoke]:
                if self.connections[fd].since > limit:
                    break
                out.append(fd)
        self.late += len(out)
        for fd in out:
            self.forget(fd)
        return out

    def forget(self, fd: int) -> None:
        """``fd`` closed (or was cut).

        Args:
            fd: the connection.
        """
        connection = self.connections.get(fd)
        if connection is None:
            return
        if not connection.vouched:
            self._unwait(fd)
        del self.connections[fd]
        self._counts[connection.kind] -= 1

    def count(self, kind: int) -> int:
        """Open connections of socket ``kind``.

        Args:
            kind: ``ROUTER`` (0) or ``PUB`` (1).
        """
        return self._counts[kind]

    def _wait(self, fd: int) -> None:
        connection = self.connections[fd]
        self._waiting[connection.kind, connection.spoke][fd] = None
        self._sources.setdefault((connection.kind, connection.source), OrderedDict())[fd] = None

    def _unwait(self, fd: int) -> None:
        connection = self.connections[fd]
        self._waiting[connection.kind, connection.spoke].pop(fd, None)
        key = (connection.kind, connection.source)
        mine = self._sources.get(key)
        if mine is not None:
            mine.pop(fd, None)
            if not mine:
                del self._sources[key]
