"""``chronica.core.packing.documents``: documents as the pieces they are trained as, by
``long_documents`` rule, and the refusals that name the fix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing import (
    Packing,
    Pieces,
    pieces,
)

# --- pieces ---------------------------------------------------------------------------------


def test_a_long_document_is_an_error_naming_it_and_the_fix():
    with pytest.raises(ValueError) as error:
        pieces(np.array([3, 8, 9, 12]), Packing(max_tokens=8))
    message = str(error.value)
    assert "document 2 has 9 tokens" in message
    assert "row_length=8" in message
    assert "long_documents='split'" in message and "'truncate'" in message


@pytest.mark.parametrize("sizes", [[1.0, 2.5], [3, float("nan")], [np.float32(0.5)]])
def test_sizes_that_are_not_whole_numbers_are_refused(sizes):
    sizes = np.asarray(sizes)
    bad = int(np.flatnonzero(np.floor(sizes) != sizes)[0])
    with pytest.raises(ValueError, match=rf"sizes\[{bad}\] is .*whole numbers"):
        pieces(sizes, Packing(max_tokens=8, long_documents="split"))


def _check_pieces(sizes, table: Pieces, limit: int, mode: str) -> None:
    n = len(sizes)
    assert table.first.shape == (n + 1,)
    assert table.first[0] == 0 and table.first[-1] == table.doc.shape[0]
    assert np.all(np.diff(table.first) >= 1)
    for array in (table.doc, table.start, table.length, table.first):
        assert array.dtype == np.int64
        assert not array.flags.writeable
    for d, size in enumerate(sizes):
        span = slice(table.first[d], table.first[d + 1])
        assert (table.doc[span] == d).all()
        starts, lengths = table.start[span], table.length[span]
        assert (lengths <= limit).all() and (lengths >= 0).all()
        if mode == "split":
            # Every token exactly once, in order: pieces abut from token 0 to the end.
            assert starts[0] == 0
            assert np.array_equal(starts[1:], starts[:-1] + lengths[:-1])
            assert starts[-1] + lengths[-1] == size
            assert (lengths[:-1] == limit).all()
            assert size == 0 or (lengths > 0).all()
        else:
            assert starts.tolist() == [0]
            assert lengths.tolist() == [min(size, limit)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    limit=st.integers(1, 12),
    mode=st.sampled_from(["split", "truncate", "error"]),
    as_float=st.booleans(),
)
def test_pieces_cover_documents_by_mode(sizes, limit, mode, as_float):
    packing = Packing(max_tokens=2 * limit, row_length=limit, long_documents=mode)
    array = np.array(sizes, dtype=np.float64 if as_float else np.int64)
    if mode == "error" and any(s > limit for s in sizes):
        first = next(d for d, s in enumerate(sizes) if s > limit)
        with pytest.raises(ValueError, match=rf"document {first} has"):
            pieces(array, packing)
        return
    table = pieces(array, packing)
    _check_pieces(sizes, table, limit, "split" if mode == "split" else "truncate")
    # Truncation keeps each document's first row_length tokens.
    if mode == "truncate":
        assert table.length.tolist() == [min(s, limit) for s in sizes]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=20),
    data=st.data(),
)
def test_pieces_of_lists_the_pieces_of_documents_in_the_given_order(sizes, data):
    table = pieces(np.array(sizes), Packing(max_tokens=7, long_documents="split"))
    docs = data.draw(st.lists(st.integers(0, len(sizes) - 1), max_size=25))
    docs = np.array(docs, dtype=np.int64)
    expect = [p for d in docs for p in range(table.first[d], table.first[d + 1])]
    got = table.of(docs)
    assert got.tolist() == expect
    assert (table.doc[got] == np.repeat(docs, np.diff(table.first)[docs])).all()
