"""What the static-shape faces of the streaming engine (``chronica.tf.stream``,
``chronica.jax.stream``) share: the ranks' collectives over a coordination service's
key-value store, and one micro-batch as dense packed rows.

``StoreCollectives`` runs the engine's ``allgather`` and ``alltoall`` through the
``(set, get, delete)`` calls of a key-value store (``chronica.runtime.agreement.KeyValueStore``):
TensorFlow's coordination service under a ``TF_CONFIG`` cluster, ``jax.distributed``'s
coordination service. Both are host-side and callable from any thread, so the engine's
planning thread never issues a device collective that could interleave with the trainer's
own (a framework's collective ops run in the order each process issues them; a second
thread issuing some would race the training step's). Values are text: bytes travel as
base64, cut in pieces of at most ``chunk`` characters.

``dense_rows`` lays one ``StreamMicroBatch`` out as ``Packing.rows`` rows of
``Packing.length`` tokens (``chronica.runtime.rows``: the layout the map-style tf.data and
JAX faces yield), so every micro-batch has one static shape.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.core.packing import Packing
from chronica.runtime.agreement import KeyValueStore
from chronica.runtime.micro import MicroBatch
from chronica.runtime.rows import row_layout
from chronica.runtime.streaming import StreamMicroBatch

__all__ = ["StoreCollectives", "dense_rows"]


class StoreCollectives:
    """The engine's ``Collectives`` over a key-value store shared by ``world_size`` ranks.

    Round ``n`` of either collective writes this rank's values under ``prefix/n/...`` and
    blocks reading the others' (up to ``timeout`` seconds each); a rank deletes its keys of
    round ``n - 2`` when it starts round ``n`` (every rank has read them by then: a rank
    reaches round ``n - 1``'s reads only after its round ``n - 2`` ones). Every rank must
    use the same ``prefix``, and one prefix serves one engine at a time.

    Args:
        store: the ``(set, get, delete)`` calls; ``get(key, timeout_ms)`` blocks until the
            key is set.
        rank: this rank, in ``0 .. world_size - 1``.
        world_size: the ranks, ``>= 1``.
        prefix: the keys' prefix.
        timeout: seconds to wait for another rank's value.
        chunk: the most characters in one stored value, ``>= 1``.

    Example::

        >>> store = {}
        >>> kv = (store.__setitem__, lambda k, ms: store[k], store.pop)
        >>> StoreCollectives(kv, 0, 1).allgather(b"x")
        [b'x']
    """

    def __init__(
        self,
        store: KeyValueStore,
        rank: int,
        world_size: int,
        *,
        prefix: str = "chronica/stream",
        timeout: float = 600.0,
        chunk: int = 1 << 20,
    ) -> None:
        if not (isinstance(store, tuple) and len(store) == 3 and all(map(callable, store))):
            raise TypeError("store must be a (set, get, delete) tuple of callables")
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.world_size = check_int("world_size", world_size, 1)
        self.rank = check_int("rank", rank, 0, self.world_size - 1)
        self._set, self._get, self._delete = store
        self.prefix, self.timeout = prefix, float(timeout)
        self.chunk = check_int("chunk", chunk, 1)
        self._round = 0
        self._written: dict[int, list[str]] = {}

    def __repr__(self) -> str:
        return (
            f"StoreCollectives(rank={self.rank}, world_size={self.world_size}, "
            f"prefix={self.prefix!r})"
        )

    def allgather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""
        n = self._begin()
        self._put(f"{self.prefix}/{n}/{self.rank}", payload, n)
        return [
            payload if r == self.rank else self._take(f"{self.prefix}/{n}/{r}")
            for r in range(self.world_size)
        ]

    def alltoall(self, payloads: list[bytes]) -> list[bytes]:
        """``payloads[r]`` to rank ``r``; what every rank sent this one."""
        if len(payloads) != self.world_size:
            raise ValueError(f"alltoall takes {self.world_size} payloads, got {len(payloads)}")
        n, me = self._begin(), self.rank
        for r, payload in enumerate(payloads):
            if r != me:
                self._put(f"{self.prefix}/{n}/{me}-{r}", payload, n)
        return [
            payloads[me] if r == me else self._take(f"{self.prefix}/{n}/{r}-{me}")
            for r in range(self.world_size)
        ]

    def _begin(self) -> int:
        n = self._round
        self._round += 1
        for key in self._written.pop(n - 2, []):
            self._delete(key)
        return n

    def _put(self, key: str, payload: bytes, n: int) -> None:
        text = base64.b64encode(payload).decode("ascii")
        pieces = [text[i : i + self.chunk] for i in range(0, len(text), self.chunk)]
        keys = [f"{key}/{i}" for i in range(len(pieces))]
        for piece_key, piece in zip(keys, pieces, strict=True):
            self._set(piece_key, piece)
        self._set(key, str(len(pieces)))  # written last: the pieces are there when it is
        self._written.setdefault(n, []).extend([*keys, key])

    def _take(self, key: str) -> bytes:
        ms = int(self.timeout * 1000)
        count = int(self._get(key, ms))
        return base64.b64decode("".join(self._get(f"{key}/{i}", ms) for i in range(count)))


def dense_rows(
    batch: StreamMicroBatch, packing: Packing, key: str = "input_ids", pad_value: int = 0
) -> dict[str, np.ndarray]:
    """One micro-batch as dense rows: ``tokens`` (``int64``) and ``segment_ids``,
    ``positions`` (``int32``), each ``(packing.rows, packing.length)`` as
    ``chronica.runtime.rows`` lays them out (segments ``1, 2, ...`` per row, 0 on padding),
    ``ids`` (``int64``, the samples' global ids then ``-1``: ``rows * length`` entries, one
    static shape), ``lengths`` (their tokens, then 0), ``loss_weight`` (``float32``),
    ``epoch``, ``step``, ``micro``, ``num_micro`` (``int64``). A long sample truncated by
    the packing (``long_documents="truncate"``) keeps its first tokens.

    Args:
        batch: the engine's micro-batch.
        packing: the engine's packing (its ``rows`` and ``length``).
        key: the field holding the tokens when records are mappings.
        pad_value: the token of the padding.

    Example::

        >>> out = dense_rows(batch, Packing(max_tokens=1024, row_length=512))
        >>> out["tokens"].shape
        (2, 512)
    """
    rows, length = packing.rows, packing.length
    count = batch.ids.shape[0]
    if count > rows * length:
        raise ValueError(
            f"a micro-batch of {count} samples does not fit {rows * length} id slots; "
            "empty samples cannot be streamed as dense rows"
        )
    micro = MicroBatch(
        batch.ids, np.zeros(count, np.int64), batch.lengths, batch.rows, batch.loss_weight
    )
    layout = row_layout(micro, rows, length)
    documents = [r[key] if isinstance(r, Mapping) else r for r in batch.records]
    slots = rows * length
    ids = np.full(slots, -1, np.int64)
    ids[:count] = batch.ids
    lengths = np.zeros(slots, np.int64)
    lengths[:count] = batch.lengths
    scalars: dict[str, Any] = {
        "loss_weight": np.float32(batch.loss_weight),
        "epoch": np.int64(batch.epoch),
        "step": np.int64(batch.step),
        "micro": np.int64(batch.micro),
        "num_micro": np.int64(batch.num_micro),
    }
    return {
        "tokens": layout.fill(documents, pad_value, np.int64, key),
        "segment_ids": layout.segment_ids,
        "positions": layout.positions,
        "ids": ids,
        "lengths": lengths,
        **scalars,
    }
