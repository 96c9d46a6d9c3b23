"""The TRL recipes (examples/recipes/trl_sft.py, trl_grpo.py) with the real ``trl`` package,
as torchrun runs them: 2 processes, gloo on 127.0.0.1, a tiny Llama built from a config.

SFT: every document of every step once over the ranks, the same micro-batch count on both,
the cap, and the parameters after the steps equal to one process training on the whole
global batches (transformers' loss normalisation over the step's loss tokens holds however
the plan cut them). GRPO: every rollout once per generation, ``steps_per_generation``
micro-batches on each rank, and the responses of one prompt in one micro-batch."""

import json
import sys

import numpy as np
import pytest
import torch
from workers import ROOT, base_env, run_workers, torch_rendezvous

pytest.importorskip("trl")
import trl_grpo
import trl_sft

WORLD = 2


def _run(recipe, steps, out):
    command = [sys.executable, recipe.__file__, "--steps", str(steps), "--out", str(out)]
    with torch_rendezvous(WORLD) as meeting:
        env = [
            base_env(
                ROOT,
                **meeting,
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(WORLD),
                LOCAL_WORLD_SIZE=str(WORLD),
            )
            for r in range(WORLD)
        ]
        run_workers([command] * WORLD, env, timeout=300)


def test_sft_trains_planned_micro_batches_and_matches_one_process(tmp_path):
    steps = 3
    _run(trl_sft, steps, tmp_path)
    trained = [json.loads((tmp_path / f"micro_batches_{r}.json").read_text()) for r in (0, 1)]
    lengths = np.array([len(d) for d in trl_sft.documents()])
    covered = []
    for step in range(steps):
        per_rank = [trained[r][step] for r in range(WORLD)]
        assert [len(m) for m in per_rank] == [trl_sft.ACCUMULATION] * WORLD
        docs = [i for micro in per_rank for batch in micro for i in batch]
        assert len(docs) == len(set(docs)) == trl_sft.DOCUMENTS_PER_STEP
        assert all(lengths[b].sum() <= trl_sft.PACKING.max_tokens for m in per_rank for b in m)
        covered += docs
    assert len(covered) == len(set(covered))  # no document twice in the epoch
    got = torch.load(tmp_path / "parameters.pt")
    want = trl_sft.reference_parameters(steps, WORLD)
    initial = dict(trl_sft.tiny_llama().named_parameters())
    assert any(not torch.equal(want[k], initial[k].detach()) for k in want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5)


def test_grpo_keeps_every_prompts_responses_in_one_micro_batch(tmp_path):
    _run(trl_grpo, 2, tmp_path)
    for rank in range(WORLD):
        generations = json.loads((tmp_path / f"planned_{rank}.json").read_text())
        assert len(generations) == 2  # 2 steps of 2 micro-batches: one generation each
        for micro_batches in generations:
            assert len(micro_batches) == trl_grpo.STEPS_PER_GENERATION
            rows = [row for micro in micro_batches for row, _ in micro]
            assert sorted(rows) == list(range(trl_grpo.PER_DEVICE * trl_grpo.STEPS_PER_GENERATION))
            for micro in micro_batches:
                assert micro  # no empty micro-batch
                groups = {row // trl_grpo.GENERATIONS for row, _ in micro}
                assert len(micro) == len(groups) * trl_grpo.GENERATIONS  # groups whole
                for group in groups:  # a group is one prompt's responses
                    assert (
                        len({str(p) for row, p in micro if row // trl_grpo.GENERATIONS == group})
                        == 1
                    )
