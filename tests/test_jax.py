"""chronica.jax.iterator: plan parity with core and torch, coverage, static shapes, resume,
errors, and a real 2-process jax.distributed job on loopback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from workers import base_env, free_port, run_workers  # noqa: E402

import chronica.jax as cj  # noqa: E402
from chronica.core import (  # noqa: E402
    ScheduleConfig,
    Scheduler,
    as_cost_model,
    as_shuffle_policy,
)

ROOT = Path(__file__).resolve().parents[1]


def _data(n=203, seed=0):
    lengths = np.random.default_rng(seed).lognormal(3, 1, n).astype(int) + 1
    return [np.arange(1, k + 1, dtype=np.int32) for k in lengths], lengths


def _valid_indices(batch):
    return batch["indices"][batch["valid"]]


CONFIGS = [
    {"shuffle": True, "seed": 0, "drop_last": False, "kind": "static", "exact": True},
    {"shuffle": True, "seed": 7, "drop_last": True, "kind": "static", "exact": True},
    {"shuffle": False, "seed": 0, "drop_last": False, "kind": "guided", "exact": True},
    {"shuffle": True, "seed": 3, "drop_last": False, "kind": "static", "exact": False},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_parity_with_core_and_torch(config):
    tud = pytest.importorskip("chronica.torch.utils.data")
    data, lengths = _data()
    world, batch = 4, 16
    for rank in range(world):
        it = cj.iterator(
            data,
            global_batch_size=batch,
            num_replicas=world,
            rank=rank,
            epochs=2,
            cost="quadratic",
            **config,
        )
        cfg = ScheduleConfig(
            num_replicas=world,
            batch_size=batch,
            kind=config["kind"],
            exact=config["exact"],
            shuffle=as_shuffle_policy(config["shuffle"]),
            seed=config["seed"],
            drop_last=config["drop_last"],
            cost=as_cost_model("quadratic"),
            groups=None,
        )
        scheduler = Scheduler(lengths.astype(np.float64), cfg, labels=None, partitions=None)
        sampler = tud.DistributedBatchSampler(
            data,
            batch_size=batch,
            num_replicas=world,
            rank=rank,
            sizes=lengths,
            cost="quadratic",
            **config,
        )
        assert it.scheduler.digest == scheduler.digest == sampler.scheduler.digest
        got = [_valid_indices(b).tolist() for b in it]
        expected, via_torch = [], []
        for epoch in range(2):
            plan = scheduler.plan_epoch(epoch)
            expected += [plan.local(s, rank).tolist() for s in range(plan.num_steps)]
            sampler.set_epoch(epoch)
            via_torch += list(sampler)
        assert got == expected == via_torch


@pytest.mark.parametrize("n, drop_last", [(200, False), (203, False), (203, True)])
def test_exactly_once_coverage_equal_steps(n, drop_last):
    data, _ = _data(n)
    world = 4
    iters = [
        cj.iterator(
            data, global_batch_size=16, num_replicas=world, rank=r, drop_last=drop_last, epochs=3
        )
        for r in range(world)
    ]
    for epoch in range(3):
        per_rank = []
        for it in iters:
            per_rank.append([_valid_indices(next(it)) for _ in range(it.steps_per_epoch)])
        assert len({len(steps) for steps in per_rank}) == 1
        for s in range(len(per_rank[0])):  # equal counts on every rank at every step
            assert len({len(steps[s]) for steps in per_rank}) == 1
        seen = np.concatenate([np.concatenate(steps) for steps in per_rank])
        plan = iters[0].plan(epoch)
        if n % world == 0:
            assert sorted(seen.tolist()) == list(range(n))
        elif drop_last:
            assert len(seen) == len(set(seen.tolist())) == n - plan.num_dropped
        else:
            assert set(seen.tolist()) == set(range(n))
            assert len(seen) == n + plan.num_padded
    for it in iters:
        with pytest.raises(StopIteration):
            next(it)


def test_static_shapes_and_masks():
    data, lengths = _data(301)
    boundaries = [8, 16, 32, 64, 128, 512]
    it = cj.iterator(
        data,
        global_batch_size=12,
        num_replicas=3,
        rank=1,
        epochs=2,
        bucket_boundaries=boundaries,
        pad_value=-5,
    )
    shapes = set()
    for batch in it:
        x, mask, lens, valid = batch["inputs"], batch["mask"], batch["lengths"], batch["valid"]
        shapes.add(x.shape)
        assert x.shape[0] == 4 and mask.shape == x.shape and mask.dtype == bool
        assert x.shape[1] in boundaries
        real = batch["indices"][valid]
        assert x.shape[1] == min(b for b in boundaries if b >= lengths[real].max())
        for row in range(4):
            if valid[row]:
                k = lengths[batch["indices"][row]]
                assert lens[row] == k
                np.testing.assert_array_equal(x[row, :k], data[batch["indices"][row]])
                assert (x[row, k:] == -5).all()
            else:
                assert lens[row] == 0 and batch["indices"][row] == -1
            assert mask[row].sum() == lens[row] and mask[row, : lens[row]].all()
        assert batch["loss_weight"] == pytest.approx(1.0)
    assert len(shapes) <= it.num_shapes <= len(boundaries)
    assert it.shapes_seen == {s[:2] for s in shapes}
    # the trailing partial step (301 // 3 = 101 per rank, 4 per step) is padded to 4 rows
    assert it.steps_per_epoch == 26


def test_default_buckets_and_dict_sources():
    data, lengths = _data(64)
    labels = np.arange(64) % 5
    it = cj.iterator({"tokens": data, "label": labels}, global_batch_size=8, num_replicas=2, rank=0)
    assert it.bucket_boundaries[-1] == lengths.max()
    assert all(b & (b - 1) == 0 for b in it.bucket_boundaries[:-1])
    assert it.num_shapes <= len(it.bucket_boundaries)
    batch = next(it)
    assert set(batch) == {"tokens", "label", "mask", "lengths", "indices", "loss_weight", "valid"}
    np.testing.assert_array_equal(batch["label"], labels[batch["indices"]])
    fixed = cj.iterator(np.ones((40, 10), np.float32), global_batch_size=8, num_replicas=1, rank=0)
    assert fixed.num_shapes == 1 and next(fixed)["inputs"].shape == (8, 10)


def test_as_jax_places_arrays_and_jit_compiles_few_programs():
    data, _ = _data(96)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    traces = []

    @jax.jit
    def total(x, mask):
        traces.append(x.shape)
        return (x * mask).sum()

    for kwargs in ({}, {"sharding": sharding}):
        it = cj.iterator(
            data, global_batch_size=8, num_replicas=2, rank=1, epochs=2, as_jax=True, **kwargs
        )
        for batch in it:
            assert isinstance(batch["inputs"], jax.Array)
            assert isinstance(batch["indices"], np.ndarray)
            assert int(total(batch["inputs"], batch["mask"])) >= 0
    assert len(set(traces)) <= it.num_shapes


def test_resume_mid_epoch_equals_uninterrupted_run():
    data, _ = _data(150)
    kwargs = {"global_batch_size": 8, "num_replicas": 2, "rank": 1, "epochs": 3, "seed": 5}
    full = [_valid_indices(b).tolist() for b in cj.iterator(data, **kwargs)]
    for cut in (0, 5, len(full) // 3, len(full) // 3 + 1, len(full) - 1, len(full)):
        first = cj.iterator(data, **kwargs)
        head = [_valid_indices(next(first)).tolist() for _ in range(cut)]
        state = json.loads(json.dumps(first.get_state()))
        resumed = cj.iterator(data, **kwargs)
        resumed.set_state(state)
        assert head + [_valid_indices(b).tolist() for b in resumed] == full


def test_set_state_refuses_mismatches():
    data, _ = _data(80)
    it = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=0, epochs=2)
    next(it)
    state = it.get_state()
    other_seed = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=0, seed=1)
    with pytest.raises(ValueError, match="digest"):
        other_seed.set_state(state)
    other_buckets = cj.iterator(
        data, global_batch_size=8, num_replicas=2, rank=0, bucket_boundaries=[1000]
    )
    with pytest.raises(ValueError, match="digest"):
        other_buckets.set_state(state)
    other_rank = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=1)
    with pytest.raises(ValueError, match="rank 0 of 2"):
        other_rank.set_state(state)
    with pytest.raises(ValueError, match="version"):
        it.set_state({"version": 99})
    with pytest.raises(ValueError, match="outside"):
        it.set_state({**state, "step": 10_000})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"global_batch_size": 7, "num_replicas": 2, "rank": 0}, "multiple of"),
        ({"global_batch_size": 0, "num_replicas": 2, "rank": 0}, "global_batch_size"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 2}, "rank"),
        ({"global_batch_size": 8, "num_replicas": 0, "rank": 0}, "num_replicas"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "epochs": 0}, "epochs"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "kind": "nope"}, "kind"),
        (
            {"global_batch_size": 8, "num_replicas": 2, "rank": 0, "kind": "dynamic"},
            "kind='dynamic' is not available for the JAX iterator",
        ),
        (
            {"global_batch_size": 8, "num_replicas": 2, "rank": 0, "bucket_boundaries": [4]},
            "bucket boundary",
        ),
        (
            {"global_batch_size": 8, "num_replicas": 2, "rank": 0, "bucket_boundaries": [9, 3]},
            "increasing",
        ),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "sizes": [1, 2]}, "sizes"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "sharding": "x"}, "sharding"),
    ],
)
def test_bad_input_fails_early(kwargs, match):
    data, _ = _data(40)
    sizes = kwargs.pop("sizes", None)
    with pytest.raises(ValueError, match=match):
        cj.iterator(data, sizes, **kwargs)


def test_bad_sources():
    with pytest.raises(ValueError, match="random-access"):
        cj.iterator(iter([1, 2]), global_batch_size=2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="scalar"):
        cj.iterator(np.arange(10), global_batch_size=2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="differ in length"):
        cj.iterator(
            {"a": [np.ones(3)] * 4, "b": np.arange(5)}, global_batch_size=2, num_replicas=1, rank=0
        )
    with pytest.raises(ValueError, match="clashes"):
        cj.iterator({"mask": [np.ones(3)] * 4}, global_batch_size=2, num_replicas=1, rank=0)


def test_world_defaults_to_jax_process():
    data, _ = _data(20)
    it = cj.iterator(data, global_batch_size=4)
    assert (it.rank, it.num_replicas) == (jax.process_index(), jax.process_count())


def test_import_chronica_does_not_import_jax():
    code = "import sys, chronica; assert 'jax' not in sys.modules, 'jax imported'"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_two_jax_processes_cover_every_sample_once(tmp_path):
    world = 2
    port = free_port()
    outs = [tmp_path / f"rank{i}.json" for i in range(world)]
    worker = str(ROOT / "tests" / "jax_worker.py")
    run_workers(
        [[sys.executable, worker, str(port), str(i), "2", str(out)] for i, out in enumerate(outs)],
        base_env(ROOT, JAX_PLATFORMS="cpu"),
        timeout=120,
    )
    results = [json.loads(out.read_text()) for out in outs]
    assert sorted((r["rank"], r["world"]) for r in results) == [(0, 2), (1, 2)]
    data, _ = _data(203)  # the worker's sizes: lognormal(3, 1), seed 0, 203 samples
    reference = cj.iterator(data, global_batch_size=16, num_replicas=2, rank=0)
    scheduler = reference.scheduler
    assert results[0]["global_shapes"] == results[1]["global_shapes"]
    assert len(results[0]["global_shapes"]) == reference.steps_per_epoch
    assert all(rows == 16 for rows, _ in results[0]["global_shapes"])
    for epoch in ("0", "1"):
        steps = [r["epochs"][epoch] for r in results]
        assert len(steps[0]) == len(steps[1])
        seen = [i for r in steps for batch in r for i in batch]
        # 203 samples on 2 ranks: torch-style padding repeats exactly one sample
        assert set(seen) == set(range(203)) and len(seen) == 204
        plan = scheduler.plan_epoch(int(epoch))
        for r in results:
            expected = [plan.local(s, r["rank"]).tolist() for s in range(plan.num_steps)]
            assert r["epochs"][epoch] == expected


def test_jax_train_example_runs():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "jax_train.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    ).stdout
    assert "compiled shapes:" in out and "epoch 3: mean loss" in out
