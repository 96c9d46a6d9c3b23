"""``chronica.core.packing.weights.micro_weights``: micro-batch means weighted into the
global mean."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing import (
    micro_weights,
)

# --- loss weights ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    w=st.integers(1, 8),
    m=st.integers(1, 5),
    loss=st.sampled_from(["token", "sample"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_micro_weights_turn_micro_batch_means_into_the_global_mean(w, m, loss, seed):
    rng = np.random.default_rng(seed)
    # Every micro-batch: some documents (maybe none) of some tokens, a loss per token.
    docs = rng.integers(0, 4, (w, m))
    docs[rng.integers(w), rng.integers(m)] += 1  # at least one document in the step
    losses = [
        [[rng.random(int(rng.integers(1, 20))) for _ in range(docs[r, k])] for k in range(m)]
        for r in range(w)
    ]
    tokens = np.array([[sum(d.shape[0] for d in losses[r][k]) for k in range(m)] for r in range(w)])
    weights = micro_weights(tokens, docs, w, loss)
    assert weights.shape == (w, m)
    assert math.isclose(weights.sum(), w, rel_tol=1e-12)
    assert (weights[docs == 0] == 0).all()

    def mean(values):  # a micro-batch's mean loss over tokens or over documents
        if loss == "token":
            return np.concatenate(values).mean()
        return np.mean([d.mean() for d in values])

    per_rank = [
        sum(weights[r, k] * mean(losses[r][k]) for k in range(m) if docs[r, k]) for r in range(w)
    ]
    every = [d for r in range(w) for k in range(m) for d in losses[r][k]]
    expect = np.concatenate(every).mean() if loss == "token" else np.mean([d.mean() for d in every])
    assert math.isclose(np.mean(per_rank), expect, rel_tol=1e-12, abs_tol=1e-12)


def test_micro_weights_of_an_empty_step_are_zero():
    weights = micro_weights(np.zeros((2, 3)), np.zeros((2, 3)), 2, "token")
    assert weights.shape == (2, 3) and not weights.any()
