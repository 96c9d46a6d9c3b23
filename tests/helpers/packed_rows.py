"""Checks of packed micro-batches laid out as dense rows (the JAX and TF faces' output):
documents whose every token says where it comes from, and the epoch-wide checks."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core.packing import Packing

CODE = 10_000  # token t of document i is i * CODE + t: every token says where it comes from


def documents(n: int = 300, seed: int = 0, longest: int = 250) -> tuple[list, np.ndarray]:
    """``n`` documents of lognormal lengths (at most ``longest``) and their lengths."""
    lengths = np.clip(np.random.default_rng(seed).lognormal(4.0, 1.0, n).astype(int), 1, longest)
    docs = [(i * CODE + np.arange(k)).astype(np.int32) for i, k in enumerate(lengths)]
    return docs, lengths


def every_token(lengths: np.ndarray) -> np.ndarray:
    """Every token code of documents of ``lengths``, in order."""
    return np.concatenate([i * CODE + np.arange(k) for i, k in enumerate(lengths)])


def tokens_of(batch: dict) -> np.ndarray:
    """The micro-batch's token codes, checked against its segment ids and positions."""
    tokens, seg, pos = (np.asarray(batch[k]) for k in ("tokens", "segment_ids", "positions"))
    for r in range(tokens.shape[0]):
        real = seg[r] > 0
        n = int(real.sum())
        assert real[:n].all() and not real[n:].any(), "padding only at a row's end"
        assert (tokens[r, n:] == 0).all() and (pos[r, n:] == 0).all()
        if n == 0:
            continue
        s, t, p = seg[r, :n], tokens[r, :n], pos[r, :n]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        assert (s[starts] == np.arange(1, starts.shape[0] + 1)).all(), "segments 1, 2, ..."
        for a, b in zip(starts, [*starts[1:], n], strict=True):
            assert (t[a:b] // CODE == t[a] // CODE).all(), "one document per segment"
            assert (np.diff(t[a:b]) == 1).all(), "a piece's tokens in order"
            assert (p[a:b] == np.arange(b - a)).all(), "positions restart in every piece"
    return tokens[seg > 0]


def check_epoch(ranks: list[list[dict]], lengths: np.ndarray, packing: Packing) -> None:
    """Every token once, equal micro-batch counts per step, caps, loss normalisation."""
    codes = np.concatenate([tokens_of(b) for batches in ranks for b in batches])
    expected = every_token(lengths)
    assert codes.shape == expected.shape
    assert (np.sort(codes) == expected).all(), "every token of every document exactly once"
    per_rank = []
    for batches in ranks:
        steps: dict[int, list[int]] = {}
        for b in batches:
            assert np.asarray(b["tokens"]).shape == (packing.rows, packing.length)
            assert int((np.asarray(b["segment_ids"]) > 0).sum()) <= packing.max_tokens
            steps.setdefault(int(b["step"]), []).append(int(b["micro"]))
            assert int(b["num_micro"]) >= 1
        for step, micros in steps.items():
            num = next(int(b["num_micro"]) for b in batches if int(b["step"]) == step)
            assert micros == list(range(num))
        per_rank.append({s: len(m) for s, m in steps.items()})
    assert all(p == per_rank[0] for p in per_rank), "same micro-batches per step on every rank"
    # Loss normalisation: sum of loss_weight x micro-batch mean over ranks / W = step mean.
    for step in per_rank[0]:
        micro = [b for batches in ranks for b in batches if int(b["step"]) == step]
        total = 0.0
        for b in micro:
            t = tokens_of(b).astype(np.float64)
            if t.shape[0]:
                total += float(b["loss_weight"]) * np.sin(t).mean()
        every = np.concatenate([tokens_of(b) for b in micro]).astype(np.float64)
        assert total / len(ranks) == pytest.approx(np.sin(every).mean(), abs=1e-6)
