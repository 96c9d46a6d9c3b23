"""The coordinator's table of connections: who speaks for which rank, and where each is.

One job: remember, for at most ``limit`` connections (ROUTER routing ids), the rank each
said ``hello`` as, which connection speaks for each rank now, how many windows had been
published when it said hello, and the last position (epoch, step) it fetched or reported.
The job's progress, the earliest position of the ranks' current connections, bounds how far
ahead the coordinator plans. The oldest connections are forgotten first, so no peer can
grow the table without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from chronica.comm.protocol import ProtocolError
from chronica.core.checks import check_int

__all__ = ["Greeting", "Peers"]


@dataclass(frozen=True)
class Greeting:
    """What a ``hello`` changed: ``new`` (a connection not known before: the gate admits
    it), ``duplicate`` (another known connection spoke for the same rank), ``forgotten``
    (the oldest connections dropped to stay within the limit: the gate forgets them)."""

    new: bool
    duplicate: bool
    forgotten: tuple[bytes, ...]


class Peers:
    """The connections that said hello, oldest first, at most ``limit`` of them.

    Guarantees: a connection speaks for one rank (``greet`` refuses a second one);
    ``check`` refuses a connection that has not said hello, or asks as another rank;
    ``progress`` is the earliest position of the connections that speak for a rank now.

    Args:
        limit: the most connections remembered (the coordinator uses ``2 * world + 64``).

    Example::

        >>> peers = Peers(limit=8)
        >>> peers.greet(b"id-0", rank=0, windows=0).new
        True
        >>> peers.moved(b"id-0", 0, 4)
        >>> peers.progress()
        (0, 4)
    """

    def __init__(self, limit: int) -> None:
        self.limit = check_int("limit", limit, 1)
        # Which rank each connection (ROUTER routing id) said hello as, oldest first.
        self._ranks: OrderedDict[bytes, int] = OrderedDict()
        self._holder: dict[int, bytes] = {}
        # Windows published before each connection's hello (their count then): a later one
        # reached its SUB socket, so a prefetch of it needs no second copy.
        self._joined: dict[bytes, int] = {}
        # Where each connection last said it is, (epoch, step) of a fetch or report: the
        # job's progress is the slowest rank's, and planning stays within a horizon of it.
        self._pos: dict[bytes, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return f"Peers(limit={self.limit}, connections={len(self._ranks)})"

    def __len__(self) -> int:
        return len(self._ranks)

    def greet(self, identity: bytes, rank: int, windows: int) -> Greeting:
        """Record that connection ``identity`` said hello as ``rank``.

        Args:
            identity: the connection's routing id.
            rank: the rank it speaks for.
            windows: how many windows were published before this hello.

        Raises ``ProtocolError`` if the connection said hello as another rank before.
        """
        known = self._ranks.get(identity)
        if known is not None and known != rank:
            raise ProtocolError(
                f"this connection said hello as rank {known}; one connection speaks for one rank"
            )
        holder = self._holder.get(rank)
        duplicate = holder is not None and holder != identity and holder in self._ranks
        new = identity not in self._ranks
        self._ranks[identity] = rank
        self._ranks.move_to_end(identity)
        self._holder[rank] = identity
        self._joined[identity] = windows
        forgotten = []
        while len(self._ranks) > self.limit:
            old, old_rank = self._ranks.popitem(last=False)
            del self._joined[old]
            self._pos.pop(old, None)
            forgotten.append(old)
            if self._holder.get(old_rank) == old:
                del self._holder[old_rank]
        return Greeting(new, duplicate, tuple(forgotten))

    def check(self, identity: bytes, rank: int) -> None:
        """Refuse (``ProtocolError``) unless connection ``identity`` said hello as ``rank``.

        Args:
            identity: the connection's routing id.
            rank: the rank its request names.
        """
        known = self._ranks.get(identity)
        if known is None:
            raise ProtocolError(
                "this connection has not said hello (a restarted coordinator, or a new "
                "connection): say hello first",
                code="hello",
            )
        if known != rank:
            raise ProtocolError(f"this connection said hello as rank {known}, not rank {rank}")
        self._ranks.move_to_end(identity)

    def joined(self, identity: bytes) -> int:
        """How many windows had been published when ``identity`` said hello.

        Args:
            identity: a connection that said hello.
        """
        return self._joined[identity]

    def moved(self, identity: bytes, epoch: int, step: int) -> None:
        """Record that ``identity`` fetched or reported ``(epoch, step)``.

        Args:
            identity: a connection that said hello.
            epoch: the epoch of its request.
            step: the step (a fetch: the window's first step) of its request.
        """
        self._pos[identity] = (epoch, step)

    def progress(self) -> tuple[int, int] | None:
        """The job's progress: the earliest position of the ranks' current connections
        (``None`` before any of them fetched or reported)."""
        known = [self._pos[i] for i in self._holder.values() if i in self._pos]
        return min(known) if known else None

    def clear(self) -> None:
        """Forget every connection (they went with a gate that was replaced)."""
        self._ranks.clear()
        self._holder.clear()
        self._joined.clear()
        self._pos.clear()
