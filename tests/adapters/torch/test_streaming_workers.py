"""StreamingDataset.loader(): the main process plans, DataLoader workers read by id and
collate, over MDS shards and parquet row groups. The micro-batches are byte-identical to
the single-process path's at 0, 1 and 2 workers (parquet: 2); the state is the loop's (not
the workers' fetching position) and resumes bitwise in a fresh dataset (parquet's: the
2-process job, test_streaming_workers_dist.py); sources that do not read by id
(WebDataset tars, sources without random access, a length function) are refused naming
why and the fix."""

from __future__ import annotations

import gc
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("chronica.runtime.sources")

from stream_formats import open_source, write_dataset  # noqa: E402
from stream_source import make_source  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from chronica.adapters.torch.streaming_workers import (  # noqa: E402
    StreamDecoder,
    StreamPlanSampler,
)
from chronica.core.packing import Packing  # noqa: E402
from chronica.runtime.sources import ParquetSource  # noqa: E402
from chronica.runtime.streaming import StreamingEngine  # noqa: E402
from chronica.torch import StreamingDataset  # noqa: E402

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 1}
FIELDS = ("indices", "input_ids", "position_ids", "segment_ids", "cu_seqlens", "labels")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The test stream in a format (``stream_formats``): its source and token key, written
    once per module."""
    written = {}

    def get(kind):
        if kind not in written:
            folder = tmp_path_factory.mktemp(kind) / "data"
            write_dataset(kind, folder)
            written[kind] = open_source(kind, folder)
        return written[kind]

    return get


@pytest.fixture(scope="module")
def mds(datasets):
    return datasets("mds")


def _signature(batch):
    tensors = tuple(batch[f].numpy().tobytes() for f in FIELDS)
    scalars = ("loss_weight", "step", "micro", "num_micro", "last", "epoch", "num_tokens")
    return tensors + tuple(batch[k] for k in scalars) + (batch["max_seqlen"],)


def _dataset(source, key, **extra):
    return StreamingDataset(source, PACKING, key=key, **OPTIONS, **extra)


def _single_process(source, key, **extra):
    return [_signature(b) for b in DataLoader(_dataset(source, key, **extra), batch_size=None)]


# Parquet at 2 workers only (its resume: the 2-process job): the loader's machinery is the
# same whatever the format.
@pytest.mark.parametrize(("kind", "workers"), [("mds", 0), ("mds", 1), ("mds", 2), ("parquet", 2)])
def test_micro_batches_are_the_single_process_ones_byte_for_byte(datasets, kind, workers):
    source, key = datasets(kind)
    expected = _single_process(source, key)
    dataset = _dataset(source, key)
    assert [_signature(b) for b in dataset.loader(num_workers=workers)] == expected
    again = [_signature(b) for b in dataset.loader(num_workers=workers)]  # the next pass
    assert len(again) > 0 and {b[-3] for b in again} == {1}  # its epoch


def test_padding_is_the_single_process_ones(mds):
    source, key = mds
    expected = _single_process(source, key, pad_to=1024)
    loader = _dataset(source, key, pad_to=1024).loader(num_workers=1, prefetch_factor=3)
    assert [_signature(b) for b in loader] == expected


def _first(loader, count):
    part = []
    for batch in loader:
        part.append(_signature(batch))
        if len(part) == count:
            return part
    raise AssertionError(f"the pass has fewer than {count} micro-batches")


@pytest.mark.parametrize("workers", [1, 2])
def test_state_is_the_loops_and_resumes_bitwise(mds, workers):
    source, key = mds
    full = _single_process(source, key)
    for cut in (1, 7, 20):  # 7 and 20: mid-window, behind what the workers fetched
        plain = _dataset(source, key)
        _first(DataLoader(plain, batch_size=None), cut)
        dataset = _dataset(source, key)
        part = _first(dataset.loader(num_workers=workers, prefetch_factor=2), cut)
        gc.collect()  # the loop's iterator is gone: its count of batches with it
        state = dataset.state_dict()
        assert state == plain.state_dict()  # the loop's position, ...
        assert dataset.engine.state_dict() != state  # ... not where the workers' fetching is
        plain.close()
        dataset.close()
        resumed = _dataset(source, key)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        rest = [_signature(b) for b in resumed.loader(num_workers=workers)]
        assert part + rest == full


def test_persistent_workers_count_every_pass_afresh(mds):
    source, key = mds
    plain = _dataset(source, key)
    first = [_signature(b) for b in DataLoader(plain, batch_size=None)]
    second = _first(DataLoader(plain, batch_size=None), 5)  # the next pass
    dataset = _dataset(source, key)
    loader = dataset.loader(num_workers=1, persistent_workers=True)
    assert [_signature(b) for b in loader] == first
    assert _first(loader, 5) == second
    gc.collect()
    assert dataset.state_dict() == plain.state_dict()
    plain.close()
    dataset.close()


def test_a_resumed_loader_keeps_its_sampler(mds):
    source, key = mds
    full = _single_process(source, key)
    dataset = _dataset(source, key)
    loader = dataset.loader(num_workers=1)
    part = _first(loader, 9)
    state = dataset.state_dict()
    dataset.load_state_dict(state)  # the same loader goes on from the state
    assert dataset.state_dict() == state
    assert part + [_signature(b) for b in loader] == full


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("tar", "cannot read lengths without records"),  # a length inside every sample
        ("no random access", "has no random access"),  # records travel by the all-to-all
        ("length function", "cannot read lengths without records"),
    ],
)
def test_sources_that_do_not_read_by_id_are_refused_naming_why_and_the_fix(datasets, kind, why):
    if kind == "tar":
        source, _ = datasets("tar")
    elif kind == "no random access":
        source = make_source(random_access=False)
    else:
        files = datasets("parquet")[0].files
        source = ParquetSource(files, length=lambda record: len(record["input_ids"]))
    dataset = StreamingDataset(source, PACKING, **OPTIONS)
    with pytest.raises(ValueError, match=why) as error:
        dataset.loader(num_workers=1)
    assert "DataLoader(dataset, batch_size=None, num_workers=0)" in str(error.value)
    assert "ParquetSource" in str(error.value)
    with pytest.raises(ValueError, match="decode=False"):
        StreamingEngine(source, dataset.engine.config, dataset.engine.collectives,
                        decode=False)  # fmt: skip


def test_loader_arguments_and_the_planning_dataset_guard(mds):
    source, key = mds
    dataset = _dataset(source, key)
    with pytest.raises(ValueError, match="sets \\['collate_fn'\\] itself"):
        dataset.loader(num_workers=1, collate_fn=list)
    with pytest.raises(TypeError, match="num_workers must be an int"):
        dataset.loader(num_workers=1.5)
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        dataset.loader(num_workers=-1)
    loader = dataset.loader(num_workers=0)
    assert isinstance(loader.batch_sampler, StreamPlanSampler)
    assert isinstance(loader.dataset, StreamDecoder)
    assert "decode" not in repr(loader.dataset) and "StreamPlanSampler(" in repr(
        loader.batch_sampler
    )
    with pytest.raises(ValueError, match="iterate the loader"):
        next(iter(dataset))
    with pytest.raises(TypeError, match="__getitems__"):
        loader.dataset[0]


def test_the_sampler_sends_each_plan_as_bytes_that_decode_to_the_engines_micro_batch(mds):
    """What the index queue carries: bytes (a fraction of an object's pickling time), each
    the engine's planned micro-batch whole; the decoder collates a plan given either way
    to the same micro-batch."""
    source, key = mds
    config = _dataset(source, key).engine.config
    planned = StreamingEngine(source, config, _dataset(source, key).engine.collectives,
                              decode=False)  # fmt: skip
    expected = list(planned.micro_batches())
    engine = StreamingEngine(source, config, planned.collectives, decode=False)
    sent = list(StreamPlanSampler(engine))
    assert sent and all(type(plan) is bytes for plan in sent)
    decoder = StreamDecoder(source, key, None)
    for plan, batch in zip(sent, expected, strict=True):
        back = type(batch).from_plan_bytes(plan)
        assert back.__dict__.keys() == batch.__dict__.keys() and back.records == []
        assert back.ids.tolist() == batch.ids.tolist() and back.rows.tolist() == batch.rows.tolist()
        assert (back.step, back.micro, back.num_micro, back.loss_weight, back.epoch) == (
            batch.step, batch.micro, batch.num_micro, batch.loss_weight, batch.epoch)  # fmt: skip
        by_bytes, by_object = decoder.__getitems__(plan), decoder.__getitems__(batch)
        assert [by_bytes[f].tolist() for f in FIELDS] == [by_object[f].tolist() for f in FIELDS]
