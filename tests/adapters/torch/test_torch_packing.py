"""Packed micro-batches through the scheduler, the runtime and torch's batch sampler:
every token once, equal micro-batch counts, the cap, loss normalisation, resume, elastic."""

import functools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from chronica.core import CostModel, Packing, ScheduleConfig, Scheduler, ShufflePolicy
from chronica.core.packing import pieces
from chronica.torch.utils.data import (
    DistributedBatchSampler,
    DistributedSampler,
    PackedDataset,
    collate_packed,
)

MAX_TOKENS = 256


def _lengths(n, seed=0, cap=MAX_TOKENS):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(3.5, 0.9, n).astype(np.int64), 1, cap)


class Documents(torch.utils.data.Dataset):
    """Document ``i`` holds tokens ``i * 1000 + t``: every token says where it comes from."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return torch.arange(int(self.lengths[index])) + int(index) * 1000


def _covered(plan):
    """(document, token) pairs of a packed plan, with their multiplicity."""
    layout = plan.micro
    pairs = [
        (int(d), t)
        for d, s, n in zip(plan.indices, layout.starts, layout.lengths, strict=True)
        for t in range(s, s + n)
    ]
    return pairs


def _check_plan(plan, lengths, packing, num_replicas):
    layout = plan.micro
    expected = sorted(
        (d, t)
        for d, n in enumerate(lengths)
        for t in range(n if packing.long_documents == "split" else min(n, packing.length))
    )
    assert sorted(_covered(plan)) == expected  # every token once
    for s in range(plan.num_steps):
        m = int(layout.num_micro[s])
        assert layout.first[s + 1] - layout.first[s] == m * num_replicas
        for j in range(layout.first[s], layout.first[s + 1]):
            span = slice(layout.bounds[j], layout.bounds[j + 1])
            padded = packing.padded(layout.lengths[span])
            assert padded.sum() <= packing.max_tokens
            rows = np.bincount(layout.rows[span], weights=padded)
            assert rows.shape[0] <= packing.rows and (rows <= packing.length).all()
            documents = np.bincount(layout.rows[span])
            assert (documents <= (packing.max_documents_per_row or span.stop)).all()
        assert m % packing.micro_batch_multiple == 0
        assert plan.loss_weights[s].sum() == pytest.approx(num_replicas)


@pytest.mark.parametrize(
    "packing, batch",
    [
        (Packing(MAX_TOKENS), 40),
        (Packing(MAX_TOKENS, row_length=64, long_documents="split"), 40),
        (Packing(MAX_TOKENS, row_length=64, long_documents="truncate"), 40),
        (Packing(MAX_TOKENS, tokens_per_step=3000), None),
        (Packing(MAX_TOKENS, tokens_per_step=3000, micro_batches=3, loss="sample"), None),
        (Packing(MAX_TOKENS, balance="micro", micro_batch_multiple=2, pad_multiple=8), 40),
        (
            Packing(
                MAX_TOKENS,
                row_length=64,
                long_documents="split",
                max_documents_per_row=3,
                balance="micro",
            ),
            40,
        ),
    ],
)
@pytest.mark.parametrize("shuffle", [True, "local", ShufflePolicy.partial(0.3)])
def test_every_token_once_equal_micro_counts_and_the_cap(packing, batch, shuffle):
    lengths = _lengths(300)
    groups = None if shuffle is True else [0, 0, 1, 1]
    config = ScheduleConfig(4, batch, shuffle=shuffle, groups=groups, packing=packing, seed=1)
    scheduler = Scheduler(lengths, config)
    for epoch in (0, 1):
        plan = scheduler.plan_epoch(epoch)
        _check_plan(plan, lengths, packing, 4)
        assert plan.num_steps == scheduler.num_steps(epoch)
        if packing.micro_batches:
            assert (plan.micro.num_micro >= packing.micro_batches).all()
    assert not np.array_equal(scheduler.plan_epoch(0).indices, scheduler.plan_epoch(1).indices)
    again = Scheduler(lengths, config).plan_epoch(1)
    assert again.indices.tobytes() == scheduler.plan_epoch(1).indices.tobytes()  # determinism


def test_stats_report_the_packed_balance_and_drop_last_drops_a_short_last_step():
    lengths = _lengths(1000, seed=3)
    packing = Packing(MAX_TOKENS)
    config = ScheduleConfig(8, 200, packing=packing, cost=CostModel.attention(64))
    scheduler = Scheduler(lengths, config)
    stats = scheduler.stats(0)
    assert stats.num_steps == 5 and stats.load_ratio_mean < 1.01
    assert 0 <= stats.padding_fraction < 1
    short = Scheduler(lengths[:950], ScheduleConfig(8, 200, packing=packing, drop_last=True))
    plan = short.plan_epoch(0)
    assert plan.num_steps == 4 and plan.num_dropped == 150
    assert np.unique(plan.indices).shape[0] == 800


def _loaders(lengths, world, **kw):
    docs = Documents(lengths)
    samplers = [
        DistributedBatchSampler(docs, num_replicas=world, rank=r, sizes=lengths, **kw)
        for r in range(world)
    ]
    loaders = [
        DataLoader(PackedDataset(docs), batch_sampler=s, collate_fn=collate_packed)
        for s in samplers
    ]
    return samplers, loaders


def _tokens(micro):
    values = micro["input_ids"][: micro["num_tokens"]]
    return list(zip((values // 1000).tolist(), (values % 1000).tolist(), strict=True))


def test_the_batch_sampler_feeds_every_token_once_in_equal_micro_batch_counts():
    lengths = _lengths(200, seed=5)
    packing = Packing(MAX_TOKENS, tokens_per_step=2500)
    samplers, loaders = _loaders(lengths, 2, packing=packing, batch_size=None)
    for epoch in (0, 1):
        seen, per_step = [], [{}, {}]
        for r, (sampler, loader) in enumerate(zip(samplers, loaders, strict=True)):
            sampler.set_epoch(epoch)
            micros = list(loader)
            assert len(micros) == len(sampler)
            for micro in micros:
                seen += _tokens(micro)
                per_step[r][micro["step"]] = per_step[r].get(micro["step"], 0) + 1
                assert micro["num_tokens"] <= MAX_TOKENS
                assert micro["last"] == (micro["micro"] == micro["num_micro"] - 1)
                cu = micro["cu_seqlens"].tolist()
                assert cu[-1] == micro["num_tokens"]
                starts = set(cu[:-1])
                for i, p in enumerate(micro["position_ids"].tolist()):
                    assert (p == 0) == (i in starts)
        assert sorted(seen) == sorted((d, t) for d, n in enumerate(lengths) for t in range(n))
        assert per_step[0] == per_step[1]  # the same number of micro-batches every step


def test_pad_to_gives_one_static_shape():
    lengths = _lengths(60, seed=2)
    docs = Documents(lengths)
    sampler = DistributedBatchSampler(
        docs, 20, num_replicas=2, rank=1, sizes=lengths, packing=Packing(MAX_TOKENS)
    )
    collate = functools.partial(collate_packed, pad_to=MAX_TOKENS)
    for micro in DataLoader(PackedDataset(docs), batch_sampler=sampler, collate_fn=collate):
        assert micro["input_ids"].shape == (MAX_TOKENS,)
        assert micro["cu_seqlens"][-1] == MAX_TOKENS
        assert (micro["segment_ids"][micro["num_tokens"] :] == -1).all()
        assert (micro["segment_ids"][: micro["num_tokens"]] >= 0).all()


@pytest.mark.parametrize("loss", ["token", "sample"])
def test_weighted_accumulated_gradients_equal_the_global_mean_gradient(loss):
    torch.manual_seed(0)
    lengths = _lengths(120, seed=7, cap=128)
    world = 3
    _, loaders = _loaders(lengths, world, packing=Packing(128, loss=loss), batch_size=40)
    model = torch.nn.Sequential(torch.nn.Embedding(200_000, 4), torch.nn.Linear(4, 1))
    params = list(model.parameters())

    def token_losses(ids):
        return model(ids).squeeze(-1) ** 2

    micros = [list(loader) for loader in loaders]
    for step in range(micros[0][-1]["step"] + 1):
        # Each rank: sum over its micro-batches of weight x micro-batch mean; then the mean
        # over ranks (what DDP's all-reduce average does).
        total = [torch.zeros_like(p) for p in params]
        step_ids = []
        for rank in range(world):
            for micro in (m for m in micros[rank] if m["step"] == step):
                model.zero_grad()
                ids = micro["input_ids"]
                step_ids.append((ids, micro["cu_seqlens"]))
                if micro["num_tokens"] == 0:
                    continue
                values = token_losses(ids)
                if loss == "token":
                    mean = values.mean()
                else:
                    per_doc = torch.segment_reduce(
                        values, "mean", offsets=micro["cu_seqlens"].to(torch.int64)
                    )
                    mean = per_doc.mean()
                (mean * micro["loss_weight"]).backward()
                for t, p in zip(total, params, strict=True):
                    t += p.grad / world
        model.zero_grad()
        every = torch.cat([ids for ids, _ in step_ids])
        if loss == "token":
            reference = token_losses(every).mean()
        else:
            docs = [
                token_losses(ids).__getitem__(slice(a, b)).mean()
                for ids, cu in step_ids
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)
            ]
            reference = torch.stack(docs).mean()
        reference.backward()
        for t, p in zip(total, params, strict=True):
            assert torch.allclose(t, p.grad, atol=1e-6, rtol=1e-5)


def test_a_state_taken_mid_step_resumes_with_the_next_micro_batch():
    lengths = _lengths(150, seed=9)
    kw = {"packing": Packing(64, long_documents="split"), "batch_size": 30}
    samplers, _ = _loaders(lengths, 2, **kw)
    full = [[int(i) for i in micro] for micro in samplers[1]]
    it = iter(samplers[1])
    head = [[int(i) for i in next(it)] for _ in range(5)]
    state = samplers[1].state_dict()
    assert state["offset"] > 0 or state["step"] > 0
    fresh, _ = _loaders(lengths, 2, **kw)
    fresh[1].load_state_dict(state)
    rest = [[int(i) for i in micro] for micro in fresh[1]]
    assert head + rest == full


def test_elastic_resume_of_a_packed_epoch_trains_every_token_once():
    lengths = _lengths(240, seed=11)
    packing = Packing(MAX_TOKENS, tokens_per_step=4000)
    old, old_loaders = _loaders(lengths, 4, packing=packing, batch_size=None)
    seen = []
    steps_done = 2
    for loader in old_loaders:
        for micro in loader:
            if micro["step"] >= steps_done:
                break
            seen += _tokens(micro)
    # A state taken at a step boundary (every rank finished steps 0 and 1).
    state = old[0].state_dict()
    state["step"], state["offset"] = steps_done, 0
    new, new_loaders = _loaders(lengths, 2, packing=packing, batch_size=None)
    for sampler, loader in zip(new, new_loaders, strict=True):
        sampler.load_state_dict(state)
        seen += [token for micro in loader for token in _tokens(micro)]
    assert sorted(seen) == sorted((d, t) for d, n in enumerate(lengths) for t in range(n))


def test_bad_packing_input_is_refused_by_name():
    docs = Documents(_lengths(20))
    with pytest.raises(ValueError, match="packing= needs every document's length in tokens"):
        DistributedBatchSampler(docs, 4, num_replicas=2, rank=0, packing=Packing(64))
    with pytest.raises(ValueError, match="use DistributedBatchSampler"):
        DistributedSampler(docs, num_replicas=2, rank=0, batch_size=4, packing=Packing(64))
    with pytest.raises(ValueError, match=r"document 3 has 90 tokens.*long_documents='split'"):
        lengths = np.full(10, 10)
        lengths[3] = 90
        Scheduler(lengths, ScheduleConfig(2, 4, packing=Packing(64)))
    with pytest.raises(ValueError, match=r"sizes\[1\] is 2.5"):
        Scheduler([1.0, 2.5], ScheduleConfig(2, 2, packing=Packing(64)))
    with pytest.raises(ValueError, match="exactly one step size"):
        ScheduleConfig(2, 4, packing=Packing(64, tokens_per_step=100))
    with pytest.raises(ValueError, match="kind='guided', exact=True cannot be packed"):
        ScheduleConfig(2, 4, kind="guided", packing=Packing(64))
    with pytest.raises(ValueError, match="row_length=80 must be an int in"):
        Packing(64, row_length=80)
    with pytest.raises(ValueError, match="long_documents='cut'"):
        Packing(64, long_documents="cut")
    assert pieces(np.array([5.0, 130.0]), Packing(64, long_documents="split")).doc.tolist() == [
        0,
        1,
        1,
        1,
    ]
