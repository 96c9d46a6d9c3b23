"""chronica.runtime.records: plan indices to padded or packed numpy batches of a
random-access source, read only when a batch needs them."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.runtime.micro import planned_micro_batches
from chronica.runtime.records import (
    Columns,
    PackedBatches,
    PaddedBatches,
    default_boundaries,
    random_access,
    read_lengths,
    record_batches,
    sample_length,
)
from chronica.runtime.stream import LocalBatch


class Counted:
    """A random-access source that counts the records read."""

    def __init__(self, records):
        self.records = records
        self.reads = 0

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        self.reads += 1
        return self.records[i]


def _docs(n=40, seed=0):
    lengths = np.random.default_rng(seed).integers(1, 30, n)
    return [np.arange(k, dtype=np.int64) + 1000 * i for i, k in enumerate(lengths)], lengths


def _batch(indices, weight=1.0, step=0):
    return LocalBatch(0, step, np.array(indices, np.int64), weight)


def test_columns_are_a_sequence_of_per_sample_dicts():
    data = random_access({"tokens": [np.arange(3), np.arange(5)], "label": np.array([4, 5])})
    assert isinstance(data, Columns) and len(data) == 2
    assert data[1]["label"] == 5 and data[1]["tokens"].tolist() == [0, 1, 2, 3, 4]
    assert repr(data) == "Columns(['label', 'tokens'], n=2)"
    docs, _ = _docs()
    assert random_access(docs) is docs


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        (None, ValueError, "source is required"),
        (iter([1, 2]), TypeError, "source of type list_iterator is not random-access"),
        ({}, ValueError, "source is an empty mapping"),
        ({1: [1]}, TypeError, "source column names must be str, got 1"),
        ({"a": 3}, TypeError, "source column 'a' has no len()"),
        ({"mask": [1]}, ValueError, "source column 'mask' clashes with a batch key"),
        ({"a": [1, 2], "b": [1]}, ValueError, "source columns differ in length"),
    ],
)
def test_sources_that_are_not_random_access_are_refused_by_name(source, error, match):
    with pytest.raises(error, match=match):
        random_access(source)


def test_sample_lengths_and_default_boundaries():
    assert sample_length(np.zeros((7, 2))) == 7
    assert sample_length({"tokens": np.arange(7), "label": 3, "mask": np.ones(4)}) == 7
    with pytest.raises(ValueError, match="got a scalar of type int"):
        sample_length(3)
    docs, lengths = _docs()
    np.testing.assert_array_equal(read_lengths(docs), lengths)
    assert default_boundaries(20) == (1, 2, 4, 8, 16, 20)
    assert default_boundaries(16) == (1, 2, 4, 8, 16)
    assert default_boundaries(0) == (1,)


def test_a_padded_batch_holds_its_samples_masks_and_padding_rows():
    docs, lengths = _docs()
    maker = PaddedBatches(docs, rows=4, bucket_boundaries=(8, 16, 32), pad_value=-1)
    batch = maker.make(_batch([3, 0, 7], weight=0.75))
    length = maker.bucket(int(lengths[[3, 0, 7]].max()))
    assert batch["inputs"].shape == (4, length) and length in (8, 16, 32)
    for row, i in enumerate([3, 0, 7]):
        np.testing.assert_array_equal(batch["inputs"][row, : lengths[i]], docs[i])
        assert (batch["inputs"][row, lengths[i] :] == -1).all()
    assert (batch["inputs"][3] == -1).all()
    np.testing.assert_array_equal(batch["lengths"], [*lengths[[3, 0, 7]], 0])
    np.testing.assert_array_equal(batch["mask"].sum(axis=1), batch["lengths"])
    np.testing.assert_array_equal(batch["valid"], [True, True, True, False])
    np.testing.assert_array_equal(batch["indices"], [3, 0, 7, -1])
    assert batch["loss_weight"] == np.float32(0.75)
    assert maker.shapes_seen == {(4, length)}
    assert "rows=4" in repr(maker) and "(8, 16, 32)" in repr(maker)


def test_everyone_pads_every_rank_of_a_step_to_the_steps_longest():
    docs, lengths = _docs()
    maker = PaddedBatches(docs, rows=2)
    longest = int(np.argmax(lengths))
    short = int(np.argmin(lengths))
    alone = maker.make(_batch([short]))
    together = maker.make(_batch([short]), everyone=np.array([short, longest]))
    assert alone["inputs"].shape[1] < together["inputs"].shape[1] == maker.bucket(lengths.max())


def test_variable_batches_take_a_power_of_two_of_rows_unless_same_rows():
    docs, _ = _docs()
    maker = PaddedBatches(docs, rows=16, variable_batch=True)
    assert [maker.batch_rows(k) for k in (0, 1, 3, 5, 16)] == [1, 1, 4, 8, 16]
    assert maker.make(_batch([1, 2, 3]))["inputs"].shape[0] == 4
    same = PaddedBatches(docs, rows=16, variable_batch=True, same_rows=True)
    assert same.batch_rows(3) == 16


def test_records_are_read_only_when_a_batch_needs_them():
    docs, lengths = _docs()
    source = Counted(docs)
    maker = PaddedBatches(source, rows=4)
    assert source.reads == 0
    maker.make(_batch([5, 6]))
    assert source.reads == 2
    np.testing.assert_array_equal(maker.lengths(np.array([5, 9])), lengths[[5, 9]])
    assert source.reads == 3  # sample 5's length was known
    assert maker.bucket_boundaries == tuple(1 << k for k in range(maker.bucket(30).bit_length()))


def test_dict_samples_pad_each_field_and_stack_scalars():
    data = [{"ids": np.arange(k), "label": k} for k in (3, 5)]
    batch = PaddedBatches(data, rows=3).make(_batch([0, 1]))
    assert batch["ids"].shape == (3, 8) and batch["label"].tolist() == [3, 5, 0]
    with pytest.raises(ValueError, match="sample field 'step' clashes with a batch key"):
        PaddedBatches([{"step": np.ones(2)}], rows=1).make(_batch([0]), reserved=("step",))
    ragged = [np.zeros((2, 3)), np.zeros((2, 4))]
    with pytest.raises(ValueError, match="field 'inputs': sample shapes"):
        PaddedBatches(ragged, rows=2).make(_batch([0, 1]))


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(rows=0), ValueError, "rows=0 must be an int >= 1"),
        (dict(rows=2, bucket_boundaries=(8, 4)), ValueError, "strictly increasing"),
        (dict(rows=2, bucket_boundaries="ab"), ValueError, "must be a sequence of positive ints"),
        (
            dict(rows=2, bucket_boundaries=(4,), lengths=np.array([3, 9])),
            ValueError,
            "the longest sample has length 9 > the largest bucket boundary 4; add a boundary",
        ),
    ],
)
def test_bad_padding_arguments_are_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        PaddedBatches([np.arange(3), np.arange(9)], **kw)


def test_a_sample_longer_than_every_bucket_is_named_when_read():
    maker = PaddedBatches([np.arange(3), np.arange(9)], rows=2, bucket_boundaries=(4,))
    with pytest.raises(ValueError, match="sample 1 has length 9 > the largest bucket boundary 4"):
        maker.make(_batch([0, 1]))


PACKING = Packing(64, row_length=32, tokens_per_step=400, long_documents="split")


@pytest.fixture(scope="module")
def packed():
    docs, lengths = _docs(60, seed=3)
    plan = Scheduler(lengths, ScheduleConfig(2, None, packing=PACKING)).plan_epoch(0)
    return docs, plan


def test_packed_micro_batches_hold_each_pieces_tokens_once(packed):
    docs, plan = packed
    source = Counted(docs)
    maker = PackedBatches(source, PACKING, pad_value=-1)
    assert source.reads == 1  # the first record, for dtypes and shapes
    for step in range(plan.num_steps):
        micro = planned_micro_batches(plan, step, 1)
        batch = LocalBatch(0, step, plan.local(step, 1), 1.0, micro)
        for m, part in enumerate(micro):
            out = maker.make(batch, m)
            assert out["tokens"].shape == (2, 32) and out["tokens"].dtype == np.int32
            expected = np.concatenate(
                [
                    docs[d][s : s + n]
                    for d, s, n in zip(part.indices, part.starts, part.lengths, strict=True)
                ]
                or [np.empty(0, np.int64)]
            )
            assert sorted(out["tokens"][out["segment_ids"] > 0].tolist()) == sorted(
                expected.tolist()
            )
            assert (out["tokens"][out["segment_ids"] == 0] == -1).all()
            assert (out["step"], out["micro"], out["num_micro"]) == (step, m, len(micro))
            assert out["loss_weight"] == np.float32(part.loss_weight)
        stacked = maker.step_arrays(batch)
        assert stacked["tokens"].shape == (len(micro), 2, 32)
        assert stacked["loss_weight"].shape == (len(micro),)
        assert (stacked["indices"] >= -1).all() and stacked["num_micro"] == len(micro)
    assert maker.shape == (2, 32) and maker.shapes_seen == {(2, 32)}


def test_packed_dict_records_pack_every_field_per_token():
    records = [{"ids": np.arange(k), "mask": np.ones(k, bool)} for k in (5, 7, 3)]
    lengths = np.array([5, 7, 3])
    plan = Scheduler(lengths, ScheduleConfig(1, 3, packing=Packing(16, row_length=8))).plan_epoch(0)
    maker = PackedBatches(records, Packing(16, row_length=8), token_field="ids")
    batch = LocalBatch(0, 0, plan.local(0, 0), 1.0, planned_micro_batches(plan, 0, 0))
    out = maker.make(batch, 0)
    assert out["mask"].dtype == bool
    np.testing.assert_array_equal(out["mask"], out["segment_ids"] > 0)
    bad = [{"ids": np.arange(5), "mask": np.ones(4, bool)}] * 3
    with pytest.raises(ValueError, match=r"field 'mask' of record \d has 4 entries but 5 tokens"):
        PackedBatches(bad, Packing(16, row_length=8), token_field="ids").make(batch, 0)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([], 256), TypeError, "packing=256 must be a chronica.core.packing.Packing"),
        (([], PACKING, 3), TypeError, "token_field=3 must be a str"),
    ],
)
def test_bad_packing_arguments_are_refused_by_name(args, error, match):
    with pytest.raises(error, match=match):
        PackedBatches(*args)


def test_record_batches_read_sizes_only_when_the_plan_needs_them():
    docs, lengths = _docs()
    source = Counted(docs)
    maker, sizes = record_batches(source, None, ScheduleConfig(2, 8))
    assert isinstance(maker, PaddedBatches) and maker.rows == 4
    np.testing.assert_array_equal(sizes, lengths)
    assert source.reads == len(docs)  # the lengths, read once
    given = Counted(docs)
    _, sizes = record_batches(given, lengths * 2, ScheduleConfig(2, 8, kind="dynamic"))
    assert given.reads == 0
    packed = Counted(docs)
    maker, sizes = record_batches(packed, None, ScheduleConfig(2, None, packing=PACKING))
    assert isinstance(maker, PackedBatches)
    np.testing.assert_array_equal(sizes, lengths)
    with pytest.raises(ValueError, match="bucket_boundaries= pads unpacked batches"):
        record_batches(docs, None, ScheduleConfig(2, None, packing=PACKING), bucket_boundaries=(8,))
