"""chronica.jax.iterator with packing=: packed dense rows (tokens, segment_ids, positions),
every token of every document exactly once per epoch over the ranks, equal micro-batch
counts, caps, loss normalisation, token budgets, split documents, micro-batch-exact
resume, elastic resume at another world, one compiled shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
from packed_rows import CODE, check_epoch, documents, every_token, tokens_of

jax = pytest.importorskip("jax")

import chronica.jax as cj  # noqa: E402
from chronica.core.packing import Packing  # noqa: E402
from chronica.runtime import MicroBatch  # noqa: E402
from chronica.runtime.rows import row_layout  # noqa: E402

WORLD = 2


PACKING = Packing(max_tokens=1024, row_length=256)


def run(docs, lengths, packing=PACKING, world=WORLD, batch=32, **kwargs) -> list[list[dict]]:
    """Every rank's micro-batches of one epoch."""
    return [
        list(
            cj.iterator(
                docs,
                lengths,
                global_batch_size=batch,
                num_replicas=world,
                rank=rank,
                packing=packing,
                **kwargs,
            )
        )
        for rank in range(world)
    ]


def test_every_token_once_equal_micro_counts_caps_and_loss_weights():
    docs, lengths = documents()
    ranks = run(docs, lengths)
    check_epoch(ranks, lengths, PACKING)
    it = cj.iterator(docs, lengths, global_batch_size=32, num_replicas=2, rank=1, packing=PACKING)
    plan = it.plan()
    assert len(it) == len(ranks[1]) == int(plan.micro.num_micro.sum())
    assert it.num_shapes == 1
    # The micro-batches are the plan's.
    for b in ranks[1]:
        j = plan.micro.index(b["step"], 1, b["micro"])
        span = slice(plan.micro.bounds[j], plan.micro.bounds[j + 1])
        assert b["indices"].tolist() == plan.indices[span].tolist()
        assert b["loss_weight"] == np.float32(plan.micro.weights[j])


def test_token_budget_and_split_long_documents():
    docs, lengths = documents(200, seed=1, longest=1500)
    assert (lengths > 256).any()
    budget = Packing(max_tokens=1024, row_length=256, tokens_per_step=6000, long_documents="split")
    ranks = [
        list(cj.iterator(docs, lengths, num_replicas=2, rank=r, packing=budget, shuffle=False))
        for r in range(2)
    ]
    check_epoch(ranks, lengths, budget)
    # A split document's pieces restart their positions (checked in tokens_of) and together
    # cover it once (checked in check_epoch).
    split = Packing(max_tokens=512, row_length=128, long_documents="split", loss="sample")
    docs, lengths = documents(120, seed=2, longest=700)
    ranks = run(docs, lengths, split, batch=16)
    codes = np.concatenate([tokens_of(b) for batches in ranks for b in batches])
    assert np.sort(codes).tolist() == sorted(
        i * CODE + t for i, k in enumerate(lengths) for t in range(k)
    )


def test_sizes_given_are_not_read_from_the_records():
    docs, lengths = documents(100)

    class Counting(list):
        reads = 0

        def __getitem__(self, i):
            Counting.reads += 1
            return list.__getitem__(self, i)

    source = Counting(docs)
    it = cj.iterator(source, lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING)
    assert Counting.reads <= 1  # the first record, for the fields' dtypes and shapes
    before = Counting.reads
    batch = next(it)
    assert Counting.reads - before == batch["indices"].shape[0]
    # Without sizes the records' token lengths are read once, and give the same plan.
    again = cj.iterator(docs, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING)
    assert (again.plan().indices == it.plan().indices).all()


def test_dict_records_pack_every_field_and_refuse_scalars():
    docs, lengths = documents(80)
    records = [{"ids": d.astype(np.int64), "targets": d + 1} for d in docs]
    it = cj.iterator(
        records,
        lengths,
        global_batch_size=16,
        num_replicas=2,
        rank=0,
        packing=PACKING,
        token_field="ids",
        pad_value=-1,
    )
    for b in it:
        assert b["tokens"].dtype == np.int32 and b["targets"].dtype == np.int32
        real = b["segment_ids"] > 0
        assert (b["targets"][real] == b["tokens"][real] + 1).all()
        assert (b["tokens"][~real] == -1).all()
    with pytest.raises(ValueError, match="token_field='tokens' is not a field"):
        cj.iterator(records, lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING)
    labelled = [{"tokens": d, "label": 1} for d in docs]
    with pytest.raises(ValueError, match="'label' is a scalar"):
        cj.iterator(
            labelled, lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING
        )
    with pytest.raises(ValueError, match="bucket_boundaries"):
        cj.iterator(
            docs,
            lengths,
            global_batch_size=16,
            num_replicas=2,
            rank=0,
            packing=PACKING,
            bucket_boundaries=(64,),
        )
    bad = cj.iterator(
        docs, lengths + 5, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING
    )
    with pytest.raises(ValueError, match="sizes must be the documents' lengths"):
        list(bad)
    ragged = [{"tokens": d, "targets": d[:-1]} for d in docs]
    bad = cj.iterator(
        ragged, lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING
    )
    with pytest.raises(ValueError, match=r"field 'targets' of record .* as long as the tokens"):
        next(bad)


def test_mid_step_resume_in_a_fresh_iterator_equals_the_uninterrupted_run():
    docs, lengths = documents(200, longest=120)
    packing = Packing(max_tokens=512, row_length=128, micro_batches=3)
    kwargs = {"global_batch_size": 32, "num_replicas": 2, "rank": 1, "epochs": 2, "seed": 3}
    full = list(cj.iterator(docs, lengths, packing=packing, **kwargs))
    key = [(b["step"], b["micro"], b["tokens"].tobytes()) for b in full]
    mid = next(i for i, b in enumerate(full) if b["micro"] == 1)  # inside a step
    for cut in (0, mid, mid + 1, len(full) // 2 + 1, len(full) - 1, len(full)):
        first = cj.iterator(docs, lengths, packing=packing, **kwargs)
        head = [next(first) for _ in range(cut)]
        state = json.loads(json.dumps(first.get_state()))
        if cut == mid:
            assert state["offset"] == 1
        resumed = cj.iterator(docs, lengths, packing=packing, **kwargs)
        resumed.set_state(state)
        rest = list(resumed)
        got = [(b["step"], b["micro"], b["tokens"].tobytes()) for b in head + rest]
        assert got == key


@pytest.mark.parametrize("mid_step", [False, True])
def test_elastic_resume_from_four_ranks_to_two_covers_every_token_once(mid_step):
    docs, lengths = documents(240, seed=4, longest=120)
    packing = Packing(max_tokens=512, row_length=128, micro_batches=2)
    old = [
        cj.iterator(docs, lengths, global_batch_size=32, num_replicas=4, rank=r, packing=packing)
        for r in range(4)
    ]
    plan = old[0].plan()
    steps = plan.num_steps // 2
    count = int(plan.micro.num_micro[:steps].sum())
    trained = []
    for it in old:
        for _ in range(count):
            trained.append(tokens_of(next(it)))
        if mid_step:
            next(it)  # a partly yielded step does not count as trained at another world
    state = json.loads(json.dumps(old[0].get_state()))
    assert state["step"] == steps and state["offset"] == (1 if mid_step else 0)
    rest = []
    counts = []
    for r in range(2):
        it = cj.iterator(
            docs, lengths, global_batch_size=32, num_replicas=2, rank=r, packing=packing
        )
        it.set_state(state)
        batches = list(it)
        counts.append([(b["step"], b["num_micro"]) for b in batches])
        rest += [tokens_of(b) for b in batches]
    assert counts[0] == counts[1]
    codes = np.sort(np.concatenate(trained + rest))
    expected = every_token(lengths)
    assert (codes == expected).all()


def test_a_jitted_step_compiles_once_for_every_micro_batch():
    docs, lengths = documents(200)
    packing = Packing(max_tokens=1024, row_length=256, micro_batches=2)  # some are empty
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    for as_jax, placed in ((False, None), (True, None), (True, sharding)):
        traces = []

        @jax.jit
        def loss(tokens, segment_ids, positions, weight, traces=traces):
            traces.append(tokens.shape)
            real = (segment_ids > 0).astype(jax.numpy.float32)
            per_token = jax.numpy.sin(tokens.astype(jax.numpy.float32)) + 0.0 * positions
            return weight * (per_token * real).sum() / jax.numpy.maximum(real.sum(), 1.0)

        it = cj.iterator(
            docs,
            lengths,
            global_batch_size=32,
            num_replicas=2,
            rank=0,
            packing=packing,
            epochs=2,
            as_jax=as_jax,
            sharding=placed,
        )
        count = 0
        for b in it:
            if as_jax:
                assert isinstance(b["tokens"], jax.Array)
                assert isinstance(b["indices"], np.ndarray)
            if placed is not None:
                assert b["tokens"].sharding == sharding
            value = loss(b["tokens"], b["segment_ids"], b["positions"], b["loss_weight"])
            assert np.isfinite(float(value))
            count += 1
        assert count > 10 and it.shapes_seen == {(4, 256)} and it.num_shapes == 1
        assert len(traces) == 1


def test_rows_layout_matches_the_shared_runtime_layout():
    docs, lengths = documents(60)
    it = cj.iterator(
        docs, lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING, pad_value=7
    )
    plan = it.plan()
    for b in it:
        j = plan.micro.index(b["step"], 0, b["micro"])
        span = slice(plan.micro.bounds[j], plan.micro.bounds[j + 1])
        layout = row_layout(
            MicroBatch(
                plan.indices[span],
                plan.micro.starts[span],
                plan.micro.lengths[span],
                plan.micro.rows[span],
                float(plan.micro.weights[j]),
            ),
            PACKING.rows,
            PACKING.length,
        )
        assert (layout.segment_ids == b["segment_ids"]).all()
        assert (layout.positions == b["positions"]).all()
        expected = layout.fill([docs[i] for i in plan.indices[span]], 7, np.int32)
        assert (expected == b["tokens"]).all()
