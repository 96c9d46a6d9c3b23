"""chronica.jax.iterator: plan parity with core and torch, coverage, static shapes, resume,
errors, and a real 2-process jax.distributed job on loopback."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from dynamic_job import check_exactly_once, standalone_coordinator, static_plan  # noqa: E402
from workers import (  # noqa: E402
    HELPERS,
    ROOT,
    base_env,
    free_port,
    free_ports,
    scaled,
    start_workers,
    wait_workers,
)

import chronica.jax as cj  # noqa: E402
from chronica.core import (  # noqa: E402
    ScheduleConfig,
    Scheduler,
    as_cost_model,
    as_shuffle_policy,
)


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


def test_resume_in_a_fresh_process(tmp_path):
    data, _ = _data(150)
    kwargs = {"global_batch_size": 8, "num_replicas": 2, "rank": 1, "epochs": 2, "seed": 5}
    first = cj.iterator(data, **kwargs)
    for _ in range(7):
        next(first)
    (tmp_path / "state.json").write_text(json.dumps(first.get_state()))
    expected = [_valid_indices(b).tolist() for b in first]
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "import chronica.jax as cj\n"
        "lengths = np.random.default_rng(0).lognormal(3, 1, 150).astype(int) + 1\n"
        "data = [np.arange(1, k + 1, dtype=np.int32) for k in lengths]\n"
        f"it = cj.iterator(data, **{kwargs!r})\n"
        "it.set_state(json.load(open(sys.argv[1])))\n"
        "print(json.dumps([b['indices'][b['valid']].tolist() for b in it]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "state.json")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=base_env(ROOT, JAX_PLATFORMS="cpu"),
    ).stdout
    assert json.loads(out.splitlines()[-1]) == expected


def test_dynamic_in_one_process_resumes_mid_epoch():
    # kind="dynamic" at one process: its own coordinator (port 0: a free one), every step
    # the static plan's samples; a mid-epoch state resumes in a fresh iterator.
    from chronica.runtime import DynamicOptions

    data, _ = _data(120)
    kwargs = dict(
        global_batch_size=8,
        num_replicas=1,
        rank=0,
        kind="dynamic",
        variable_batch=True,
        epochs=2,
        window=4,
        dynamic=DynamicOptions(port=0, timeout=5.0),
    )
    it = cj.iterator(data, **kwargs)
    steps = []
    for _ in range(6):
        batch = next(it)
        steps.append(sorted(_valid_indices(batch).tolist()))
        assert batch["loss_weight"] == 1.0
        it.report(0.01)
    state = it.get_state()
    assert it.stream.session.windows_dynamic >= 1
    it.close()
    again = cj.iterator(data, **kwargs)
    again.set_state(state)
    steps += [sorted(_valid_indices(b).tolist()) for b in again]
    again.close()
    for epoch in range(2):
        plan = again.plan(epoch)
        expected = [sorted(plan.local(s, 0).tolist()) for s in range(plan.num_steps)]
        assert steps[epoch * plan.num_steps : (epoch + 1) * plan.num_steps] == expected
    assert len(steps) == 2 * again.scheduler.num_steps()


def test_set_epoch_jumps_and_keeps_the_current_position():
    data, _ = _data(80)
    it = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=1, epochs=3)
    for _ in range(3):
        next(it)
    it.set_epoch(0)  # the current epoch: the position stays
    assert _valid_indices(next(it)).tolist() == it.plan(0).local(3, 1).tolist()
    it.set_epoch(2)
    assert it.epoch == 2 and it.get_state()["step"] == 0
    assert _valid_indices(next(it)).tolist() == it.plan(2).local(0, 1).tolist()


def test_set_state_refuses_mismatches():
    data, _ = _data(80)
    it = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=0, epochs=2)
    next(it)
    state = it.get_state()
    assert sorted(state) == sorted(
        ["version", "epoch", "step", "offset", "digest", "num_replicas", "batch_size"]
        + ["history", "fingerprint"]
    )
    other_seed = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=0, seed=1)
    with pytest.raises(ValueError, match="digest"):
        other_seed.set_state(state)
    for version in (1, 2, 99):
        with pytest.raises(ValueError, match=f"state version {version} is not supported"):
            it.set_state({**state, "version": version})
    with pytest.raises(ValueError, match="outside"):
        it.set_state({**state, "step": 10_000})


def test_state_is_rank_independent():
    data, _ = _data(80)
    it = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=0, epochs=2)
    for _ in range(3):
        next(it)
    other = cj.iterator(data, global_batch_size=8, num_replicas=2, rank=1, epochs=2)
    other.set_state(it.get_state())
    assert _valid_indices(next(other)).tolist() == other.plan().local(3, 1).tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"global_batch_size": 7, "num_replicas": 2, "rank": 0}, "multiple of"),
        ({"global_batch_size": 0, "num_replicas": 2, "rank": 0}, "global_batch_size"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 2}, "rank"),
        ({"global_batch_size": 8, "num_replicas": 0, "rank": 0}, "num_replicas"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "epochs": 0}, "epochs"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "kind": "nope"}, "kind"),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "exact": "yes"}, "exact="),
        ({"global_batch_size": 8, "num_replicas": 2, "rank": 0, "dynamic": {}}, "dynamic="),
        ({"num_replicas": 2, "rank": 0}, "global_batch_size .* is required"),
        (
            {"global_batch_size": 8, "rank": 0, "config": ScheduleConfig(2, 8), "seed": 3},
            "config= already holds the whole configuration; pass seed",
        ),
        (
            {"global_batch_size": 8, "num_replicas": 3, "rank": 0, "config": ScheduleConfig(2, 8)},
            "differs from the world size",
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
    # A value of the wrong type is a TypeError, a wrong value of the right type a ValueError.
    wrong_type = {"exact": "yes", "dynamic": {}, "sharding": "x"}
    error = TypeError if any(kwargs.get(k) == v for k, v in wrong_type.items()) else ValueError
    with pytest.raises(error, match=match):
        cj.iterator(data, sizes, **kwargs)


def test_bad_sources():
    with pytest.raises(TypeError, match="random-access"):
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


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Both processes of jax_worker.py, one jax.distributed job running every scenario in
    turn ("cover", then kind="dynamic" "kill" against a standalone coordinator this fixture
    kills mid-epoch, then "train"): each scenario's results, sorted by rank."""
    folder = tmp_path_factory.mktemp("jax_job")
    standalone = free_ports(2)[0]
    ports = [free_port(), free_ports(4)[0]]  # jax.distributed's; chronica's two coordinators
    with standalone_coordinator(folder, 2, standalone) as kill_on_request:
        procs = start_workers(
            [
                [sys.executable, str(HELPERS / "jax_worker.py"), str(folder)]
                + [str(port) for port in (*ports, standalone)]
                + [str(i)]
                for i in range(2)
            ],
            base_env(ROOT, JAX_PLATFORMS="cpu"),
        )
        try:
            kill_on_request(procs, timeout=scaled(180))
        finally:
            wait_workers(procs, timeout=360)
    return {
        scenario: [json.loads((folder / f"{scenario}.rank{i}.json").read_text()) for i in range(2)]
        for scenario in ("cover", "kill", "train")
    }


def test_two_jax_processes_cover_every_sample_once(job):
    results = job["cover"]
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


# -- kind="dynamic" over a real 2-process jax.distributed job (the job fixture) --------------


def test_dynamic_two_processes_every_step_once_exact_gradients_slow_rank_smaller(job):
    results = job["train"]  # two coordinators
    check_exactly_once(results, 2)  # equal step counts, every step exactly the static one's
    slow = results[1]
    for r in results:
        assert r["static_windows"] == 0  # the coordinator delivered every window
        assert r["grad_error"] < 1e-6  # loss weights make the average the whole-step mean
        assert set(r["rows"]) <= {1, 2, 4, 8, 16} and r["num_shapes"] == 5
    for epoch in range(2):
        static = static_plan(2, epoch)
        for step in range(static.num_steps):
            counts = [len(r["epochs"][epoch][step]) for r in results]
            if static.bounds[step, -1] - static.bounds[step, 0] == 16:
                assert sum(counts) == 16  # the global batch is exact every full step
            weights = [r["weights"][epoch][step] for r in results]
            assert sum(weights) == pytest.approx(2)
    # Rank 1 computes 3x slower: it gets about a quarter of the global batch.
    assert np.mean([len(b) for b in slow["epochs"][1]]) < 6
    # A sharding spanning both processes: one global shape, 2 x the per-rank maximum rows,
    # while the processes' real counts differ.
    assert results[0]["global_shapes"] == results[1]["global_shapes"] == [[32, 1]]
    counts = [r["local_counts"] for r in results]
    assert len(counts[0]) == len(counts[1]) == static_plan(2, 0).num_steps
    assert counts[0] != counts[1]


def test_dynamic_coordinator_killed_mid_epoch_falls_back_without_losing_a_sample(job):
    results = job["kill"]
    check_exactly_once(results, 2)
    for r in results:
        assert r["dynamic_windows"] >= 1  # before the kill
        assert r["static_windows"] >= 1  # after it
        assert r["grad_error"] < 1e-6
    # Both processes took the same source for every window (agreed over the KV store).
    assert len({(r["dynamic_windows"], r["static_windows"]) for r in results}) == 1
