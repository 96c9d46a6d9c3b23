"""The static-shape streaming faces' shared parts: collectives over a key-value store (real
threads, one store) and a micro-batch as dense rows."""

import threading

import numpy as np
import pytest
from stream_source import make_engine, make_source, run_ranks

from chronica.core.packing import Packing
from chronica.runtime.streaming_exchange import Collectives
from chronica.runtime.streaming_faces import StoreCollectives, dense_rows


class ThreadStore:
    """A blocking in-memory key-value store, as a coordination service's client is."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            assert key not in self.values, f"{key} written twice"
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key, timeout_ms):
        with self.changed:
            assert self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000)
            return self.values[key]

    def delete(self, key):
        with self.changed:
            del self.values[key]

    def calls(self):
        return self.set, self.get, self.delete


def test_store_collectives_gather_exchange_in_rank_order_and_clean_up():
    world, rounds, store = 3, 6, ThreadStore()
    out = [[] for _ in range(world)]

    def run(r):
        ranks = StoreCollectives(store.calls(), r, world, timeout=60, chunk=5)
        assert isinstance(ranks, Collectives)
        for n in range(rounds):
            out[r].append(ranks.allgather(bytes([r, n]) * (r + 1)))
            out[r].append(ranks.alltoall([bytes([r, d, n]) * d for d in range(world)]))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(world):
        for n in range(rounds):
            assert out[r][2 * n] == [bytes([q, n]) * (q + 1) for q in range(world)]
            assert out[r][2 * n + 1] == [bytes([q, r, n]) * r for q in range(world)]
    # Only the last two rounds (of 12) are left in the store.
    assert {key.split("/")[2] for key in store.values} == {"10", "11"}


def test_store_collectives_reject_bad_arguments_by_name():
    kv = ThreadStore().calls()
    with pytest.raises(TypeError, match="store"):
        StoreCollectives({}, 0, 1)
    with pytest.raises(ValueError, match="rank"):
        StoreCollectives(kv, 2, 2)
    with pytest.raises(ValueError, match="timeout"):
        StoreCollectives(kv, 0, 1, timeout=0)
    with pytest.raises(ValueError, match="payloads"):
        StoreCollectives(kv, 0, 2).alltoall([b""])
    assert "world_size=2" in repr(StoreCollectives(kv, 1, 2))


def test_dense_rows_hold_every_sample_in_its_planned_row():
    packing = Packing(max_tokens=1024, row_length=512, long_documents="truncate")
    batches, _, _ = run_ranks(make_source(high=700), 1, packing, batch_size=8, window_steps=2)
    assert batches[0]
    for batch in batches[0]:
        out = dense_rows(batch, packing)
        assert out["tokens"].shape == out["segment_ids"].shape == (2, 512)
        count = batch.ids.shape[0]
        assert out["ids"][:count].tolist() == batch.ids.tolist()
        assert (out["ids"][count:] == -1).all() and out["ids"].shape == (1024,)
        assert int(out["lengths"].sum()) == int((out["segment_ids"] > 0).sum())
        # The list source's tokens are their sample's id: every sample sits, whole, in its row.
        for i, n, row in zip(batch.ids, batch.lengths, batch.rows, strict=True):
            real = out["segment_ids"][row] > 0
            assert int(((out["tokens"][row] == i) & real).sum()) == n
        assert out["step"] == batch.step and out["num_micro"] == batch.num_micro
        assert out["loss_weight"] == np.float32(batch.loss_weight)


def test_engine_batches_reach_dense_rows_through_store_collectives():
    store, packing = ThreadStore(), Packing(max_tokens=1024, row_length=512)
    source, seen = make_source(random_access=False), [[], []]

    def run(r):
        ranks = StoreCollectives(store.calls(), r, 2, timeout=60)
        engine = make_engine(source, packing, ranks, batch_size=12, buffer_size=6)
        seen[r] = [dense_rows(b, packing) for b in engine.micro_batches()]

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen[0]) == len(seen[1]) > 0
    ids = [i for rank in seen for b in rank for i in b["ids"].tolist() if i >= 0]
    assert sorted(ids) == list(range(source.offsets[-1]))
