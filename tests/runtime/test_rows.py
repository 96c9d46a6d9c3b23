"""chronica.runtime.rows: a micro-batch's entries laid out as dense rows, against a
hand-written layout and a per-token loop, and the field checks the packed faces share."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.runtime.micro import MicroBatch
from chronica.runtime.rows import (
    PACKED_KEYS,
    check_document_lengths,
    check_field_lengths,
    packed_dtype,
    packed_names,
    row_layout,
)


def _micro(docs, starts, lengths, rows):
    a = [np.array(x, np.int64) for x in (docs, starts, lengths, rows)]
    return MicroBatch(*a, 1.0)


# Document d is 100 * d + 0, 1, 2, ...: every token says where it came from.
DOCS = [np.arange(10) + 100 * d for d in range(5)]
MICRO = _micro(docs=[2, 0, 4, 1], starts=[0, 3, 2, 0], lengths=[3, 2, 4, 0], rows=[0, 0, 1, 1])


def test_a_layout_fills_rows_in_the_entries_order_from_column_0():
    layout = row_layout(MICRO, rows=2, row_length=6)
    np.testing.assert_array_equal(
        layout.segment_ids, [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]]
    )  # the empty entry takes no segment
    np.testing.assert_array_equal(layout.positions, [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    np.testing.assert_array_equal(layout.slots, [0, 1, 2, 3, 4, 6, 7, 8, 9])
    assert layout.num_tokens == 9
    np.testing.assert_array_equal(layout.mask, layout.segment_ids > 0)
    tokens = layout.fill([DOCS[d] for d in MICRO.indices], pad_value=-1)
    np.testing.assert_array_equal(tokens, [[200, 201, 202, 3, 4, -1], [402, 403, 404, 405, -1, -1]])
    assert not layout.slots.flags.writeable


def test_token_index_points_into_the_concatenated_documents():
    layout = row_layout(MICRO, rows=2, row_length=6)
    flat = np.concatenate(DOCS)
    splits = np.arange(0, 51, 10)
    index = layout.token_index(splits)
    tokens = layout.fill([DOCS[d] for d in MICRO.indices], pad_value=-1)
    np.testing.assert_array_equal(np.where(index >= 0, flat[index], -1), tokens)


@pytest.mark.parametrize("seed", range(5))
def test_random_micro_batches_against_a_token_loop(seed):
    rng = np.random.default_rng(seed)
    rows, row_length = 3, 16
    entries = []
    for r in range(rows):
        room = row_length
        while room and rng.random() < 0.8:
            length = int(rng.integers(0, room + 1))
            entries.append(
                (
                    int(rng.integers(0, 5)),
                    int(rng.integers(0, 10 - min(length, 10) + 1)),
                    min(length, 10),
                    r,
                )
            )
            room -= min(length, 10)
    rng.shuffle(entries)
    micro = _micro(*zip(*entries, strict=True)) if entries else _micro([], [], [], [])
    layout = row_layout(micro, rows, row_length)
    expected = np.full((rows, row_length), -1)
    column = [0] * rows
    for doc, start, length, r in entries:
        for t in range(length):
            expected[r, column[r]] = DOCS[doc][start + t]
            column[r] += 1
    got = layout.fill([DOCS[d] for d in micro.indices], pad_value=-1, dtype=np.int64)
    np.testing.assert_array_equal(got, expected)


def test_trailing_axes_and_dtypes_are_kept():
    micro = _micro([0, 1], [0, 1], [2, 2], [0, 0])
    docs = [np.ones((4, 3), np.float32), np.full((4, 3), 2, np.float32)]
    out = row_layout(micro, 1, 5).fill(docs, pad_value=0)
    assert out.shape == (1, 5, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0, :, 0], [1, 1, 2, 2, 0])
    empty = row_layout(_micro([], [], [], []), 2, 4).fill([], 0, np.int32, trailing=(3,))
    assert empty.shape == (2, 4, 3) and empty.dtype == np.int32 and not empty.any()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: row_layout(_micro([0], [0], [2], [2]), 2, 6), "row 2, outside 2 rows"),
        (lambda: row_layout(_micro([0, 1], [0, 0], [4, 3], [0, 0]), 2, 6), "holds 7 tokens"),
        (lambda: row_layout(MICRO, 0, 6), "rows=0 must be an int >= 1"),
        (lambda: row_layout(MICRO, 2, 6).fill(DOCS[:2]), "got 2 documents for a micro-batch of 4"),
        (
            lambda: row_layout(_micro([0], [8], [3], [0]), 1, 6).fill([DOCS[0]], field="ids"),
            "document 0 has 10 ids but its size says at least 11",
        ),
        (
            lambda: row_layout(_micro([0], [0], [1], [0]), 1, 6).fill([np.int64(3)]),
            "document 0 is a scalar",
        ),
        (
            lambda: row_layout(_micro([0, 1], [0, 0], [1, 1], [0, 0]), 1, 6).fill(
                [np.zeros((2, 3)), np.zeros((2, 4))]
            ),
            "documents differ beyond their first",
        ),
        (
            lambda: row_layout(_micro([0], [8], [3], [0]), 1, 6).token_index(np.arange(0, 51, 10)),
            "document 0 has 10 tokens but its size says at least 11",
        ),
    ],
)
def test_what_cannot_be_laid_out_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_packed_names_map_the_token_field_and_refuse_clashes():
    assert packed_names(None, "ids") == {"ids": "tokens"}
    assert packed_names(["ids", "loss_mask"], "ids") == {"ids": "tokens", "loss_mask": "loss_mask"}
    with pytest.raises(ValueError, match="token_field='ids' is not a field of the records"):
        packed_names(["text"], "ids")
    for clash in ("tokens", *PACKED_KEYS, "indices"):
        with pytest.raises(ValueError, match=f"field '{clash}' clashes with a key"):
            packed_names(["ids", clash], "ids", reserved=("indices",))


def test_packed_dtypes():
    assert packed_dtype("tokens", "ids", np.int64, 1) == np.int32
    assert packed_dtype("mask", "mask", np.bool_, 1) == np.bool_
    with pytest.raises(ValueError, match="field 'label' is a scalar"):
        packed_dtype("label", "label", np.int64, 0)
    with pytest.raises(ValueError, match="have dtype float32; packed tokens are int32 ids"):
        packed_dtype("tokens", "ids", np.float32, 1)


def test_field_and_document_length_checks_name_the_record():
    check_field_lengths("mask", [3, 4], [3, 4], "ids")
    with pytest.raises(ValueError, match="field 'mask' of record 7 has 4 entries but 5 tokens"):
        check_field_lengths("mask", [3, 4], [3, 5], "ids", documents=[6, 7])
    check_document_lengths(np.array([5, 4]), np.array([5, 4]))
    with pytest.raises(ValueError, match="document 1 has 3 tokens but its size says at least 4"):
        check_document_lengths(np.array([5, 3]), np.array([5, 4]))
