"""``chronica.core.packing.context_parallel``: every token of every document on exactly one
rank of the group, a sharded document's head-tail chunks reassembling to the document, equal
causal attention work per rank for sharded documents, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing.context_parallel import causal_work, context_layout, restore_order


@st.composite
def micro_batches(draw):
    size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n = draw(st.integers(0, 12))
    sharded = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lengths = [
        2 * size * draw(st.integers(1, 6)) if s else draw(st.integers(0, 40)) for s in sharded
    ]
    owner = draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n))
    return lengths, sharded, owner, size


@settings(max_examples=200, deadline=None)
@given(case=micro_batches())
def test_every_token_once_and_the_order_restored(case):
    lengths, sharded, owner, size = case
    shards = context_layout(lengths, sharded=sharded, owner=owner, size=size)
    assert len(shards) == size
    total = int(np.sum(lengths))
    held = np.concatenate([s.tokens for s in shards])
    assert sorted(held.tolist()) == list(range(total))
    np.testing.assert_array_equal(held[restore_order(shards)], np.arange(total))
    doc = np.repeat(np.arange(len(lengths)), lengths).astype(np.int64)
    pos = np.concatenate([np.arange(n) for n in lengths]) if lengths else np.zeros(0, int)
    for c, shard in enumerate(shards):
        np.testing.assert_array_equal(shard.documents, doc[shard.tokens])
        np.testing.assert_array_equal(shard.position_ids, pos[shard.tokens])
        # Segments: consecutive runs of one document, contiguous positions within each.
        bounds = shard.cu_seqlens
        assert bounds[0] == 0 and bounds[-1] == shard.tokens.size
        for s in range(bounds.size - 1):
            span = slice(bounds[s], bounds[s + 1])
            assert (shard.documents[span] == shard.segment_documents[s]).all()
            assert (np.diff(shard.position_ids[span]) == 1).all()
        for d in range(len(lengths)):
            mine = shard.documents == d
            if sharded[d]:
                assert mine.sum() == lengths[d] // size
            elif lengths[d]:
                assert mine.any() == (owner[d] == c)


@settings(max_examples=100, deadline=None)
@given(size=st.sampled_from([2, 3, 4, 8]), chunks=st.lists(st.integers(1, 50), min_size=1))
def test_head_tail_chunks_give_every_rank_equal_causal_work(size, chunks):
    lengths = [2 * size * c for c in chunks]
    shards = context_layout(lengths, sharded=[True] * len(lengths), owner=[0] * len(lengths),
                            size=size)  # fmt: skip
    work = [causal_work(s) for s in shards]
    assert max(work) == min(work)
    assert sum(work) == sum(n * (n + 1) // 2 for n in lengths)


def test_bad_layouts_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"pad_multiple=4"):
        context_layout([6], sharded=[True], owner=[0], size=2)
    with pytest.raises(ValueError, match=r"owner must name a rank 0 \.\. 1"):
        context_layout([3], sharded=[False], owner=[2], size=2)
    with pytest.raises(ValueError, match="one entry per document"):
        context_layout([3, 4], sharded=[False], owner=[0, 0], size=2)
