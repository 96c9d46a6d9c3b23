"""chronica.tf.schedule: parity with the core plan and the torch sampler, coverage, padding,
sizes read once, input errors, and two real TensorFlow worker processes on loopback."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from dynamic_job import check_exactly_once, standalone_coordinator  # noqa: E402
from tf_data import make_dataset  # noqa: E402
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

import chronica.tf  # noqa: E402
from chronica.core import ScheduleConfig, Scheduler, as_cost_model, as_shuffle_policy  # noqa: E402
from chronica.runtime import DynamicOptions  # noqa: E402


def lengths_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 40, size=n)


def core_plan(sizes, world, batch, *, shuffle=True, seed=0, drop_last=False, kind="static"):
    cfg = ScheduleConfig(
        num_replicas=world,
        batch_size=batch,
        kind=kind,
        exact=True,
        shuffle=as_shuffle_policy(shuffle),
        seed=seed,
        drop_last=drop_last,
        cost=as_cost_model(None),
        groups=None,
    )
    return Scheduler(sizes, cfg, labels=None, partitions=None)


def tf_steps(ds: tf.data.Dataset, key: str = "idx") -> list[list[int]]:
    return [b[key].numpy().tolist() for b in ds]


@pytest.mark.parametrize(
    "n,world,batch,shuffle,drop_last,seed",
    [(61, 2, 8, True, False, 0), (61, 3, 12, True, True, 5), (40, 4, 8, False, False, 1)],
)
def test_parity_with_core_plan_and_torch_sampler(n, world, batch, shuffle, drop_last, seed):
    torch_data = pytest.importorskip("chronica.torch.utils.data")
    lengths = lengths_of(n, seed)
    ds = make_dataset(lengths)
    sch = core_plan(lengths, world, batch, shuffle=shuffle, seed=seed, drop_last=drop_last)
    first, epochs = 1, 2
    for rank in range(world):
        # What the transformation and the sampler are both given.
        common = dict(
            num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        transform = chronica.tf.schedule(
            lengths, global_batch_size=batch, epochs=epochs, epoch=first, **common
        )
        got = tf_steps(ds.apply(transform))
        sampler = torch_data.DistributedBatchSampler(
            list(range(n)), batch_size=batch, sizes=lengths, **common
        )
        want_core, want_torch = [], []
        for e in range(first, first + epochs):
            plan = sch.plan_epoch(e)
            want_core += [plan.local(s, rank).tolist() for s in range(plan.num_steps)]
            sampler.set_epoch(e)
            want_torch += [list(b) for b in sampler]
        assert got == want_core == want_torch


def test_exactly_once_coverage_and_equal_steps():
    n, world, batch = 96, 4, 16
    lengths = lengths_of(n, 3)
    ds = make_dataset(lengths)
    per_rank = []
    for rank in range(world):
        t = chronica.tf.schedule(
            lengths, global_batch_size=batch, num_replicas=world, rank=rank, epochs=2
        )
        per_rank.append(list(ds.apply(t)))
    assert len({len(x) for x in per_rank}) == 1
    steps_per_epoch = len(per_rank[0]) // 2
    for e in range(2):
        seen = []
        for batches in per_rank:
            for b in batches[e * steps_per_epoch : (e + 1) * steps_per_epoch]:
                assert b["idx"].shape[0] == batch // world
                assert float(b["loss_weight"]) == pytest.approx(1.0)
                seen += b["idx"].numpy().tolist()
        assert sorted(seen) == list(range(n))


def test_input_context_serves_its_replicas_interleaved():
    lengths = lengths_of(30, 2)
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4
    )
    t = chronica.tf.schedule(lengths, global_batch_size=8, input_context=ctx)
    assert t.ranks == [2, 3] and t.num_replicas == 4
    got = tf_steps(make_dataset(lengths).apply(t))
    plan = core_plan(lengths, 4, 8).plan_epoch(0)
    want = [plan.local(s, r).tolist() for s in range(plan.num_steps) for r in (2, 3)]
    assert got == want


def test_padding_mask_and_ragged_output():
    lengths = lengths_of(23, 4)
    ds = make_dataset(lengths)
    plan = core_plan(lengths, 2, 6).plan_epoch(0)
    widths = []
    for rank in range(2):
        t = chronica.tf.schedule(lengths, global_batch_size=6, num_replicas=2, rank=rank)
        widths.append([b["tok"].shape[1] for b in ds.apply(t)])
    # Every replica pads a step to the step's longest example over both replicas.
    step_max = [
        max(lengths[plan.local(s, r)].max() for r in range(2)) for s in range(plan.num_steps)
    ]
    assert widths[0] == widths[1] == step_max
    t = chronica.tf.schedule(lengths, global_batch_size=6, num_replicas=2, rank=0)
    for b in ds.apply(t):
        idx = b["idx"].numpy()
        tok, mask, length = b["tok"].numpy(), b["tok_mask"].numpy(), b["tok_length"].numpy()
        assert tok.shape == mask.shape and tok.shape[1] >= lengths[idx].max()
        np.testing.assert_array_equal(length, lengths[idx])
        for row, i in enumerate(idx):
            np.testing.assert_array_equal(mask[row], np.arange(tok.shape[1]) < lengths[i])
            np.testing.assert_array_equal(tok[row, : lengths[i]], i * 1000 + np.arange(lengths[i]))
            assert not tok[row, lengths[i] :].any()
    ragged = chronica.tf.schedule(
        lengths, global_batch_size=6, num_replicas=2, rank=1, padded=False
    )
    b = next(iter(ds.apply(ragged)))
    assert isinstance(b["tok"], tf.RaggedTensor) and "tok_mask" not in b
    np.testing.assert_array_equal(b["tok"].row_lengths().numpy(), lengths[b["idx"].numpy()])


def test_single_tensor_examples_become_feature_x():
    ds = tf.data.Dataset.range(10)
    t = chronica.tf.schedule(np.ones(10), global_batch_size=2, num_replicas=1, rank=0)
    seen = sorted(v for b in ds.apply(t) for v in b["x"].numpy().tolist())
    assert seen == list(range(10))


def test_size_fn_called_once_per_example():
    lengths = lengths_of(29, 5)
    # Unknown cardinality (filter) is counted in the single pass.
    ds = make_dataset(lengths).filter(lambda e: True)
    calls = []

    def size_fn(example):
        calls.append(int(example["idx"]))
        return len(example["tok"])

    t = chronica.tf.schedule(size_fn=size_fn, global_batch_size=4, num_replicas=2, rank=0, epochs=3)
    out = ds.apply(t)
    for _ in range(2):
        assert len(tf_steps(out)) > 0
    ds.apply(t)  # the same data set again: cached
    assert sorted(calls) == list(range(29))
    np.testing.assert_array_equal(t.sizes, lengths)


def test_bad_inputs_raise_clear_errors():
    lengths = lengths_of(10)
    ds = make_dataset(lengths)
    kw = {"global_batch_size": 4, "num_replicas": 2, "rank": 0}
    with pytest.raises(ValueError, match="neither"):
        chronica.tf.schedule(**kw)
    with pytest.raises(ValueError, match="both"):
        chronica.tf.schedule(lengths, size_fn=len, **kw)
    with pytest.raises(ValueError, match="multiple"):
        chronica.tf.schedule(lengths, global_batch_size=5, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="global_batch_size"):
        chronica.tf.schedule(lengths, global_batch_size=0, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="input_context"):
        chronica.tf.schedule(lengths, global_batch_size=4)
    with pytest.raises(ValueError, match="rank"):
        chronica.tf.schedule(lengths, global_batch_size=4, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="infinite"):
        ds.repeat().apply(chronica.tf.schedule(lengths, **kw))
    with pytest.raises(ValueError, match="10 samples"):
        ds.apply(chronica.tf.schedule(lengths[:9], **kw))
    with pytest.raises(ValueError, match="dict"):
        tf.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10))).apply(
            chronica.tf.schedule(lengths, **kw)
        )


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Both workers of tf_worker.py, one MultiWorkerMirroredStrategy job over 127.0.0.1
    running every scenario in turn ("cover", then kind="dynamic" "kill" against a standalone
    coordinator this fixture kills mid-epoch, then "train"): each scenario's results, by
    rank."""
    folder = tmp_path_factory.mktemp("tf_job")
    ports = ",".join(str(free_port()) for _ in range(2))
    coordinator, standalone = free_ports(2)[0], free_ports(2)[0]
    env = base_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("TF_CONFIG", "CHRONICA_COORDINATOR"):
        env.pop(name, None)
    worker = str(HELPERS / "tf_worker.py")
    with standalone_coordinator(folder, 2, standalone) as kill_on_request:
        procs = start_workers(
            [
                [sys.executable, worker, str(r), ports, str(coordinator), str(standalone)]
                + [str(folder)]
                for r in range(2)
            ],
            env,
        )
        try:
            kill_on_request(procs, timeout=scaled(180))
        finally:
            wait_workers(procs, timeout=360)
    return {
        scenario: [json.loads((folder / f"{scenario}.rank{r}.json").read_text()) for r in range(2)]
        for scenario in ("cover", "kill", "train")
    }


def test_two_multiworker_processes_cover_every_sample_once(job):
    """Two TF processes, MultiWorkerMirroredStrategy over 127.0.0.1, one replica each."""
    reports = job["cover"]
    n, batch, epochs = 53, 8, 2
    sch = core_plan(np.random.default_rng(7).integers(1, 30, size=n), 2, batch)
    assert len(reports[0]["steps"]) == len(reports[1]["steps"])
    steps = len(reports[0]["steps"]) // epochs
    for e in range(epochs):
        plan = sch.plan_epoch(e)
        assert plan.num_steps == steps
        seen = []
        for r, rep in enumerate(reports):
            mine = rep["steps"][e * steps : (e + 1) * steps]
            assert mine == [plan.local(s, r).tolist() for s in range(steps)]
            seen += [i for b in mine for i in b]
        # drop_last=False pads 53 samples to 54 (one repeat, as torch does); all others once.
        assert set(seen) == set(range(n)) and len(seen) == n + plan.num_padded
    # The all-reduced per-step counts agree with what both workers consumed.
    total = sum(len(b) for rep in reports for b in rep["steps"])
    assert reports[0]["reduced_total"] == reports[1]["reduced_total"] == total


def test_tf_multiworker_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tf_multiworker.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "epoch 1: mean loss" in out.stdout and "tf multiworker: done" in out.stdout


def test_wrong_types_and_values_raise_by_name_and_stream_calls_need_apply():
    lengths = lengths_of(10)
    kw = {"global_batch_size": 4, "num_replicas": 2, "rank": 0}
    with pytest.raises(TypeError, match="size_fn"):
        chronica.tf.schedule(size_fn=3, **kw)
    with pytest.raises(ValueError, match="epochs"):
        chronica.tf.schedule(lengths, epochs=0, **kw)
    with pytest.raises(TypeError, match="epochs"):
        chronica.tf.schedule(lengths, epochs="2", **kw)
    with pytest.raises(TypeError, match="padded"):
        chronica.tf.schedule(lengths, padded="yes", **kw)
    with pytest.raises(TypeError, match=r"tf\.data\.Dataset, got list"):
        chronica.tf.schedule(lengths, **kw)([1, 2])
    t = chronica.tf.schedule(lengths, **kw)
    for call in (t.get_state, t.plan, t.stats, lambda: t.report(1.0)):
        with pytest.raises(RuntimeError, match="apply"):
            call()
    make_dataset(lengths).apply(t)
    assert t.plan().num_steps == 3 and t.get_state()["step"] == 0


def test_repr_shows_the_configuration_before_and_after_applying():
    lengths = lengths_of(12)
    t = chronica.tf.schedule(
        lengths, global_batch_size=4, num_replicas=2, rank=1, epochs=3, padded=False
    )
    want = (
        "chronica.tf.Schedule(ranks=[1], num_replicas=2, global_batch_size=4, kind='static', "
        "padded=False, epochs=3, epoch=0, packing=None, applied=False)"
    )
    assert repr(t) == want
    make_dataset(lengths).apply(t)
    assert repr(t) == want.replace("applied=False", "applied=True")
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4
    )
    served = chronica.tf.schedule(
        lengths, global_batch_size=8, input_context=ctx, kind="guided", epochs=None
    )
    assert repr(served).startswith("chronica.tf.Schedule(ranks=[2, 3], num_replicas=4, ")
    assert "kind='guided'" in repr(served) and "epochs=None" in repr(served)


def test_dynamic_refused_for_a_pipeline_serving_several_replicas():
    ctx = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    with pytest.raises(ValueError, match="one replica per input pipeline"):
        chronica.tf.schedule(np.ones(8), global_batch_size=4, kind="dynamic", input_context=ctx)


def test_dynamic_single_replica_yields_every_sample_each_epoch():
    lengths = lengths_of(40, 6)
    t = chronica.tf.schedule(
        lengths,
        global_batch_size=8,
        num_replicas=1,
        rank=0,
        kind="dynamic",
        variable_batch=True,
        window=2,
        dynamic=DynamicOptions(port=free_ports(2)[0], timeout=scaled(3.0)),
        epochs=2,
    )
    try:
        seen: dict[int, list[int]] = {0: [], 1: []}
        for b in make_dataset(lengths).apply(t):
            seen[int(b["epoch"])] += b["idx"].numpy().tolist()
            t.report(1e-3)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(40))
        assert t.stream.session.windows_dynamic >= 1
    finally:
        t.close()


def _take(t, ds, count):
    """The first ``count`` elements of one iteration (the pipeline prefetches beyond)."""
    out = []
    for b in ds:
        out.append(b)
        if len(out) == count:
            break
    return out


RESUME = dict(global_batch_size=8, num_replicas=2, rank=1, epochs=2, seed=3)


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """One fresh Python process: what ``import chronica`` and then ``import chronica.tf``
    loaded, and the rest of a schedule (``RESUME``) it resumed from the state this fixture
    took after 5 delivered batches. Returns the state, the state the producer had reached,
    every batch of the uninterrupted run and what the process reports."""
    tmp = tmp_path_factory.mktemp("fresh")
    lengths = lengths_of(61, 8)
    t = chronica.tf.schedule(lengths, **RESUME)
    ds = make_dataset(lengths).apply(t)
    everything = [(int(b["epoch"]), b["idx"].numpy().tolist()) for b in ds]
    taken = _take(t, ds, 5)
    state = t.get_state(delivered=taken[-1])
    produced = t.get_state()  # the producer may run ahead by tf.data's prefetch
    (tmp / "state.json").write_text(json.dumps(state))
    np.save(tmp / "lengths.npy", lengths)
    code = f"""
import json, sys
import chronica
imported = {{"tensorflow after chronica": "tensorflow" in sys.modules}}
import chronica.tf
imported["torch after chronica.tf"] = "torch" in sys.modules
import numpy as np
sys.path.insert(0, {str(HELPERS)!r})
from tf_data import make_dataset
lengths = np.load({str(tmp / "lengths.npy")!r})
t = chronica.tf.schedule(lengths, **{RESUME!r})
t.set_state(json.loads(open({str(tmp / "state.json")!r}).read()))
out = [(int(b["epoch"]), b["idx"].numpy().tolist()) for b in make_dataset(lengths).apply(t)]
print(json.dumps({{"imported": imported, "resumed": out}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=base_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return state, produced, everything, json.loads(done.stdout.strip().splitlines()[-1])


def test_import_chronica_loads_no_tensorflow_and_adapter_no_torch(fresh_process):
    # (tensorflow itself may import jax when it is installed, so only torch is checked)
    assert fresh_process[-1]["imported"] == {
        "tensorflow after chronica": False,
        "torch after chronica.tf": False,
    }


def test_state_after_a_delivered_batch_resumes_exactly_in_a_fresh_process(fresh_process):
    state, produced, everything, reported = fresh_process
    assert (state["epoch"], state["step"]) == (0, 5)
    assert (produced["epoch"], produced["step"]) >= (0, 5)
    json.dumps(state)
    resumed = [tuple(x) for x in reported["resumed"]]
    assert resumed == [(e, b) for e, b in everything[5:]]


@pytest.mark.parametrize("new_world,new_batch", [(3, 12), (2, 8)])
def test_elastic_resume_at_another_world_covers_every_sample_once(new_world, new_batch):
    n, world, batch, trained = 96, 4, 12, 3
    lengths = lengths_of(n, 9)
    ds = make_dataset(lengths)
    seen, states = [], []
    for rank in range(world):
        t = chronica.tf.schedule(lengths, global_batch_size=batch, num_replicas=world, rank=rank)
        taken = _take(t, ds.apply(t), trained)
        seen += [i for b in taken for i in b["idx"].numpy().tolist()]
        states.append(t.get_state(delivered=taken[-1]))
    assert all(s == states[0] for s in states)
    for rank in range(new_world):
        t = chronica.tf.schedule(
            lengths, global_batch_size=new_batch, num_replicas=new_world, rank=rank
        )
        t.set_state(states[0])  # before applying: kept, checked when applied
        out = list(ds.apply(t))
        assert len(out) == t.stream.num_steps
        seen += [i for b in out for i in b["idx"].numpy().tolist()]
    assert sorted(seen) == list(range(n))


def test_state_of_the_torch_batch_sampler_resumes_in_tf():
    torch_data = pytest.importorskip("chronica.torch.utils.data")
    n, world, batch, rank = 70, 2, 8, 0
    lengths = lengths_of(n, 10)
    sampler = torch_data.DistributedBatchSampler(
        list(range(n)), batch_size=batch, num_replicas=world, rank=rank, sizes=lengths, seed=4
    )
    sampler.set_epoch(1)
    it = iter(sampler)
    for _ in range(3):
        next(it)
    state = sampler.state_dict()
    rest = [list(b) for b in it]
    t = chronica.tf.schedule(
        lengths, global_batch_size=batch, num_replicas=world, rank=rank, seed=4, epochs=2
    )
    out = make_dataset(lengths).apply(t)
    assert int(out.cardinality()) == 2 * t.steps_per_epoch  # the plan knows its steps
    with pytest.raises(ValueError, match="apply the schedule again after set_state"):
        t.set_state(state)  # the applied output's cardinality would be wrong
    out = make_dataset(lengths).apply(t)
    assert int(out.cardinality()) == len(rest)
    assert tf_steps(out) == rest


def test_dynamic_two_workers_rebalance_a_slow_worker_exactly_once(job):
    results = job["train"]
    check_exactly_once(results, 2)
    for r in results:
        assert r["static_windows"] == 0  # the coordinator delivered every window
        assert r["grad_error"] < 1e-6  # loss weights make the mean the whole step's gradient
    last = [[len(b) for b in r["epochs"][1]] for r in results]
    full = [s for s in range(len(last[0])) if last[0][s] + last[1][s] == 16]
    assert len(full) >= len(last[0]) - 1  # the global batch is exact at every full step
    assert np.mean([last[1][s] for s in full]) < 6  # the 3x slower worker gets ~4 of 16
    for s in full:
        assert results[0]["weights"][1][s] + results[1]["weights"][1][s] == pytest.approx(2)


def test_dynamic_coordinator_killed_mid_epoch_falls_back_together(job):
    results = job["kill"]
    check_exactly_once(results, 2)
    for r in results:
        assert r["dynamic_windows"] >= 1 and r["static_windows"] >= 1
        assert r["grad_error"] < 1e-6
    # Both workers took the same source for every window (agreed over the coordination
    # service's key-value store).
    assert len({(r["dynamic_windows"], r["static_windows"]) for r in results}) == 1


def test_an_endless_generator_is_refused_after_a_bound_and_a_finite_one_is_read():
    def examples(count=None):
        n = itertools.count() if count is None else range(count)
        return tf.data.Dataset.from_generator(
            lambda: ({"x": np.arange(3)} for _ in n),
            output_signature={"x": tf.TensorSpec([None], tf.int64)},
        )

    kw = dict(sizes=np.ones(50), global_batch_size=4, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"unknown .* more than 50 examples \(len\(sizes\)=50\)"):
        examples().apply(chronica.tf.schedule(**kw))
    out = examples(50).apply(chronica.tf.schedule(**kw))
    assert sum(int(tf.shape(batch["x"])[0]) for batch in out) == 50
