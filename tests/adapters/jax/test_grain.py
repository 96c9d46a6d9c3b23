"""chronica.jax.StepSource, the Grain face: records are whole steps (the JAX iterator's
batches byte for byte), Grain's sampler and sharding select the rank, Grain's checkpoints
resume chronica's position exactly, nothing is read ahead of need (also by
chronica.jax.iterator), and a real 2-process jax.distributed job trains through Grain's
DataLoader with worker_count=2 on exactly chronica's balanced batches."""

import json
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
grain = pytest.importorskip("grain")

from grain_data import BATCH, EPOCHS, RESUME_AT, CountingSource, samples  # noqa: E402
from workers import HELPERS, ROOT, base_env, free_port, run_workers, scaled  # noqa: E402

import chronica.jax as cj  # noqa: E402
from chronica import Packing  # noqa: E402


@pytest.fixture
def absl_flags_parsed():
    """grain <= 0.2.18 reads an absl flag when worker processes start, which raises outside
    absl.app (google/grain#1355): mark the flags parsed for the test, then undo it."""
    from absl import flags

    was = flags.FLAGS.is_parsed()
    flags.FLAGS.mark_as_parsed()
    yield
    if not was:
        flags.FLAGS.unparse_flags()


def _same(a: dict, b: dict) -> bool:
    """Equal keys and equal bytes (and dtypes) for every value."""
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.array_equal(a[k], b[k]) for k in a
    )


def _valid(record: dict) -> list[int]:
    return record["indices"][record["valid"]].tolist()


KWARGS = {"global_batch_size": 8, "num_replicas": 2, "epochs": 2, "seed": 3}


@pytest.mark.parametrize(
    "extra",
    [{}, {"drop_last": True, "bucket_boundaries": (16, 64, 1024)}, {"kind": "guided"}],
)
def test_records_are_the_iterators_batches_every_sample_once_per_epoch(extra):
    data, lengths = samples(101)
    records = {}
    for rank in range(2):
        steps = cj.StepSource(data, lengths, rank=rank, **KWARGS, **extra)
        batches = list(cj.iterator(data, lengths, rank=rank, **KWARGS, **extra))
        assert len(steps) == len(batches) == 2 * steps.steps(0)
        for k, batch in enumerate(batches):
            record = steps[k]
            epoch, step = steps.position(k)
            assert (record.pop("epoch"), record.pop("step")) == (epoch, step)
            assert _same(record, batch)
            assert record["indices"][record["valid"]].tolist() == (
                steps.plan(epoch).local(step, rank).tolist()
            )
        records[rank] = [steps[k] for k in range(len(steps))]
    per_epoch = len(records[0]) // 2
    orders = []
    for epoch in range(2):
        seen = [
            i
            for r in (0, 1)
            for rec in records[r][epoch * per_epoch : (epoch + 1) * per_epoch]
            for i in _valid(rec)
        ]
        plan = steps.plan(epoch)
        if extra.get("drop_last"):
            assert len(seen) == len(set(seen)) == 101 - plan.num_dropped
        else:  # 101 samples on 2 ranks: torch-style padding repeats one
            assert set(seen) == set(range(101)) and len(seen) == 101 + plan.num_padded
        orders.append(seen)
    assert orders[0] != orders[1]


def test_global_shape_gives_every_rank_one_shape_per_step():
    data, lengths = samples(120)
    kw = {**KWARGS, "variable_batch": False, "global_shape": True}
    ranks = [cj.StepSource(data, lengths, rank=r, **kw) for r in range(2)]
    for k in range(len(ranks[0])):
        a, b = (s[k] for s in ranks)
        assert a["inputs"].shape == b["inputs"].shape
        longest = max(a["lengths"].max(), b["lengths"].max())
        assert a["inputs"].shape[1] == ranks[0].records.bucket(int(longest))


def test_packed_records_stack_the_iterators_micro_batches():
    data, lengths = samples(90)
    packing = Packing(max_tokens=512, row_length=256)
    kw = {**KWARGS, "packing": packing}
    for rank in range(2):
        steps = cj.StepSource(data, lengths, rank=rank, **kw)
        micro = list(cj.iterator(data, lengths, rank=rank, **kw))
        assert sum(int(steps[k]["num_micro"]) for k in range(len(steps))) == len(micro)
        done = 0
        for k in range(len(steps)):
            record = steps[k]
            epoch, step = steps.position(k)
            assert (record["epoch"], record["step"]) == (epoch, step)
            for m in range(record["num_micro"]):
                mb = micro[done + m]
                assert (mb["step"], mb["micro"], mb["num_micro"]) == (step, m, record["num_micro"])
                for key in ("tokens", "segment_ids", "positions"):
                    assert (
                        np.array_equal(record[key][m], mb[key])
                        and record[key].dtype == mb[key].dtype
                    )
                assert record["loss_weight"][m] == mb["loss_weight"]
                pieces = record["indices"][m]
                assert pieces[pieces >= 0].tolist() == mb["indices"].tolist()
            done += record["num_micro"]


def test_given_sizes_no_record_is_read_before_its_step():
    data, lengths = samples(64)
    kw = {"global_batch_size": 8, "num_replicas": 2, "rank": 1, "epochs": 2}
    # The Grain source: nothing read at construction; a record reads its step's samples.
    source = CountingSource(data)
    steps = cj.StepSource(source, lengths, **kw)
    assert source.reads == []
    for k in (5, 0, 6):
        before = len(source.reads)
        record = steps[k]
        assert sorted(source.reads[before:]) == sorted(_valid(record))
    packed = CountingSource(data)
    steps = cj.StepSource(packed, lengths, packing=Packing(max_tokens=512, row_length=256), **kw)
    assert packed.reads == [0]  # the first record, for the fields' dtypes and shapes
    # The JAX iterator, unpacked: the same; its buckets are powers of two (the longest
    # sample is not known up front), and num_shapes reads the lengths not read yet.
    source = CountingSource(data)
    it = cj.iterator(source, lengths, **kw)
    assert source.reads == []
    batch = next(it)
    assert sorted(source.reads) == sorted(_valid(batch))
    assert batch["inputs"].shape[1] == 1 << int(batch["lengths"].max() - 1).bit_length()
    assert all(b & (b - 1) == 0 for b in it.bucket_boundaries)
    assert it.num_shapes == len({1 << int(n - 1).bit_length() for n in lengths})
    assert sorted(set(source.reads)) == list(range(64))
    # Without sizes every sample's length is the default size: read once, up front.
    source = CountingSource(data)
    cj.StepSource(source, **kw)
    assert sorted(source.reads) == list(range(64))


def test_a_sample_longer_than_the_buckets_is_named_when_its_step_comes():
    data, lengths = samples(64)
    long = int(np.argmax(lengths))
    steps = cj.StepSource(data, lengths, bucket_boundaries=(8,), **KWARGS, rank=0)
    it = cj.iterator(data, lengths, bucket_boundaries=(8,), **KWARGS, rank=0)
    with pytest.raises(ValueError, match=r"sample \d+ has length \d+ > the largest bucket"):
        for k in range(len(steps)):
            steps[k]
    with pytest.raises(ValueError, match=f"sample {long} has length {lengths[long]}"):
        list(cj.iterator(data, lengths, bucket_boundaries=(lengths.max() - 1,), **KWARGS, rank=0))
    with pytest.raises(ValueError, match="add a boundary"):
        list(it)


def test_dataloader_sharding_selects_the_rank_and_checkpoints_resume_exactly():
    data, lengths = samples(101)
    steps = cj.StepSource(data, lengths, rank=1, **KWARGS)
    sampler = steps.sampler()
    assert repr(sampler) == (
        f"chronica.jax.StepSampler(rank=1, num_replicas=2, digest={steps.scheduler.digest})"
    )

    def loader(source, **kw):
        return grain.DataLoader(data_source=source, sampler=source.sampler(), **kw)

    full = list(loader(steps))
    assert len(full) == len(steps) and all(_same(r, steps[k]) for k, r in enumerate(full))
    explicit = grain.sharding.ShardOptions(shard_index=1, shard_count=2, drop_remainder=True)
    assert len(list(loader(steps, shard_options=explicit))) == len(steps)
    # Mid-epoch 0, at the epoch boundary and mid-epoch 1: the next record is the saved next.
    for cut in (3, steps.steps(0), steps.steps(0) + 2):
        it = iter(loader(steps))
        for _ in range(cut):
            next(it)
        state = it.get_state()
        restored = iter(loader(cj.StepSource(data, lengths, rank=1, **KWARGS)))
        restored.set_state(state)
        rest = list(restored)
        assert len(rest) == len(full) - cut and all(map(_same, rest, full[cut:]))
    # Grain's sharding must be chronica's rank: reading rank 0's records fails loudly.
    nosharding = loader(steps, shard_options=grain.sharding.NoSharding())
    with pytest.raises(ValueError, match="a record of rank 0, from rank 1's StepSource"):
        list(nosharding)
    # A checkpoint of another plan is refused by Grain's own validation.
    other = cj.StepSource(data, lengths, rank=1, **{**KWARGS, "seed": 4})
    with pytest.raises(ValueError, match="does not match"):
        iter(loader(other)).set_state(state)


def test_map_dataset_with_worker_processes_resumes_exactly(absl_flags_parsed):
    data, lengths = samples(101)
    steps = cj.StepSource(data, lengths, rank=0, **KWARGS)
    options = grain.MultiprocessingOptions(num_workers=2)
    dataset = grain.MapDataset.source(steps).to_iter_dataset().mp_prefetch(options)
    it = iter(dataset)
    head = [next(it) for _ in range(RESUME_AT)]
    state = it.get_state()
    tail = list(it)
    it.close()
    restored = iter(dataset)
    restored.set_state(state)
    again = list(restored)
    restored.close()
    assert all(map(_same, head + tail, (steps[k] for k in range(len(steps)))))
    assert len(again) == len(tail) and all(map(_same, again, tail))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "dynamic"}, "kind='dynamic' re-plans"),
        ({"epochs": None}, "epochs"),  # a TypeError
        ({"epochs": 0}, "epochs"),
    ],
)
def test_bad_arguments_fail_early(kwargs, match):
    data, lengths = samples(40)
    error = TypeError if kwargs.get("epochs", 1) is None else ValueError
    with pytest.raises(error, match=match):
        cj.StepSource(data, lengths, **{**KWARGS, "rank": 0, **kwargs})


def test_records_out_of_range_and_reserved_columns():
    data, lengths = samples(40)
    steps = cj.StepSource(data, lengths, rank=0, **KWARGS)
    with pytest.raises(IndexError):
        steps[len(steps)]
    with pytest.raises(ValueError, match="'step' clashes with a batch key"):
        cj.StepSource({"tokens": data, "step": lengths}, lengths, rank=0, **KWARGS)
    with pytest.raises(ValueError, match="'epoch' clashes with a batch key"):
        cj.StepSource([{"tokens": d, "epoch": 0} for d in data], lengths, rank=0, **KWARGS)[0]


def test_importing_chronica_jax_does_not_import_grain():
    code = (
        "import sys, chronica, chronica.jax\nassert 'grain' not in sys.modules, 'grain imported'\n"
    )
    env = base_env(ROOT, JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=scaled(60))


# -- a real 2-process jax.distributed job, Grain DataLoader with worker_count=2 --------------


def test_two_jax_processes_train_on_chronicas_balanced_steps_through_grain_workers(tmp_path):
    outs = [tmp_path / f"rank{i}.json" for i in range(2)]
    port, timeout = free_port(), scaled(150)
    worker = str(HELPERS / "grain_worker.py")
    run_workers(
        [
            [sys.executable, worker, str(port), str(i), str(out), str(timeout)]
            for i, out in enumerate(outs)
        ],
        base_env(ROOT, JAX_PLATFORMS="cpu"),
        timeout=timeout,
    )
    results = sorted((json.loads(out.read_text()) for out in outs), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    data, lengths = samples()
    reference = [
        cj.StepSource(data, lengths, global_batch_size=BATCH, num_replicas=2, rank=r, epochs=EPOCHS)
        for r in range(2)
    ]
    per_epoch = reference[0].steps(0)
    for r in results:
        # Grain ran two workers, and its checkpoint is a position in chronica's records.
        assert r["state"]["worker_count"] == 2 and len(r["state"]["last_seen_indices"]) == 2
        assert len(r["run"]) == EPOCHS * per_epoch
        # Every record is chronica's step, in order: the plan's indices for this rank.
        for k, record in enumerate(r["run"]):
            epoch, step = reference[0].position(k)
            assert (record["epoch"], record["step"]) == (epoch, step)
            assert record["indices"] == reference[0].plan(epoch).local(step, r["rank"]).tolist()
        # Grain's checkpoint after RESUME_AT records (mid-epoch 0) resumes exactly there.
        assert r["resumed"] == r["run"][RESUME_AT:]
    orders = []
    for epoch in range(EPOCHS):
        steps = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
        seen = [i for r in results for record in r["run"][steps] for i in record["indices"]]
        assert sorted(seen) == list(range(len(lengths)))  # exactly once (206 = 2 x 103)
        orders.append(seen)
    assert orders[0] != orders[1]  # another order every epoch
    # What the jitted step received over the global batch: the rows of both processes,
    # equal on both, whose tokens are exactly the planned samples' (global_shape: one shape).
    ratios, unbalanced = [], []
    rng = np.random.default_rng(0)
    for a, b in zip(results[0]["run"], results[1]["run"], strict=True):
        assert a["tokens"] == b["tokens"] and a["owner"] == b["owner"] and a["shape"] == b["shape"]
        rows = a["shape"][0]
        planned = [a["indices"], b["indices"]]
        for p in range(2):
            owners = a["owner"][p * rows : (p + 1) * rows]
            tokens = a["tokens"][p * rows : (p + 1) * rows]
            assert owners[: len(planned[p])] == planned[p]
            assert tokens[: len(planned[p])] == lengths[planned[p]].tolist()
            assert sum(tokens) == lengths[planned[p]].sum()
        if len(planned[0]) == rows:  # full steps: the balance chronica planned is there
            loads = [sum(a["tokens"][:rows]), sum(a["tokens"][rows:])]
            ratios.append(max(loads) / np.mean(loads))
            # the same step's samples dealt to the processes without balancing
            dealt = rng.permutation(planned[0] + planned[1])
            naive = [lengths[dealt[:rows]].sum(), lengths[dealt[rows:]].sum()]
            unbalanced.append(max(naive) / np.mean(naive))
    assert np.mean(ratios) < 1.05 < np.mean(unbalanced)
