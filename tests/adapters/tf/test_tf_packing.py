"""chronica.tf.schedule with packing=: packed dense rows (tokens, segment_ids, positions),
every token of every document exactly once per epoch over the ranks, equal micro-batch
counts, caps, loss normalisation, token budgets, split documents, the shared row layout,
micro-batch-exact resume from a delivered element, replicas served interleaved, elastic
resume at another world."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from packed_rows import check_epoch, documents, every_token, tokens_of

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import chronica.tf  # noqa: E402
from chronica.core.packing import Packing  # noqa: E402
from chronica.runtime import MicroBatch  # noqa: E402
from chronica.runtime.rows import row_layout  # noqa: E402

PACKING = Packing(max_tokens=1024, row_length=256)


def dataset(docs: list, fields: bool = False) -> tf.data.Dataset:
    """The documents as 1-D token examples, or dicts ``{"ids", "targets"}`` (``fields``)."""
    lengths = np.array([d.shape[0] for d in docs], dtype=np.int64)
    tokens = tf.RaggedTensor.from_row_lengths(np.concatenate(docs), lengths)
    if not fields:
        return tf.data.Dataset.from_tensor_slices(tokens).map(lambda t: t)
    ds = tf.data.Dataset.from_tensor_slices({"ids": tokens, "targets": tokens + 1})
    return ds.map(lambda e: {"ids": e["ids"], "targets": e["targets"]})


def numpy(element: dict) -> dict:
    return {k: v.numpy() for k, v in element.items()}


def run(docs, lengths, packing=PACKING, world=2, batch=32, **kwargs) -> list[list[dict]]:
    """Every rank's micro-batches of one epoch (numpy)."""
    out = []
    for rank in range(world):
        t = chronica.tf.schedule(
            lengths,
            global_batch_size=batch,
            num_replicas=world,
            rank=rank,
            packing=packing,
            **kwargs,
        )
        out.append([numpy(e) for e in dataset(docs).apply(t)])
    return out


def test_every_token_once_equal_micro_counts_caps_loss_weights_and_the_plan():
    docs, lengths = documents()
    ranks = run(docs, lengths)
    check_epoch(ranks, lengths, PACKING)
    t = chronica.tf.schedule(lengths, global_batch_size=32, num_replicas=2, rank=1, packing=PACKING)
    out = dataset(docs).apply(t)
    for key in ("tokens", "segment_ids", "positions"):
        assert out.element_spec[key].shape == (4, 256)
        assert out.element_spec[key].dtype == tf.int32
    # Micro-batch m of step s is the plan's, laid out by the shared row layout.
    plan = t.plan()
    for b in ranks[1]:
        j = plan.micro.index(int(b["step"]), 1, int(b["micro"]))
        span = slice(plan.micro.bounds[j], plan.micro.bounds[j + 1])
        micro = MicroBatch(
            plan.indices[span],
            plan.micro.starts[span],
            plan.micro.lengths[span],
            plan.micro.rows[span],
            float(plan.micro.weights[j]),
        )
        layout = row_layout(micro, PACKING.rows, PACKING.length)
        assert (layout.fill([docs[i] for i in micro.indices], 0, np.int32) == b["tokens"]).all()
        assert (layout.segment_ids == b["segment_ids"]).all()
        assert (layout.positions == b["positions"]).all()
        assert b["loss_weight"] == np.float32(plan.micro.weights[j])


def test_token_budget_and_split_long_documents():
    docs, lengths = documents(200, seed=1, longest=1500)
    assert (lengths > 256).any()
    budget = Packing(max_tokens=1024, row_length=256, tokens_per_step=6000, long_documents="split")
    ranks = []
    for rank in range(2):
        t = chronica.tf.schedule(lengths, num_replicas=2, rank=rank, packing=budget, shuffle=False)
        ranks.append([numpy(e) for e in dataset(docs).apply(t)])
    check_epoch(ranks, lengths, budget)
    split = Packing(max_tokens=512, row_length=128, long_documents="split", loss="sample")
    docs, lengths = documents(120, seed=2, longest=700)
    ranks = run(docs, lengths, split, batch=16)
    codes = np.concatenate([tokens_of(b) for batches in ranks for b in batches])
    assert (np.sort(codes) == every_token(lengths)).all()


def test_dict_examples_pack_every_feature_and_bad_inputs_are_refused():
    docs, lengths = documents(80)
    t = chronica.tf.schedule(
        lengths, global_batch_size=16, num_replicas=2, rank=0, packing=PACKING, token_field="ids"
    )
    out = dataset(docs, fields=True).apply(t)
    assert set(out.element_spec) >= {"tokens", "targets", "segment_ids", "positions"}
    for b in map(numpy, out):
        real = b["segment_ids"] > 0
        assert (b["targets"][real] == b["tokens"][real] + 1).all()
        assert (b["targets"][~real] == 0).all()
    # size_fn gives the lengths too.
    t = chronica.tf.schedule(
        size_fn=lambda e: len(e["ids"]),
        global_batch_size=16,
        num_replicas=2,
        rank=0,
        packing=PACKING,
        token_field="ids",
    )
    assert len(list(dataset(docs, fields=True).apply(t))) == t.plan().micro.num_micro.sum()
    kw = dict(global_batch_size=16, num_replicas=2, rank=0, packing=PACKING)
    with pytest.raises(ValueError, match="token_field='tokens' is not a field"):
        dataset(docs, fields=True).apply(chronica.tf.schedule(lengths, **kw))
    labelled = dataset(docs).map(lambda x: {"tokens": x, "label": tf.size(x)})
    with pytest.raises(ValueError, match="'label' is a scalar"):
        labelled.apply(chronica.tf.schedule(lengths, **kw))
    with pytest.raises(ValueError, match="sizes must be the documents' lengths"):
        dataset(docs).apply(chronica.tf.schedule(lengths + 1, **kw))
    ragged = dataset(docs).map(lambda x: {"tokens": x, "targets": x[1:]})
    with pytest.raises(ValueError, match=r"field 'targets' of record 0 .* as long as the tokens"):
        ragged.apply(chronica.tf.schedule(lengths, **kw))
    with pytest.raises(ValueError, match="padded=False"):
        chronica.tf.schedule(lengths, padded=False, **kw)
    with pytest.raises(ValueError, match="global_batch_size"):
        chronica.tf.schedule(lengths, num_replicas=2, rank=0, packing=PACKING)


def _take(ds: tf.data.Dataset, count: int) -> list[dict]:
    out = []
    for e in ds:
        if len(out) == count:
            break
        out.append(e)
    return out


def test_mid_step_resume_from_a_delivered_micro_batch_equals_the_uninterrupted_run():
    docs, lengths = documents(200, longest=120)
    packing = Packing(max_tokens=512, row_length=128, micro_batches=3)
    kw = dict(global_batch_size=32, num_replicas=2, rank=1, epochs=2, seed=3, packing=packing)
    full = [numpy(e) for e in dataset(docs).apply(chronica.tf.schedule(lengths, **kw))]
    key = [(int(b["epoch"]), int(b["step"]), int(b["micro"]), b["tokens"].tobytes()) for b in full]
    mid = next(i for i, b in enumerate(full) if b["micro"] == 1)
    last_of_epoch = next(i for i, b in enumerate(full) if b["epoch"] == 1) - 1
    for cut in (mid, mid + 1, last_of_epoch + 1, len(full) - 1):
        t = chronica.tf.schedule(lengths, **kw)
        taken = _take(dataset(docs).apply(t), cut)
        state = json.loads(json.dumps(t.get_state(delivered=taken[-1])))
        if cut == mid:
            assert (state["step"], state["offset"]) == (int(full[mid - 1]["step"]), 1)
        fresh = chronica.tf.schedule(lengths, **kw)
        fresh.set_state(state)
        rest = [numpy(e) for e in dataset(docs).apply(fresh)]
        got = [
            (int(b["epoch"]), int(b["step"]), int(b["micro"]), b["tokens"].tobytes()) for b in rest
        ]
        assert got == key[cut:]


def test_a_pipeline_serving_two_replicas_interleaves_their_micro_batches():
    docs, lengths = documents(100)
    single = run(docs, lengths, batch=16)
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    t = chronica.tf.schedule(lengths, global_batch_size=16, packing=PACKING, input_context=context)
    both = [numpy(e) for e in dataset(docs).apply(t)]
    expected = [b for pair in zip(*single, strict=True) for b in pair]
    assert len(both) == len(expected)
    for got, want in zip(both, expected, strict=True):
        assert (got["tokens"] == want["tokens"]).all() and got["micro"] == want["micro"]


def test_elastic_resume_from_four_replicas_to_two_covers_every_token_once():
    docs, lengths = documents(240, seed=4, longest=120)
    packing = Packing(max_tokens=512, row_length=128)
    ds = dataset(docs)
    trained, states = [], []
    for rank in range(4):
        t = chronica.tf.schedule(
            lengths, global_batch_size=32, num_replicas=4, rank=rank, packing=packing
        )
        out = ds.apply(t)
        steps = t.plan().num_steps // 2
        count = int(t.plan().micro.num_micro[:steps].sum())
        taken = [numpy(e) for e in _take(out, count)]
        trained += [tokens_of(b) for b in taken]
        states.append(t.get_state(delivered=taken[-1]))
    assert all(s == states[0] for s in states) and states[0]["offset"] == 0
    rest = []
    for rank in range(2):
        t = chronica.tf.schedule(
            lengths, global_batch_size=32, num_replicas=2, rank=rank, packing=packing
        )
        t.set_state(states[0])
        rest += [tokens_of(numpy(e)) for e in ds.apply(t)]
    assert (np.sort(np.concatenate(trained + rest)) == every_token(lengths)).all()
