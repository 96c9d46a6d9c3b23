"""The GPU benchmark of predicted against measured micro-batch time
(``benchmarks/device/attention_cost.py``), run here on a CPU: the packed batches and the
per-document attention it times are right, every method's cells cover the step, the figures
are the lockstep and rank-sum steps, and a whole run of the dry-run cases with known
micro-batch times fits them exactly, predicts them exactly and writes a result the page
renders."""

import json

import numpy as np
import pytest
import torch

from benchmarks.device import attention_cost as bench
from benchmarks.device.llama import (
    LlamaConfig,
    TinyLlama,
    packed_batch,
    pick_attention,
    sdpa_per_document,
)
from benchmarks.packing_peers import MicroBatches
from chronica import CostModel


def test_a_packed_batch_restarts_positions_at_every_document():
    batch = packed_batch(np.array([3, 1, 2]), vocab=50, device=torch.device("cpu"), seed=0)
    assert batch.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.longest == 3
    assert torch.equal(batch.tokens[1:], batch.labels[:-1])  # labels: the next token


def test_attention_stays_inside_each_document_and_is_causal():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(7, 2, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    document = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    allowed = (document[:, None] == document[None]) & torch.ones(7, 7).tril().bool()
    scores = torch.einsum("qhd,khd->hqk", q, k) / 2.0  # sqrt(head_dim = 4)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hqk,khd->qhd", weights, v)
    torch.testing.assert_close(sdpa_per_document(q, k, v, cu, 4), expected)


def test_on_a_cpu_the_kernel_is_the_per_document_reference():
    name, kernel, why = pick_attention(torch.device("cpu"), torch.float32)
    assert (name, kernel) == ("sdpa", sdpa_per_document)
    assert "CUDA" in why


def test_cells_hold_every_document_once_in_plan_order():
    lengths = np.array([5, 6, 7, 8, 9])
    mb = MicroBatches(
        np.array([0, 1, 0, 1, 0]), np.array([0, 0, 1, 1, 1]), 2, lengths.astype(np.float64)
    )
    table = bench.cells(mb, lengths, 2)
    assert [[c.tolist() for c in rank] for rank in table] == [[[5], [7, 9]], [[6], [8]]]


def test_step_figures_are_the_lockstep_and_rank_sum_steps():
    figures = bench.step_figures(np.array([[1.0, 4.0], [3.0, 1.0]]))
    assert figures["lockstep"] == 3.0 + 4.0  # sum over micro-batches of the slowest rank
    assert figures["ranksum"] == 5.0
    assert figures["ranks"] == [5.0, 4.0]


def test_the_model_trains_on_a_packed_batch():
    model = TinyLlama(
        LlamaConfig(vocab=32, hidden=16, layers=1, heads=2, ffn=24), sdpa_per_document
    )
    loss = model(packed_batch(np.array([4, 3]), 32, torch.device("cpu"), seed=0))
    loss.backward()
    assert loss.item() > 0 and all(p.grad is not None for p in model.parameters())


TRUTH = (2e-3, CostModel(1e-4, 1e-6, 1e-9))  # a micro-batch's fixed cost, then per document


def known_time(lengths: np.ndarray) -> float:
    """The time of a micro-batch under ``TRUTH``, so every figure has a known value."""
    overhead, model = TRUTH
    return overhead + float(model(lengths).sum()) if lengths.size else 0.0


def test_the_timer_times_a_forward_and_backward_pass():
    model = TinyLlama(bench.DRY_RUN.model, sdpa_per_document)
    assert bench.Timer(model, repeats=2)(np.array([5, 9])) > 0
    assert bench.Timer(model, repeats=2)(np.array([], dtype=np.int64)) == 0.0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device") / "result.json"
    return bench.run(bench.DRY_RUN, out=out, timer=known_time), out


def test_with_known_times_the_fit_and_the_prediction_are_exact(dry_run):
    result, _ = dry_run
    for case in result["cases"]:
        assert case["fit"]["overhead"] == pytest.approx(TRUTH[0], rel=1e-6)
        assert case["fit"]["model"] == pytest.approx(list(TRUTH[1].to_tuple()), rel=1e-6)
        assert all(v < 1e-9 for v in case["noise"].values())  # the same plan, the same time
        for summary in case["summary"].values():
            assert summary["error_lockstep"] < 1e-6 and summary["error_rank"] < 1e-6


def test_a_dry_run_measures_every_method_on_every_case(dry_run):
    result, out = dry_run
    assert json.loads(out.read_text())["cases"] == json.loads(json.dumps(result["cases"]))
    assert result["attention"]["kernel"] == "sdpa" and not result["left_out"]
    assert [(c["data"], c["world"], c["max_tokens"]) for c in result["cases"]] == [
        tuple(case) for case in bench.DRY_RUN.cases
    ]
    for case in result["cases"]:
        assert set(case["summary"]) == set(bench.METHODS)
        for step in case["steps"]:
            for key, method in step["methods"].items():
                tokens = method["cells"]["tokens"]
                assert sum(tokens) == step["tokens"], key  # every document timed once
                assert len(tokens) == case["world"] * method["micro"]
                if key in ("micro", "rank"):
                    assert method["over_cap"] == 0
                    assert min(tokens) > 0  # no empty cell: no rank idles
                predicted = method["cells"]["predicted"]
                assert all(p > 0 for p, t in zip(predicted, tokens, strict=True) if t)


def test_a_dry_run_renders_its_page_section(dry_run, tmp_path):
    result, _ = dry_run
    page = bench.render_markdown(result, tmp_path)
    for case in result["cases"]:
        assert f"W = {case['world']}, cap {case['max_tokens']} tokens" in page
    assert page.count('| chronica plan_step, balance="micro" |') == len(result["cases"])
    assert "same plan timed twice" in page
    assert "again" in bench.format_table(result)
