"""The context-parallel layout computes what one process computes: 2- and 4-process gloo
jobs run causal attention over ``context_layout``'s shards, hand-built and as
``chronica.plan_step`` emits them for ``Packing(context_parallel=g)`` (keys and values
all-gathered), and match single-process attention over the whole micro-batch, outputs and gradients,
within 1e-5 (tests/helpers/cp_attention_worker.py)."""

from __future__ import annotations

import ast
import sys

import pytest

pytest.importorskip("torch")

from workers import HELPERS, ROOT, base_env, run_workers, torch_rendezvous


@pytest.mark.multiprocess
@pytest.mark.parametrize("source", ["hand", "plan"])
@pytest.mark.parametrize("size", [2, 4])
def test_sharded_attention_equals_single_process_attention(tmp_path, size, source):
    out = tmp_path / "errors.txt"
    worker = [sys.executable, str(HELPERS / "cp_attention_worker.py"), str(out), source]
    with torch_rendezvous(size) as meeting:
        run_workers(
            [worker] * size,
            [
                base_env(ROOT, RANK=str(r), WORLD_SIZE=str(size), OMP_NUM_THREADS="1", **meeting)
                for r in range(size)
            ],
            timeout=120,
        )
    errors = ast.literal_eval(out.read_text())
    assert errors.pop("micro_batches") >= 1
    assert set(errors) == {"out", "dq", "dk", "dv"}
    assert max(errors.values()) < 1e-5, errors
