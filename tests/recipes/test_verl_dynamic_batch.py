"""The verl-style recipe (examples/recipes/verl_dynamic_batch.py): every sequence of the
global batch once, equal micro-batch counts, the token cap, GRPO groups whole, the rows
sliced as planned, and loss weights that make the ranks' accumulated update the mean over
the batch's response tokens."""

import doctest

import pytest
import torch
import verl_dynamic_batch as recipe

MAX_TOKEN_LEN = 8192


@pytest.mark.parametrize("balance", ["rank", "micro"])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_sequence_once_in_equal_counts_under_the_cap_groups_whole(world, balance):
    batch, uid = recipe.grpo_batch(prompts=16, responses=4, width=1024, seed=world)
    planned = [
        recipe.plan_micro_batches(batch, MAX_TOKEN_LEN, world, r, uid=uid, balance=balance)
        for r in range(world)
    ]
    counts = {len(indices) for _, indices, _ in planned}
    assert len(counts) == 1  # every rank runs the same number of micro-batches
    seen = []
    for micro, indices, _ in planned:
        for part, index in zip(micro, indices, strict=True):
            assert index  # no empty micro-batch
            assert int(part["attention_mask"].sum()) <= MAX_TOKEN_LEN
            for key, value in batch.items():
                assert torch.equal(part[key], value[index])
            assert len(set(uid[index])) * 4 == len(index)  # whole groups only
            seen += index
    assert sorted(seen) == list(range(64))


def test_weighted_micro_means_average_to_the_global_mean_over_response_tokens():
    world = 4
    batch, uid = recipe.grpo_batch(prompts=12, responses=8, width=512, seed=3)
    token_loss = torch.rand(batch["response_mask"].shape, dtype=torch.float64)
    update = 0.0
    for rank in range(world):
        _, indices, weights = recipe.plan_micro_batches(batch, 4096, world, rank, uid=uid)
        for index, weight in zip(indices, weights, strict=True):
            mask = batch["response_mask"][index]
            update += weight * float((token_loss[index] * mask).sum() / mask.sum())
    mask = batch["response_mask"]
    assert update / world == pytest.approx(float((token_loss * mask).sum() / mask.sum()))


def test_count_rules_of_verl_hold():
    batch, _ = recipe.grpo_batch(prompts=8, responses=2, width=256, seed=1)
    _, indices, _ = recipe.plan_micro_batches(
        batch, 4096, 2, 0, min_num_micro_batch=3, num_batches_divided_by=2
    )
    assert len(indices) % 2 == 0 and len(indices) >= 3


def test_fewer_prompts_than_ranks_is_refused_loudly():
    batch, uid = recipe.grpo_batch(prompts=2, responses=4, width=256)
    with pytest.raises(ValueError, match="rank would be left empty"):
        recipe.plan_micro_batches(batch, 4096, 4, 0, uid=uid)


def test_the_docstring_example_holds():
    assert doctest.testmod(recipe, raise_on_error=True).attempted > 0
