"""The FSDP2 recipe (examples/recipes/fsdp2_micro.py) as torchrun runs it: 2 processes,
gloo on 127.0.0.1, ``fully_shard``, ``Packing(balance="micro")``. Every document of every
step once, the same micro-batch count on both ranks, the token cap, and the parameters after
the steps equal to one process training on the whole global batches (the loss weights keep
the mean over loss tokens whatever the packing)."""

import json
import sys

import fsdp2_micro as recipe
import numpy as np
import torch
from workers import ROOT, base_env, run_workers, torch_rendezvous

STEPS, WORLD = 3, 2


def test_two_fsdp2_ranks_train_every_document_once_and_match_one_process(tmp_path):
    command = [sys.executable, recipe.__file__, "--steps", str(STEPS)]
    command += ["--out", str(tmp_path)]
    with torch_rendezvous(WORLD) as meeting:
        env = [
            base_env(ROOT, **meeting, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD))
            for r in range(WORLD)
        ]
        run_workers([command] * WORLD, env, timeout=240)
    trained = json.loads((tmp_path / "micro_batches.json").read_text())
    batches = recipe.global_batches(STEPS)
    for step, batch in enumerate(batches):
        lengths = np.array([len(d) for d in batch])
        per_rank = [trained[r][step] for r in range(WORLD)]
        assert len({len(micro) for micro in per_rank}) == 1  # equal counts: no deadlock
        seen = [i for micro in per_rank for docs in micro for i in docs]
        assert sorted(seen) == list(range(len(batch)))  # every document once
        for micro in per_rank:
            assert all(lengths[docs].sum() <= recipe.PACKING.max_tokens for docs in micro)
    got = torch.load(tmp_path / "parameters.pt")
    want = recipe.reference_parameters(batches)
    assert got.keys() == want.keys()
    initial = dict(recipe.TinyLM().named_parameters())
    for name, value in want.items():
        assert not torch.equal(value, initial[name].detach()) or name.startswith("positions")
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5)
