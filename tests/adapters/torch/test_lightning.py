"""Lightning's Trainer (its ddp strategy on gloo, 2 CPU processes) with chronica's samplers.

One real job (``tests/helpers/lightning_worker.py``) runs every scenario; the tests below
check what its training steps received: exactly-once coverage per epoch, a new order each
epoch, the batches chronica planned (so the planned balance), an exact mid-epoch resume
through Lightning's own checkpoint of a ``StatefulDataLoader`` (over a sampler, and over
a stream, bitwise, one step per ``training_step`` or one micro-batch per ``training_step``
with ``StreamCheckpoint``), and the error a batch sampler gets under Lightning's default
``use_distributed_sampler=True``.
"""

from __future__ import annotations

import pytest
from integration_checks import WORLD, assert_balanced, assert_once, planned, run_job

pytest.importorskip("lightning")
pytest.importorskip("torchdata")

GLOBAL_BATCH, EPOCHS = 8, 2  # as in lightning_worker


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    return run_job("lightning_worker.py", tmp_path_factory.mktemp("lightning"), "lightning")


@pytest.fixture(scope="module")
def plan(job) -> list:
    return planned(job[0]["sizes"], GLOBAL_BATCH, EPOCHS)


def _epochs(result: dict, scenario: str) -> list[list[list[int]]]:
    """``[epoch][step]`` batches a rank's training_step received in ``scenario``."""
    out: list[list[list[int]]] = [[] for _ in range(EPOCHS)]
    for epoch, _, indices in result[scenario]:
        out[epoch].append(indices)
    return out


@pytest.mark.parametrize("scenario", ["sampler", "batch_sampler"])
def test_lightning_trains_every_sample_once_per_epoch_in_new_orders(job, scenario):
    n = len(job[0]["sizes"])
    received = [_epochs(result, scenario) for result in job]
    for epoch in range(EPOCHS):
        assert_once([rank[epoch] for rank in received], n)
    for rank in received:
        assert rank[0] != rank[1]  # set_epoch reached the sampler


@pytest.mark.parametrize("scenario", ["sampler", "batch_sampler"])
def test_lightning_training_step_receives_the_planned_balanced_batches(job, plan, scenario):
    for rank in range(WORLD):
        assert _epochs(job[rank], scenario) == plan[rank]
    assert_balanced([_epochs(result, scenario)[0] for result in job], job[0]["sizes"])


def test_lightning_resumes_mid_epoch_from_its_checkpoint(job, plan):
    for rank, result in enumerate(job):
        stopped = [indices for _, _, indices in result["stopped"]]
        resumed = [indices for _, _, indices in result["resumed"]]
        assert len(stopped) == result["stop"] and result["resumed"][0][0] == 1  # mid-epoch 1
        assert stopped + resumed == plan[rank][0] + plan[rank][1]


def test_lightning_packed_trains_every_document_once_and_every_update_in_3_epochs(job):
    counts = job[0]["packed_plan"]  # [micro-batches, steps] of each epoch's own plan
    assert len({micro for micro, _ in counts}) > 1  # the epochs' counts differ
    promised = max(micro for micro, _ in counts)
    for epoch, (_, steps) in enumerate(counts):
        received = [[m for m in result["packed"] if m[0] == epoch] for result in job]
        assert [len(r) for r in received] == [promised] * WORLD  # none dropped
        documents = [i for rank in received for m in rank for i in m[1]]
        assert sorted(documents) == list(range(len(documents))) == list(range(200))
        for rank, result in enumerate(job):
            assert result["packed_steps"][epoch] == steps  # every step's update happened
            assert received[rank][-1][2]  # the epoch ends with a step's last micro-batch
            padding = [m for m in received[rank] if m[4] == 0]
            assert all(m[3] == 0 and not m[2] for m in padding)


def test_lightning_refuses_to_rebuild_a_batch_sampler(job):
    for result in job:
        assert "Trainer(use_distributed_sampler=False)" in result["refused"]


def test_a_streamed_dataset_trains_every_sample_once_in_equal_micro_batch_counts(job):
    seen = [result["stream"] for result in job]
    ids = sorted(i for rank in seen for _, documents, *_ in rank for i in documents)
    assert ids == list(range(job[0]["stream_samples"]))
    assert len(seen[0]) == len(seen[1]) > 2  # no rank waits at a collective for another
    assert [last for _, _, last, *_ in seen[0]] == [last for _, _, last, *_ in seen[1]]
    assert all(tokens <= 256 for rank in seen for *_, tokens in rank)


def test_a_stream_resumed_from_a_lightning_checkpoint_continues_exactly(job):
    for result in job:
        stopped, resumed = result["stream_stopped"], result["stream_resumed"]
        assert sum(last for _, _, last, *_ in stopped) == 3  # STREAM_STOP steps, mid-window
        assert stopped + resumed == result["stream"]  # the uninterrupted pass's micro-batches
        whole, continued, _ = result["stream_params"]
        assert continued == whole  # bitwise: JSON keeps every float32 exactly


def test_a_stream_trained_per_micro_batch_resumes_after_the_last_one_trained(job):
    # Lightning read one micro-batch ahead when it saved; StreamCheckpoint saved the state
    # after the last one trained, so the resumed run neither skips nor repeats one.
    for result in job:
        stopped, resumed = result["stream_micro_stopped"], result["stream_micro_resumed"]
        assert sum(last for _, _, last, *_ in stopped) == 3 and stopped[-1][2]
        assert stopped + resumed == result["stream"]
        whole, _, continued = result["stream_params"]
        assert continued == whole
