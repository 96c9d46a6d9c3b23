"""The packing kernel (``chronica.core.packing``) against its pure-Python reference
(``tests/helpers/reference.py``), and the promises of its docstrings: placement within the
token caps, the fewest micro-batches, balance, document pieces, step cuts and loss weights."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing import (
    Packing,
    Pieces,
    micro_weights,
    pack_step,
    pieces,
    step_starts,
)

# --- generated steps -----------------------------------------------------------------------

# Cost models a + b·L + c·L² (linear, quadratic, constant); small coefficient sets so that
# equal lengths give equal costs (ties) often.
COSTS = {
    "linear": (0.0, 1.0, 0.0),
    "linear+": (3.5, 0.5, 0.0),
    "quadratic": (1.0, 1.0, 1.0 / 7.0),
    "attention": (0.0, 1.0, 1.0 / 1024.0),
    "constant": (1.0, 0.0, 0.0),
}


@st.composite
def steps(draw, max_docs: int = 200):
    """``(lengths, costs, num_replicas, packing, speeds, num_micro)`` of one step."""
    w = draw(st.integers(1, 16))
    rows = draw(st.integers(1, 4))
    row_length = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 64, 1000]))
    # max_tokens need not be a multiple of row_length: the rest of it is never used.
    extra = draw(st.integers(0, row_length - 1))
    packing = Packing(
        max_tokens=rows * row_length + extra,
        row_length=row_length,
        micro_batches=draw(st.none() | st.integers(1, 4)),
    )
    n = draw(st.integers(0, max_docs))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = draw(st.sampled_from(["uniform", "few", "lognormal", "with-empty"]))
    if shape == "uniform":
        lengths = rng.integers(1, row_length + 1, n)
    elif shape == "few":  # two or three distinct lengths: many exact ties
        lengths = rng.choice(rng.integers(1, row_length + 1, 3), n)
    elif shape == "lognormal":
        lengths = np.clip(np.round(rng.lognormal(math.log(row_length) - 2, 1, n)), 1, row_length)
    else:
        lengths = rng.integers(0, row_length + 1, n)
    lengths = lengths.astype(np.int64)
    a, b, c = COSTS[draw(st.sampled_from(sorted(COSTS)))]
    costs = a + b * lengths + c * lengths.astype(np.float64) ** 2
    speed = draw(st.sampled_from(["none", "equal", "levels", "uniform"]))
    speeds = {
        "none": None,
        "equal": np.ones(w),
        "levels": rng.choice([0.5, 1.0, 1.5, 2.0, 3.0], w),
        "uniform": rng.uniform(0.25, 4.0, w),
    }[speed]
    num_micro = draw(st.none() | st.integers(1, 4))
    return lengths, costs, w, packing, speeds, num_micro


def _requested(packing: Packing, num_micro: int | None) -> int:
    """The micro-batch count asked for: ``num_micro``, else ``packing.micro_batches``."""
    return num_micro or packing.micro_batches or 1


def _fewest(lengths: np.ndarray, w: int, packing: Packing) -> int:
    """Micro-batches per rank the tokens need (rows hold ``rows·row_length`` tokens)."""
    return max(1, -(-int(lengths.sum()) // (w * packing.rows * packing.length)))


def _as_bytes(step) -> tuple:
    return (
        step.rank.tobytes(),
        step.micro.tobytes(),
        step.row.tobytes(),
        step.num_micro,
        step.loads.tobytes(),
    )


# --- the kernel equals the reference --------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(steps())
def test_pack_step_equals_reference(case):
    lengths, costs, w, packing, speeds, num_micro = case
    got = pack_step(lengths, costs, w, packing, speeds, num_micro)
    rank, micro, row, m, loads = reference.pack_step(
        lengths, costs, w, packing.rows, packing.length, speeds, _requested(packing, num_micro)
    )
    assert got.num_micro == m
    assert got.rank.tolist() == rank.tolist()
    assert got.micro.tolist() == micro.tolist()
    assert got.row.tolist() == row.tolist()
    assert got.loads.tobytes() == loads.tobytes()


def test_trade_partners_are_the_lightest_ranks_ties_by_lower_rank():
    # Sixteen ranks with equal times: the partners of a trade are the four lightest, ties
    # by lower rank, as the reference picks them. (An unstable sort of the times, such as
    # numba's quicksort from sixteen elements up, picks others among equals.)
    lengths = np.arange(46, dtype=np.int64) % 8 + 1
    costs = lengths.astype(np.float64)
    got = pack_step(lengths, costs, 16, Packing(max_tokens=8))
    rank, micro, row, m, loads = reference.pack_step(lengths, costs, 16, 1, 8)
    assert got.num_micro == m
    assert got.rank.tolist() == rank.tolist()
    assert got.micro.tolist() == micro.tolist()
    assert got.row.tolist() == row.tolist()
    assert got.loads.tobytes() == loads.tobytes()


# --- what every packed step keeps ----------------------------------------------------------


def check_packed(lengths, costs, w, packing, speeds, num_micro, step) -> None:
    """The promises of ``PackedStep`` and ``pack_step`` for one packed step."""
    n = lengths.shape[0]
    m, rows = step.num_micro, packing.rows
    for array in (step.rank, step.micro, step.row):
        assert array.shape == (n,)
        assert array.dtype == np.int64
    # Every document placed exactly once, at a rank, micro-batch and row that exist.
    assert ((step.rank >= 0) & (step.rank < w)).all()
    assert ((step.micro >= 0) & (step.micro < m)).all()
    assert ((step.row >= 0) & (step.row < rows)).all()
    assert np.array_equal(np.sort(step.order()), np.arange(n))
    # The caps: no row over row_length, no micro-batch over max_tokens.
    slot = (step.rank * m + step.micro) * rows + step.row
    row_tokens = np.bincount(slot, weights=lengths, minlength=w * m * rows)
    assert row_tokens.max(initial=0) <= packing.length
    assert row_tokens.reshape(w, m, rows).sum(axis=2).max(initial=0) <= packing.max_tokens
    # Loads are the costs per rank.
    assert step.loads.shape == (w,)
    expect = np.bincount(step.rank, weights=costs, minlength=w)
    np.testing.assert_allclose(step.loads, expect, rtol=1e-9, atol=1e-9 * max(1.0, costs.sum()))
    # The fewest micro-batches: never fewer than the tokens need or than asked for, and one
    # more only where LPT could not place every document with one fewer.
    floor = max(_fewest(lengths, w, packing), _requested(packing, num_micro))
    assert m >= floor
    if m > floor:
        assert (
            reference.pack(lengths, costs, speeds or [1.0] * w, m - 1, rows, packing.length) is None
        )
    # Refinement never makes the slowest rank slower than LPT left it, and nothing beats the
    # ranks finishing together or the fastest rank taking the largest document alone.
    speed = np.ones(w) if speeds is None else np.asarray(speeds, dtype=np.float64)
    top = (step.loads / speed).max()
    lpt = reference.pack(lengths, costs, speed, m, rows, packing.length, refine=False)
    assert lpt is not None
    assert top <= (np.array(lpt[3]) / speed).max() * (1 + 1e-12)
    if n:
        bound = max(costs.sum() / speed.sum(), costs.max() / speed.max())
        assert top >= bound * (1 - 1e-9)


@settings(max_examples=150, deadline=None)
@given(steps())
def test_every_packed_step_keeps_the_caps_and_the_fewest_micro_batches(case):
    lengths, costs, w, packing, speeds, num_micro = case
    speeds = None if speeds is None else speeds.tolist()
    step = pack_step(lengths, costs, w, packing, speeds, num_micro)
    check_packed(lengths, costs, w, packing, speeds, num_micro, step)
    # Deterministic: the same bytes on a second call.
    assert _as_bytes(pack_step(lengths, costs, w, packing, speeds, num_micro)) == _as_bytes(step)


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(1, 16),
    rows=st.integers(1, 4),
    size=st.integers(1, 9),
    per_row=st.integers(1, 5),
    n=st.integers(0, 300),
    micro_batches=st.none() | st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_documents_of_one_length_take_exactly_the_micro_batches_the_tokens_need(
    w, rows, size, per_row, n, micro_batches, seed
):
    # Documents of one length that divides the row length always fit at the token count's
    # micro-batches, whatever their costs and the speeds: the count is then exactly the
    # fewest, ceil(tokens / (W·rows·row_length)), or the requested one if larger.
    rng = np.random.default_rng(seed)
    packing = Packing(
        max_tokens=rows * size * per_row, row_length=size * per_row, micro_batches=micro_batches
    )
    lengths = np.full(n, size, dtype=np.int64)
    costs = rng.lognormal(0, 1, n)
    step = pack_step(lengths, costs, w, packing, rng.uniform(0.5, 2.0, w))
    assert step.num_micro == max(_fewest(lengths, w, packing), micro_batches or 1)


def test_num_micro_overrides_packing_micro_batches_and_more_are_taken_only_to_fit():
    lengths = np.full(8, 4, dtype=np.int64)
    costs = lengths.astype(np.float64)
    packing = Packing(max_tokens=8, micro_batches=3)
    assert pack_step(lengths, costs, 2, packing).num_micro == 3
    assert pack_step(lengths, costs, 2, packing, num_micro=5).num_micro == 5
    # Asked for one, the 32 tokens need two micro-batches of 8 on each of two ranks.
    assert pack_step(lengths, costs, 2, packing, num_micro=1).num_micro == 2


def test_an_empty_step_runs_the_requested_micro_batches_with_nothing_in_them():
    empty = np.zeros(0, dtype=np.int64)
    step = pack_step(empty, np.zeros(0), 3, Packing(max_tokens=8, micro_batches=2))
    assert step.num_micro == 2
    assert step.rank.shape == step.micro.shape == step.row.shape == (0,)
    assert step.loads.tolist() == [0.0, 0.0, 0.0]


def test_a_document_longer_than_a_row_is_refused_naming_pieces():
    with pytest.raises(ValueError, match=r"9 tokens.*row_length=8.*pieces"):
        pack_step(np.array([3, 9]), np.array([3.0, 9.0]), 2, Packing(max_tokens=16, row_length=8))


def test_order_lists_rank_then_micro_batch_then_row_then_step_order():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 9, 60)
    step = pack_step(lengths, lengths * 1.0, 3, Packing(max_tokens=16, row_length=8))
    order = step.order()
    keys = np.stack([step.rank[order], step.micro[order], step.row[order], order], axis=1)
    assert [tuple(k) for k in keys] == sorted(tuple(k) for k in keys)


# Bad input is refused with the argument named. Run in a child process: the kernel must
# neither hang (a document of infinite or undefined cost) nor write past its arrays (speeds
# of another length than num_replicas).
_REFUSE = """
import numpy as np
from chronica.core.packing import Packing, pack_step
try:
    pack_step(np.array([1, 2, 3]), np.array({costs}), 2, Packing(max_tokens=8), {speeds})
except ValueError as error:
    print("ValueError:", error)
else:
    print("accepted")
"""


@pytest.mark.parametrize(
    "costs,speeds,name",
    [
        ("[1.0, float('nan'), 1.0]", "None", "costs"),
        ("[1.0, float('inf'), 1.0]", "None", "costs"),
        ("[1.0, 1.0, 1.0]", "np.ones(3)", "speeds"),
        ("[1.0, 1.0, 1.0]", "np.ones(1)", "speeds"),
        ("[1.0, 1.0, 1.0]", "np.array([1.0, 0.0])", "speeds"),
    ],
)
def test_bad_costs_and_speeds_are_refused_naming_them(costs, speeds, name):
    code = textwrap.dedent(_REFUSE.format(costs=costs, speeds=speeds))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=8
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pack_step(costs={costs}, speeds={speeds}) did not return in 8 s")
    said = (done.stdout + done.stderr).strip().splitlines()[-1:]
    assert done.stdout.startswith("ValueError:") and name in done.stdout, said


# --- balance ------------------------------------------------------------------------------

LAYOUTS = {
    "flat": Packing(max_tokens=8192),
    "4 rows": Packing(max_tokens=16384, row_length=4096),
}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("model", ["linear", "attention"])
@pytest.mark.parametrize("w", [8, 64])
def test_lognormal_steps_are_balanced_within_one_percent_of_the_bound(w, model, layout, seed):
    packing = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(6, 1, 64 * w)), 1, packing.length).astype(np.int64)
    a, b, c = COSTS[model]
    costs = a + b * lengths + c * lengths.astype(np.float64) ** 2
    step = pack_step(lengths, costs, w, packing)
    check_packed(lengths, costs, w, packing, None, None, step)
    mean = costs.sum() / w
    bound = max(mean, costs.max()) / mean
    ratio = step.loads.max() / mean
    assert ratio <= bound * 1.01, f"max/mean {ratio:.4f}, bound {bound:.4f}"
    # Within a rank: no micro-batch is left empty while another holds several documents.
    counts = np.zeros((w, step.num_micro), dtype=np.int64)
    np.add.at(counts, (step.rank, step.micro), 1)
    assert not ((counts == 0).any(axis=1) & (counts > 1).any(axis=1)).any()


SPEEDS = np.array([1.0, 1.0, 2.0, 1.0, 0.5, 1.0, 1.5, 1.0])


def _lognormal_step(w: int, model: str, packing: Packing, seed: int):
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(6, 1, 64 * w)), 1, packing.length).astype(np.int64)
    a, b, c = COSTS[model]
    return lengths, a + b * lengths + c * lengths.astype(np.float64) ** 2


@pytest.mark.parametrize("model", ["linear", "attention"])
def test_slow_ranks_take_less_and_times_even_out(model):
    # Six micro-batches leave every rank room for its speed's share of the tokens.
    packing = LAYOUTS["4 rows"]
    lengths, costs = _lognormal_step(8, model, packing, 7)
    step = pack_step(lengths, costs, 8, packing, SPEEDS, num_micro=6)
    check_packed(lengths, costs, 8, packing, SPEEDS.tolist(), 6, step)
    times = step.loads / SPEEDS
    bound = max(costs.sum() / SPEEDS.sum(), costs.max() / SPEEDS.max())
    assert times.max() <= bound * 1.01
    assert step.loads[4] < step.loads[0] < step.loads[6] < step.loads[2]


@pytest.mark.parametrize("seed", range(3))
def test_at_the_fewest_micro_batches_a_fast_rank_takes_what_its_micro_batches_hold(seed):
    # The fewest micro-batches follow the tokens, not the speeds: the fastest rank fills
    # its micro-batches and the others share the rest. With cost = tokens the bound is then
    # the time T at which sum(min(T·speed, capacity)) covers every token.
    packing = LAYOUTS["4 rows"]
    lengths, costs = _lognormal_step(8, "linear", packing, seed)
    step = pack_step(lengths, costs, 8, packing, SPEEDS)
    check_packed(lengths, costs, 8, packing, SPEEDS.tolist(), None, step)
    capacity = step.num_micro * packing.rows * packing.length
    capped = np.zeros(8, dtype=bool)
    while True:
        time = (costs.sum() - capacity * capped.sum()) / SPEEDS[~capped].sum()
        if not (time * SPEEDS[~capped] > capacity).any():
            break
        capped |= time * SPEEDS > capacity
    assert capped.any()  # the case this test is about
    bound = max(time, costs.max() / SPEEDS.max())
    assert (step.loads / SPEEDS).max() <= bound * 1.01


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


# --- step cuts ------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 50), max_size=60),
    batch_size=st.integers(1, 9),
    budget=st.integers(1, 120),
)
def test_step_starts_in_both_modes(tokens, batch_size, budget):
    array = np.array(tokens, dtype=np.int64)
    n = len(tokens)
    by_count = step_starts(array, batch_size, None)
    assert by_count.tolist() == [*range(0, n, batch_size), n]
    by_budget = step_starts(array, None, budget)
    assert by_budget.dtype == np.int64
    assert by_budget.tolist() == [*reference.budget_starts(tokens, budget), n]
    # The token budget wins over batch_size when both are given.
    assert step_starts(array, batch_size, budget).tolist() == by_budget.tolist()
    for s in range(len(by_budget) - 1):
        step = tokens[by_budget[s] : by_budget[s + 1]]
        assert len(step) >= 1
        assert sum(step) <= budget or len(step) == 1
        if by_budget[s + 1] < n:  # a step stops only where the next document overflows it
            assert sum(step) + tokens[by_budget[s + 1]] > budget


def test_step_starts_without_a_step_size_is_refused():
    with pytest.raises(ValueError, match=r"batch_size=.*tokens_per_step="):
        step_starts(np.array([1, 2]), None, None)


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


# --- Packing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 8.0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 8, "row_length": 0}, "row_length"),
        ({"max_tokens": 8, "row_length": 9}, "row_length"),
        ({"max_tokens": 8, "row_length": 2.5}, "row_length"),
        ({"max_tokens": 8, "tokens_per_step": 0}, "tokens_per_step"),
        ({"max_tokens": 8, "tokens_per_step": 1.5}, "tokens_per_step"),
        ({"max_tokens": 8, "micro_batches": 0}, "micro_batches"),
        ({"max_tokens": 8, "micro_batches": "2"}, "micro_batches"),
        ({"max_tokens": 8, "long_documents": "drop"}, "long_documents"),
        ({"max_tokens": 8, "loss": "mean"}, "loss"),
    ],
)
def test_packing_validation_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        Packing(**kwargs)


def test_packing_fills_in_defaults_and_stores_python_ints():
    packing = Packing(max_tokens=np.int64(10), row_length=np.int32(3), micro_batches=np.int8(2))
    assert packing.rows == 3 and packing.length == 3
    assert all(type(v) is int for v in (packing.max_tokens, packing.row_length))
    assert type(packing.micro_batches) is int
    assert json.loads(json.dumps(packing.to_tuple())) == [10, 3, None, 2, "error", "token"]
    flat = Packing(max_tokens=8)
    assert flat.row_length == 8 and flat.rows == 1 and flat.length == 8
