"""StreamingDataset in one process: collated packed micro-batches, StatefulDataLoader
resume bitwise, and the worker-process guard."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from stream_source import make_source  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from chronica.core import ScheduleConfig  # noqa: E402
from chronica.core.packing import Packing  # noqa: E402
from chronica.core.streaming import StreamOptions  # noqa: E402
from chronica.torch import StreamingDataset  # noqa: E402

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 1}


def _signature(batch):
    return (
        batch["indices"].tolist(), batch["cu_seqlens"].tolist(), batch["input_ids"].tolist(),
        batch["loss_weight"], batch["step"], batch["micro"], batch["epoch"],
    )  # fmt: skip


def test_micro_batches_are_packed_rows_of_the_stream():
    source = make_source()
    batches = list(DataLoader(StreamingDataset(source, PACKING, **OPTIONS), batch_size=None))
    seen = sorted(i for b in batches for i in b["indices"].tolist())
    assert seen == list(range(int(source.offsets[-1])))
    weights = {}
    for b in batches:
        lengths = torch.diff(b["cu_seqlens"]).tolist()
        assert sum(lengths) == b["num_tokens"] <= 1024
        for doc, start, n in zip(
            b["indices"].tolist(), b["cu_seqlens"][:-1].tolist(), lengths, strict=True
        ):
            assert b["input_ids"][start : start + n].eq(doc).all()
            assert b["position_ids"][start : start + n].tolist() == list(range(n))
        weights[b["step"]] = weights.get(b["step"], 0.0) + b["loss_weight"]
        assert b["last"] == (b["micro"] == b["num_micro"] - 1)
    assert all(abs(w - 1.0) < 1e-9 for w in weights.values())


def test_stateful_dataloader_resumes_bitwise():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    source = make_source(random_access=False)
    full = [
        _signature(b)
        for b in stateful.StatefulDataLoader(
            StreamingDataset(source, PACKING, **OPTIONS), batch_size=None
        )
    ]
    loader = stateful.StatefulDataLoader(
        StreamingDataset(source, PACKING, **OPTIONS), batch_size=None
    )
    part = []
    for batch in loader:
        part.append(_signature(batch))
        if len(part) == 9:
            break
    state = loader.state_dict()
    again = stateful.StatefulDataLoader(
        StreamingDataset(source, PACKING, **OPTIONS), batch_size=None
    )
    again.load_state_dict(state)
    assert part + [_signature(b) for b in again] == full


def test_pad_to_and_the_worker_guard():
    dataset = StreamingDataset(make_source(), PACKING, pad_to=1024, **OPTIONS)
    batch = next(iter(dataset))
    assert batch["input_ids"].shape == (1024,) and "StreamingDataset(StreamingEngine(" in repr(
        dataset
    )
    with pytest.raises(ValueError, match="num_workers=0"):
        next(iter(DataLoader(dataset, batch_size=None, num_workers=1)))


def test_whole_options_objects_give_the_keywords_stream():
    source = make_source()
    by_keywords = [_signature(b) for b in StreamingDataset(source, PACKING, **OPTIONS)]
    config = ScheduleConfig(num_replicas=1, batch_size=12, seed=1, packing=PACKING)
    whole = StreamingDataset(source, config=config, stream=StreamOptions(buffer_size=6))
    assert [_signature(b) for b in whole] == by_keywords
    assert "buffer_size=6" in repr(whole) and "seed=1" in repr(whole)
    parameters = inspect.signature(StreamingDataset).parameters
    assert {"buffer_size", "window_steps", "infinite", "kind", "seed"} <= set(parameters)
    with pytest.raises(ValueError, match="buffer_size inside it"):
        StreamingDataset(source, PACKING, batch_size=12, buffer_size=6, stream=StreamOptions())
    with pytest.raises(ValueError, match=r"shuffle=.*buffer_size"):
        StreamingDataset(source, PACKING, batch_size=12, shuffle=False)


def test_a_trainer_reading_ahead_resumes_after_the_micro_batch_it_trained():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    source = make_source()
    full = [_signature(b) for b in StreamingDataset(source, PACKING, **OPTIONS)]
    stream = StreamingDataset(source, PACKING, **OPTIONS)
    loader = stateful.StatefulDataLoader(stream, batch_size=None)
    batches = iter(loader)
    trained = [next(batches)]  # read before tracking starts, as Lightning's first batch is
    stream.track_trained(depth=2)
    ahead = next(batches)  # a trainer reading one micro-batch ahead
    stream.trained(trained[0])
    for _ in range(6):
        trained.append(ahead)
        ahead = next(batches)
        stream.trained(trained[-1])
    state = loader.state_dict()  # one micro-batch past the last one trained
    again = stateful.StatefulDataLoader(StreamingDataset(source, PACKING, **OPTIONS), None)
    again.load_state_dict(state)
    assert [_signature(b) for b in trained] + [_signature(b) for b in again] == full
    stale = trained[-2]  # two micro-batches were read after it: out of a ring of 2
    with pytest.raises(ValueError, match="is not kept"):
        stream.trained(stale)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        stream.track_trained(0)
    untracked = StreamingDataset(source, PACKING, **OPTIONS)
    with pytest.raises(ValueError, match="call track_trained"):
        untracked.trained(next(iter(untracked)))
