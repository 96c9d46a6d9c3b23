"""The pieces of the end-to-end packing benchmark (``benchmarks/packing_e2e.py``) that can be
wrong without the benchmark noticing: the per-document attention mask and its chunked use,
the first-fit baseline (every token once, equal micro-batch counts) and the padded baseline
(the token cap, padding included)."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks import packing_e2e as e2e
from chronica.core.packing import step_starts

SETTINGS = e2e.Settings(steps=3, repeats=1, max_tokens=32, tokens_per_step=100)
LENGTHS = np.array([9, 3, 7, 1, 16, 4, 4, 12, 2, 8, 5, 6, 11, 1, 3, 10, 2, 7, 32, 5, 9, 13])


def _segments(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))


def test_mask_is_block_diagonal_and_causal():
    seg = _segments([3, 1, 2])
    mask = e2e.document_mask(seg)
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for lo, hi in ((0, 3), (3, 4), (4, 6)):
        for i in range(lo, hi):
            expected[i, lo : i + 1] = True
    assert torch.equal(mask, expected)


def test_chunked_attention_equals_the_masked_one():
    torch.manual_seed(0)
    seg = _segments([5, 9, 1, 13, 4])[None]
    q, k, v = torch.randn(3, 1, 2, seg.shape[1], 8).unbind(0)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=e2e.document_mask(seg)[:, None])
    for chunk in (4, 7, 64):
        chunked = e2e.document_attention(q, k, v, seg, chunk=chunk)
        torch.testing.assert_close(chunked, dense)
    spans = e2e.attention_spans(seg, 4)
    assert [qs for qs, _, _ in spans] == list(range(0, 32, 4))
    assert all(ks <= qs for qs, _, ks in spans)


def test_no_attention_across_documents_and_causal_within():
    torch.manual_seed(0)
    lengths = [6, 11, 5]
    model = e2e.TinyLM(hidden=16, heads=2, layers=2, max_len=16, chunk=4).eval()
    seg = _segments(lengths)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.randint(1, e2e.VOCAB, (1, sum(lengths)))
    with torch.no_grad():
        base = model(ids, pos, seg)
        other = ids.clone()
        other[0, 6:17] = torch.randint(1, e2e.VOCAB, (11,))  # the middle document changes
        changed = model(other, pos, seg)
        later = ids.clone()
        later[0, 9] = (later[0, 9] % (e2e.VOCAB - 1)) + 1  # one token inside it changes
        causal = model(later, pos, seg)
    torch.testing.assert_close(changed[0, :6], base[0, :6])
    torch.testing.assert_close(changed[0, 17:], base[0, 17:])
    assert not torch.allclose(changed[0, 6:17], base[0, 6:17])
    torch.testing.assert_close(causal[0, :9], base[0, :9])
    assert not torch.allclose(causal[0, 9:17], base[0, 9:17])
    torch.testing.assert_close(causal[0, 17:], base[0, 17:])


def test_packed_targets_stay_within_documents():
    ids = torch.tensor([5, 6, 7, 9, 3, 4])
    seg = torch.tensor([0, 0, 0, 1, 2, 2])
    assert e2e.packed_targets(ids, seg).tolist() == [6, 7, e2e.EOS, e2e.EOS, 4, e2e.EOS]


def _steps():
    """Steps of about 50 tokens, cut as chronica cuts a token budget."""
    cuts = step_starts(LENGTHS, None, 50)
    return [np.arange(a, b) for a, b in itertools.pairwise(cuts)]


def _counts(batches, steps):
    return [next(b[0].num_micro for b in batches if b[0].step == s) for s in range(steps)]


@pytest.mark.parametrize("method", ["firstfit", "padding"])
def test_baselines_cover_every_token_once_with_equal_micro_batch_counts(method):
    steps = _steps()
    per_rank = [
        e2e.method_batches(method, steps, LENGTHS, SETTINGS, r) for r in range(SETTINGS.world)
    ]
    assert len(steps) > 3
    seen = np.zeros(len(LENGTHS), dtype=np.int64)
    for batches in per_rank:
        assert all(len({(i.step, i.micro, i.num_micro) for i in b}) == 1 for b in batches)
        places = [(b[0].step, b[0].micro, b[0].num_micro) for b in batches]
        # Every rank runs micro-batches 0 .. num_micro - 1 of every step, the same num_micro.
        assert places == [
            (s, j, n) for s, n in enumerate(_counts(batches, len(steps))) for j in range(n)
        ]
        assert _counts(batches, len(steps)) == _counts(per_rank[0], len(steps))
        for batch in batches:
            tokens = sum(i.length for i in batch)
            longest = max(i.length for i in batch)
            assert tokens <= SETTINGS.max_tokens
            if method == "padding":  # padded to the longest, the cap still holds
                assert len(batch) * longest <= SETTINGS.max_tokens
            for index in batch:
                assert index.start == 0
                if index.length:
                    assert index.length == LENGTHS[int(index)]
                    seen[int(index)] += 1
    assert np.all(seen == 1)
    # The micro-batches' loss weights give the step's token mean (they sum to W per step).
    for s in range(len(steps)):
        weights = [b[0].loss_weight for batches in per_rank for b in batches if b[0].step == s]
        assert sum(weights) == pytest.approx(SETTINGS.world)


def test_first_fit_keeps_epoch_order_and_deals_round_robin():
    mb = e2e.first_fit(np.array([300, 300, 100, 200, 500]), 2, 512)
    # bins: [300, 100], [300, 200], [500] -> ranks 0, 1, 0; micro-batches 0, 0, 1
    assert mb.rank.tolist() == [0, 1, 0, 1, 0]
    assert mb.micro.tolist() == [0, 0, 0, 0, 1]
    assert mb.num_micro == 2


def test_padded_micro_batches_respect_max_tokens_padding_included():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 200, size=101)
    mb = e2e.padded(lengths, 2, 256)
    assert np.bincount(mb.rank).tolist() == [51, 50]  # the strided split
    assert mb.tokens(2).max() <= 256
    assert np.all(mb.padded >= lengths)
    batch = e2e.collate_padded(
        [
            (torch.arange(1, 4), e2e.PackedIndex(0, 0, 3, 0, 0, 0, 1, 1.0)),
            (torch.arange(1, 6), e2e.PackedIndex(1, 0, 5, 0, 0, 0, 1, 1.0)),
        ]
    )
    assert batch["input_ids"].shape == (2, 5) and batch["num_tokens"] == 8
    assert batch["targets"].tolist() == [
        [2, 3, e2e.EOS, e2e.IGNORE, e2e.IGNORE],
        [2, 3, 4, 5, e2e.EOS],
    ]
    assert batch["last"]
