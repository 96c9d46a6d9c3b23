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

SOURCES = ("hand", "plan")


@pytest.fixture(scope="module")
def errors_of(tmp_path_factory):
    """``errors_of(size, source)``: the largest differences the ``size``-process job found for
    ``source``; one job per size checks both sources, launched when first asked for."""
    folders = {}

    def errors_of(size, source):
        if size not in folders:
            folder = tmp_path_factory.mktemp(f"cp{size}")
            worker = [sys.executable, str(HELPERS / "cp_attention_worker.py"), str(folder)]
            with torch_rendezvous(size) as meeting:
                run_workers(
                    [worker + list(SOURCES)] * size,
                    [
                        base_env(
                            ROOT, RANK=str(r), WORLD_SIZE=str(size), OMP_NUM_THREADS="1", **meeting
                        )
                        for r in range(size)
                    ],
                    timeout=120 * len(SOURCES),
                )
            folders[size] = folder
        return ast.literal_eval((folders[size] / f"errors-{source}.txt").read_text())

    return errors_of


@pytest.mark.multiprocess
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("size", [2, 4])
def test_sharded_attention_equals_single_process_attention(errors_of, size, source):
    errors = errors_of(size, source)
    assert errors.pop("micro_batches") >= 1
    assert set(errors) == {"out", "dq", "dk", "dv"}
    assert max(errors.values()) < 1e-5, errors
