"""chronica under Hugging Face accelerate, the transformers Trainer, datasets and torchdata.

A real 2-process job (``tests/helpers/hf_worker.py``, torchrun's variables, gloo on CPU)
checks what the training code received: the errors of a second sharding, exactly-once
coverage and new orders per epoch through ``chronica.torch.hf.prepare`` and ``Trainer``, the
planned (balanced) batches, accelerate's ``skip_first_batches`` and the Trainer's
``resume_from_checkpoint`` continuing exactly mid-epoch, and the Trainer on a
``StreamingDataset`` (the step's global loss, resumed bitwise mid-window). In-process tests
cover sizes read from Arrow columns and ``StatefulDataLoader``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from integration_checks import WORLD, assert_balanced, assert_once, planned, run_job

from chronica.torch.utils.data import DistributedBatchSampler, DistributedSampler

datasets = pytest.importorskip("datasets")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

GLOBAL_BATCH, EPOCHS, SKIP = 8, 2, 4  # as in hf_worker


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    return run_job("hf_worker.py", tmp_path_factory.mktemp("hf"), "torchrun")


@pytest.fixture(scope="module")
def plan(job) -> list:
    return planned(job[0]["sizes"], GLOBAL_BATCH, EPOCHS)


def _split(batches: list, plan_of_rank: list) -> list[list]:
    """A rank's received batches cut into epochs of the planned lengths."""
    first = len(plan_of_rank[0])
    return [batches[:first], batches[first:]]


@pytest.mark.parametrize("scenario", ["accelerate", "accelerate_batches", "trainer", "custom"])
def test_hf_trains_every_sample_once_per_epoch_in_new_orders(job, plan, scenario):
    n = len(job[0]["sizes"])
    received = [_split(result[scenario], plan[rank]) for rank, result in enumerate(job)]
    for epoch in range(EPOCHS):
        assert_once([rank[epoch] for rank in received], n)
    for rank in received:
        assert rank[0] != rank[1]


@pytest.mark.parametrize("scenario", ["accelerate", "accelerate_batches", "trainer", "custom"])
def test_hf_training_receives_the_planned_balanced_batches(job, plan, scenario):
    for rank in range(WORLD):
        assert job[rank][scenario] == plan[rank][0] + plan[rank][1]
    assert_balanced([plan[rank][0] for rank in range(WORLD)], job[0]["sizes"])


def test_hf_resumes_exactly_mid_epoch(job, plan):
    for rank, result in enumerate(job):
        whole = plan[rank][0] + plan[rank][1]
        assert result["skipped"] == plan[rank][1][SKIP:]  # accelerate.skip_first_batches
        stop = result["stop"]
        assert len(plan[rank][0]) < stop < len(whole)  # mid-epoch 1
        assert result["stopped"] == whole[:stop]
        assert result["resumed"] == whole[stop:]  # Trainer(resume_from_checkpoint=True)


def test_a_plain_trainer_with_its_own_loader_fails_loudly_instead_of_repeating_an_epoch(job):
    for result in job:
        assert "without set_epoch" in result["refused_custom"]


def test_packed_trainer_on_2_processes_trains_every_document_once_with_the_unpacked_loss(job):
    from packed_trainer import DOCUMENTS, EPOCHS

    assert_packed_steps([result["packed"] for result in job], DOCUMENTS, EPOCHS)


def test_trainer_trains_a_stream_with_the_global_loss_and_resumes_it_bitwise(job):
    from stream_trainer import MAX_STEPS, STOP

    runs = [result["streamed"] for result in job]
    lengths = runs[0]["lengths"]
    full = [run["full"]["steps"] for run in runs]
    assert [[s[1] for s in steps] for steps in full] == [list(range(MAX_STEPS))] * WORLD
    for steps in zip(*full, strict=True):  # one step on every rank
        assert len({s[3] for s in steps}) == 1  # the same micro-batch count on every rank
        assert all(s[4] == s[3] for s in steps)  # all of them in the Trainer's batch
        labelled = sum(runs[0]["loss_tokens"][d] for s in steps for d in s[2])
        assert labelled < sum(lengths[d] - 1 for s in steps for d in s[2])  # prompts masked
        for _, _, _, _, _, packed, reference, scale in steps:
            assert scale == 1.0 / labelled  # the step's loss-bearing tokens on every rank
            assert abs(packed - reference) <= 1e-5 * max(1.0, abs(reference))
    first_pass = sorted(d for steps in full for s in steps if s[0] == 0 for d in s[2])
    assert first_pass == list(range(len(lengths)))  # every document once
    assert {s[0] for s in full[0]} == {0, 1}  # max_steps runs into the second pass
    for run in runs:  # stopped mid-window (2 steps a window), resumed by a new Trainer
        stopped, resumed = run["stopped"]["steps"], run["resumed"]["steps"]
        assert len(stopped) == STOP and STOP % 2 == 1
        assert [s[:3] for s in stopped + resumed] == [s[:3] for s in run["full"]["steps"]]
        assert run["resumed"]["params"] == run["full"]["params"] != run["stopped"]["params"]
    assert runs[0]["full"]["params"] == runs[1]["full"]["params"]
    dynamic = [run["dynamic"]["steps"] for run in runs]  # kind="dynamic": the same promises
    assert [[s[1] for s in steps] for steps in dynamic] == [list(range(MAX_STEPS))] * WORLD
    for steps in zip(*dynamic, strict=True):
        assert len({s[3] for s in steps}) == 1 and all(s[4] == s[3] for s in steps)
    first_pass = sorted(d for steps in dynamic for s in steps if s[0] == 0 for d in s[2])
    assert first_pass == list(range(len(lengths)))
    speeds = [run["dynamic"]["speeds"] for run in runs]  # fitted from the reported times
    assert speeds[0] == speeds[1] and len(speeds[0]) == WORLD


def test_hf_second_sharding_fails_loudly(job):
    for result in job:
        assert "chronica.torch.hf.prepare(accelerator" in result["refused_accelerate"]
        assert "chronica.torch.hf.Trainer" in result["refused_trainer"]


def test_a_streamed_dataset_under_accelerate_trains_every_sample_once_on_both_ranks(job):
    for result in job:
        assert "dispatch_batches=False" in result["refused_stream"]
    streams = [result["stream"] for result in job]
    ids = sorted(i for stream in streams for *_, batch in stream for i in batch)
    assert ids == list(range(job[0]["stream_samples"]))
    # The same steps, and in each the same number of micro-batches, on every rank.
    shapes = [[(step, micro, count) for step, micro, count, _ in stream] for stream in streams]
    assert shapes[0] == shapes[1] and len(shapes[0]) > 2


# -- in one process ---------------------------------------------------------------------------


def _table(n: int, seed: int = 0):
    lengths = np.random.default_rng(seed).integers(1, 500, n)
    return datasets.Dataset.from_dict({"length": lengths, "id": np.arange(n)}), lengths


def test_sizes_from_a_million_row_column_are_read_through_arrow_not_row_by_row(monkeypatch):
    from chronica.adapters.hf import arrow_sizes

    table, lengths = _table(1_000_000)
    inputs = ("length", table["length"], table.data.column("length"))

    def row_by_row(*args, **kwargs):
        raise AssertionError("sizes were read row by row (tens of seconds per million rows)")

    # Every Python-level path to the rows fails: only a read through Arrow gets the values.
    for kind in (datasets.Dataset, type(inputs[1])):
        for name in ("__iter__", "__getitem__", "__array__"):
            if hasattr(kind, name):
                monkeypatch.setattr(kind, name, row_by_row)
    for sizes in inputs:
        np.testing.assert_array_equal(arrow_sizes(table, sizes), lengths)


def test_sizes_from_columns_follow_the_rows_the_dataset_shows():
    table, _ = _table(300)
    view = table.shuffle(seed=3).select(range(0, 300, 2)).filter(lambda row: row["id"] % 3)
    sampler = DistributedSampler(view, 2, 0, batch_size=10, sizes="length")
    expected = np.array([row["length"] for row in view], dtype=np.float64)
    np.testing.assert_array_equal(sampler.scheduler.sizes, expected)
    again = DistributedSampler(view, 2, 0, batch_size=10, sizes=view["length"])
    assert again.scheduler.digest == sampler.scheduler.digest
    tokens = datasets.Dataset.from_dict({"input_ids": [[1] * k for k in (3, 1, 4)]})
    text = datasets.Dataset.from_dict({"text": ["ab", "", "héllo"]})
    from chronica.adapters.hf import arrow_sizes

    np.testing.assert_array_equal(arrow_sizes(tokens, "input_ids"), [3, 1, 4])
    np.testing.assert_array_equal(arrow_sizes(text, "text"), [2, 0, 5])


def test_bad_size_columns_are_refused_with_the_fix():
    table, _ = _table(20)
    with pytest.raises(ValueError, match="not a column of the data set; its columns are"):
        DistributedSampler(table, 2, 0, batch_size=4, sizes="tokens")
    with pytest.raises(ValueError, match=r"needs a Hugging Face datasets\.Dataset"):
        DistributedSampler(range(20), 2, 0, batch_size=4, sizes="length")
    holes = datasets.Dataset.from_dict({"length": [1, None, 3, 4]})
    with pytest.raises(ValueError, match="1 missing values"):
        DistributedSampler(holes, 2, 0, batch_size=2, sizes="length")
    with pytest.warns(UserWarning, match=r"every sample weighs 1.*one of \['length', 'id'\]"):
        DistributedSampler(table, 2, 0, batch_size=4)


@pytest.mark.parametrize("batches,workers", [(False, 0), (True, 0), (False, 2)])
def test_stateful_dataloader_resumes_the_sampler_mid_epoch(batches, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    sizes = np.random.default_rng(4).lognormal(3, 1, 120)
    data = torch.utils.data.TensorDataset(torch.arange(120))

    def loader():
        if batches:
            sampler = DistributedBatchSampler(data, 12, 2, 1, sizes=sizes)
            return stateful.StatefulDataLoader(data, batch_sampler=sampler, num_workers=workers)
        sampler = DistributedSampler(data, 2, 1, batch_size=12, sizes=sizes)
        return stateful.StatefulDataLoader(data, batch_size=6, sampler=sampler, num_workers=workers)

    def take(source, count=None):
        out = []
        for (batch,) in source:
            out.append(batch.tolist())
            if len(out) == count:
                break
        return out

    whole = loader()
    whole.sampler.set_epoch(1) if not batches else whole.batch_sampler.set_epoch(1)
    expected = take(whole)
    first = loader()
    first.sampler.set_epoch(1) if not batches else first.batch_sampler.set_epoch(1)
    head = take(first, 4)
    state = first.state_dict()
    resumed = loader()  # a new process: a new loader and sampler at epoch 0
    resumed.load_state_dict(state)
    assert head + take(resumed) == expected
    with pytest.raises(RuntimeError, match="without set_epoch"):
        take(resumed)  # the same epoch again would repeat its order: refused


@pytest.mark.parametrize("batches", [False, True])
def test_unshard_passes_the_planned_batches_through_accelerates_shard(batches):
    from accelerate.data_loader import prepare_data_loader, skip_first_batches

    from chronica.torch.hf import unshard

    sizes = np.random.default_rng(5).lognormal(3, 1, 100)  # 6 steps of 16, then 4 samples
    data = torch.utils.data.TensorDataset(torch.arange(100))

    def loader():
        if batches:
            sampler = DistributedBatchSampler(data, 16, 2, 1, sizes=sizes)
            return torch.utils.data.DataLoader(data, batch_sampler=sampler)
        sampler = DistributedSampler(data, 2, 1, batch_size=16, sizes=sizes)
        return torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)

    def epoch(source, number):
        source.set_epoch(number)  # accelerate's loaders pass it on
        return [batch.tolist() for (batch,) in source]

    plain = loader()
    plain.set_epoch = (plain.batch_sampler if batches else plain.sampler).set_epoch
    expected = [epoch(plain, number) for number in (0, 1)]
    assert [len(b) for b in expected[0]] == [8] * 6 + [2]
    prepared = prepare_data_loader(loader(), num_processes=2, process_index=1)
    with pytest.raises(ValueError, match="a second time"):
        next(iter(prepared))
    unshard(prepared)
    assert len(prepared) == len(expected[0])
    assert [epoch(prepared, 0), epoch(prepared, 1)] == expected
    assert epoch(skip_first_batches(prepared, 3), 1) == expected[1][3:]


def test_unshard_passes_a_streamed_rank_through_accelerates_iterable_shard():
    from accelerate.data_loader import prepare_data_loader
    from stream_source import make_source
    from torch.utils.data import DataLoader

    from chronica import Packing
    from chronica.torch import StreamingDataset
    from chronica.torch.hf import unshard

    def loader():
        stream = StreamingDataset(make_source(), Packing(max_tokens=1024), batch_size=12)
        return DataLoader(stream, batch_size=None)

    def seen(source):
        return [(b["step"], b["micro"], b["indices"].tolist()) for b in source]

    expected = seen(loader())
    assert len({i for _, _, ids in expected for i in ids}) == sum(len(x) for *_, x in expected)
    # accelerate shards an iterable data set a second time, and cannot take batch_size=None.
    prepared = prepare_data_loader(loader(), num_processes=2, process_index=1)
    with pytest.raises(TypeError):
        next(iter(prepared))
    assert seen(unshard(prepare_data_loader(loader(), num_processes=2, process_index=1))) == (
        expected
    )
    dispatched = prepare_data_loader(
        loader(), num_processes=2, process_index=1, put_on_device=True, dispatch_batches=True
    )
    with pytest.raises(ValueError, match=r"StreamingDataset yields .*dispatch_batches=False"):
        unshard(dispatched)


def test_trainer_builds_the_sampler_from_its_arguments(tmp_path):
    import transformers

    from chronica.torch.hf import Trainer

    table, lengths = _table(40)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        data_seed=7,
        train_sampling_strategy="group_by_length",
        remove_unused_columns=False,
    )
    model = torch.nn.Linear(1, 1)
    trainer = Trainer(model=model, args=args, train_dataset=table, scheduling={"cost": "linear"})
    with pytest.warns(UserWarning, match="train_sampling_strategy='group_by_length' is replaced"):
        loader = trainer.get_train_dataloader()
    sampler = trainer.train_sampler
    assert (sampler.global_batch_size, sampler.seed) == (4, 7)  # one process here
    np.testing.assert_array_equal(sampler.scheduler.sizes, lengths)  # the "length" column
    assert [batch["id"].tolist() for batch in loader] == [
        sampler.plan().local(s, 0).tolist() for s in range(10)
    ]
    with pytest.raises(ValueError, match=r"cannot set \['batch_size'\]"):
        Trainer(model=model, args=args, train_dataset=table, scheduling={"batch_size": 8})

    from stream_source import make_source

    from chronica import Packing
    from chronica.torch import StreamingDataset

    stream = StreamingDataset(make_source(), Packing(max_tokens=1024), batch_size=12)

    def streamed(scheduling=None, **options):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to=[], **options
        )
        return Trainer(model=model, args=args, train_dataset=stream, scheduling=scheduling)

    with pytest.raises(ValueError, match="max_steps"):
        streamed()  # a stream has no length
    refused = {
        "scheduling=": streamed({"cost": "linear"}, max_steps=3),
        "gradient_accumulation_steps": streamed(max_steps=3, gradient_accumulation_steps=2),
        "dataloader_num_workers": streamed(max_steps=3, dataloader_num_workers=2),
        "dispatch_batches": streamed(max_steps=3, accelerator_config={"dispatch_batches": True}),
    }
    for name, trainer in refused.items():
        with pytest.raises(ValueError, match=f"StreamingDataset: {name}: "):
            trainer.get_train_dataloader()
    steps = list(streamed(max_steps=3).get_train_dataloader())
    assert [[m["micro"] for m in step] for step in steps] == [
        list(range(step[0]["num_micro"])) for step in steps
    ]
    assert len({step[0]["step"] for step in steps}) == len(steps) > 2  # one step per item


def test_packed_trainer_trains_every_document_once_with_the_unpacked_loss(tmp_path):
    from packed_trainer import DOCUMENTS, EPOCHS, train

    steps = train(str(tmp_path))
    assert_packed_steps([steps], DOCUMENTS, EPOCHS)


def assert_packed_steps(ranks: list[list[list]], documents: int, epochs: int) -> None:
    """Every document once per epoch over the ranks, every rank the same steps, and every
    step's packed loss equal to the unpacked reference within 1e-5."""
    for epoch in range(epochs):
        mine = [[s for s in steps if s[0] == epoch] for steps in ranks]
        assert len({len(m) for m in mine}) == 1
        trained = sorted(d for m in mine for s in m for d in s[2])
        assert trained == list(range(documents))
    for steps in ranks:
        for _, _, _, packed, reference in steps:
            assert abs(packed - reference) <= 1e-5 * max(1.0, abs(reference))


def test_a_streamed_step_is_normalised_over_every_rank_and_its_position_saved(tmp_path):
    from stream_source import make_source

    from chronica import Packing
    from chronica.adapters.torch.hf_stream import (
        StreamSteps,
        load_stream_state,
        save_stream_state,
        stream_step_norms,
    )
    from chronica.torch import StreamingDataset

    def stream():
        return StreamingDataset(make_source(), Packing(max_tokens=1024), batch_size=12)

    first = stream()
    step = next(iter(StreamSteps(first)))
    pieces = [
        (d, n)
        for micro in step
        for d, n in zip(
            micro["indices"].tolist(), torch.diff(micro["cu_seqlens"]).tolist(), strict=True
        )
    ]
    assert all(n > 1 for _, n in pieces)

    def twice(counts):  # the sum over two ranks, as if the other held as much
        return counts * 2

    assert stream_step_norms(step, "token", twice) == (1 / (2 * sum(n - 1 for _, n in pieces)), {})
    scale, per_document = stream_step_norms(step, "sample", twice)
    assert scale == 1 / (2 * len(pieces))
    assert per_document == {d: 1 / (n - 1) for d, n in pieces}
    with pytest.raises(ValueError, match=r"chronica_stream_0\.json is missing"):
        load_stream_state(first, str(tmp_path), 0)
    save_stream_state(first, str(tmp_path), 0)
    first.close()
    again = stream()
    load_stream_state(again, str(tmp_path), 0)
    whole = [s[0]["step"] for s in StreamSteps(stream())]
    assert [s[0]["step"] for s in StreamSteps(again)] == whole[1:]


def _sft_documents(count: int, seed: int) -> list[dict]:
    """Documents of 2..39 tokens whose first ``prompt`` tokens are a prompt (labels -100),
    a few wholly masked, as supervised fine-tuning data is."""
    rng = np.random.default_rng(seed)
    out = []
    for n in rng.integers(2, 40, size=count):
        tokens = rng.integers(1, 64, n)
        prompt = int(rng.integers(0, n + 1))
        labels = np.where(np.arange(n) < prompt, -100, tokens)
        out.append({"input_ids": tokens.tolist(), "labels": labels.tolist()})
    return out


def _reference_gradient(model, documents: list[dict], loss: str) -> list[torch.Tensor]:
    """The gradient of the plain mean loss over the labelled tokens of ``documents``, each
    run alone through the model (no chronica): ``"token"``, over all their tokens;
    ``"sample"``, the mean over documents (with one) of their mean."""
    model.zero_grad()
    sums, counts = [], []
    for document in documents:
        ids = torch.tensor(document["input_ids"])[None]
        labels = torch.tensor(document["labels"])[1:]
        logits = model(input_ids=ids).logits[0, :-1]
        losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        sums.append(losses.sum())  # cross_entropy gives 0 where the label is -100
        counts.append(int((labels != -100).sum()))
    if loss == "token":
        total = torch.stack(sums).sum() / sum(counts)
    else:
        means = [s / c for s, c in zip(sums, counts, strict=True) if c]
        total = torch.stack(means).mean()
    total.backward()
    return [p.grad.clone() for p in model.parameters()]


def _packed_gradient(model, micro_batches: list[dict], loss: str) -> list[torch.Tensor]:
    """The gradient chronica's Trainer accumulates over one step's micro-batches (1 rank)."""
    import contextlib

    from chronica.adapters.torch.hf_packed import labelled_step_norms, packed_step_loss

    model.zero_grad()
    norms = labelled_step_norms(micro_batches, loss, lambda t: t)
    packed_step_loss(
        model, micro_batches, norms, 1, lambda t: t.backward(), contextlib.nullcontext,
        torch.device("cpu"),
    )  # fmt: skip
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("loss", ["token", "sample"])
def test_sft_labels_give_the_gradient_of_the_mean_over_labelled_tokens(loss):
    from packed_trainer import model as tiny_model
    from torch.utils.data import DataLoader

    from chronica import Packing
    from chronica.adapters.torch.hf_packed import PackedSteps, collate_steps
    from chronica.torch.utils.data import PackedDataset

    documents = _sft_documents(24, seed=1)
    lengths = [len(d["input_ids"]) for d in documents]
    batches = DistributedBatchSampler(
        documents, 8, sizes=lengths, packing=Packing(max_tokens=64, loss=loss),
        num_replicas=1, rank=0, seed=2,
    )  # fmt: skip
    loader = DataLoader(
        PackedDataset(documents), batch_sampler=PackedSteps(batches), collate_fn=collate_steps
    )
    model = tiny_model().double()
    steps = list(loader)
    assert any(len(step) > 1 for step in steps)  # accumulated over micro-batches
    for step in steps:
        trained = [documents[int(d)] for micro in step for d in micro["indices"]]
        packed = _packed_gradient(model, step, loss)
        reference = _reference_gradient(model, trained, loss)
        for got, want in zip(packed, reference, strict=True):
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_a_stream_of_sft_records_gives_the_gradient_of_the_mean_over_labelled_tokens():
    from packed_trainer import model as tiny_model
    from stream_source import ListSource

    from chronica import Packing
    from chronica.adapters.torch.hf_stream import StreamSteps
    from chronica.torch import StreamingDataset

    documents = _sft_documents(30, seed=5)

    class Records(ListSource):  # record i is documents[i]
        def _record(self, shard, row):
            document = documents[int(self.offsets[shard] + row)]
            return {k: np.asarray(v) for k, v in document.items()}

    source = Records([[len(d["input_ids"]) for d in documents[i : i + 10]] for i in (0, 10, 20)])
    stream = StreamingDataset(source, Packing(max_tokens=64), batch_size=10, buffer_size=4)
    model = tiny_model().double()
    steps = list(StreamSteps(stream))
    assert sorted(int(d) for s in steps for m in s for d in m["indices"]) == list(range(30))
    for step in steps:
        trained = [documents[int(d)] for micro in step for d in micro["indices"]]
        for got, want in zip(
            _packed_gradient(model, step, "token"),
            _reference_gradient(model, trained, "token"),
            strict=True,
        ):
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_collated_labels_mask_prompts_and_every_pieces_first_token():
    from chronica.torch.utils.data import PackedIndex, collate_packed

    document = {"input_ids": list(range(10, 20)), "labels": [-100] * 3 + list(range(13, 20))}
    pieces = [(document, PackedIndex(0, 0, 4, 0, 0, 0, 1, 1.0)),
              (document, PackedIndex(0, 4, 6, 1, 0, 0, 1, 1.0)),
              ([7, 8, 9], PackedIndex(1, 0, 3, 1, 0, 0, 1, 1.0))]  # fmt: skip
    out = collate_packed(pieces, pad_to=16)
    assert out["labels"].tolist() == (
        [-100, -100, -100, 13] + [-100, 15, 16, 17, 18, 19] + [-100, 8, 9] + [-100] * 3
    )
    with pytest.raises(ValueError, match="labels are aligned"):
        collate_packed([({"input_ids": [1, 2, 3, 4], "labels": [1]}, pieces[0][1])])
