"""TRL's ``GRPOTrainer`` with the responses of one prompt kept whole in one micro-batch.

GRPO samples ``num_generations`` responses per prompt and scores each against its group.
TRL generates once per ``steps_per_generation`` steps, then *shuffles* the rollouts and cuts
them into ``steps_per_generation`` micro-batches of equal row count
(``shuffle_sequence_dict``, ``split_tensor_dict``): a group lands in several micro-batches,
and a micro-batch's work (its rows' prompt and completion tokens) is whatever the shuffle
gives. ``plan_rollouts`` replaces those two calls: ``chronica.plan_step(...,
groups=prompt)`` puts every group in one micro-batch, balances the micro-batches' tokens
under a cap, and keeps the count at ``steps_per_generation``::

    rollouts = self._generate_and_score_completions(generation_batch)
    - rollouts = shuffle_sequence_dict(rollouts)
    - self._buffered_inputs = split_tensor_dict(rollouts, self.args.steps_per_generation)
    + self._buffered_inputs = plan_rollouts(rollouts, self.args.steps_per_generation,
    +                                       self.num_generations, packing)

With ``loss_type="dapo"`` (TRL's default) each micro-batch's token-loss sum is divided by
the generation batch's loss tokens, so micro-batches of unequal row counts leave the update
unchanged. TRL generates on every rank for its own prompts and keeps the rollouts there;
the plan is the rank's (``world_size=1``), its micro-batch count the same on every rank.

    torchrun --nproc-per-node 2 examples/recipes/trl_grpo.py
    python examples/recipes/trl_grpo.py          # starts the 2 processes itself

A tiny Llama built from a config and a word-level tokenizer built in code (``trl_sft.py``);
prompts are token words (``"t5 t9 t3"``), the reward counts one token in the completion.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from trl_sft import VOCAB, chronica, tiny_llama, tiny_tokenizer

PROMPTS, GENERATIONS, PER_DEVICE, STEPS_PER_GENERATION = 32, 4, 8, 2
PACKING = chronica.Packing(max_tokens=1024, micro_batches=STEPS_PER_GENERATION, loss="loss_token")


def _rows(value: Any, index: np.ndarray) -> Any:
    """``value``'s rows ``index`` (a tensor's, a list's); scalars and ``None`` as they are."""
    if isinstance(value, torch.Tensor) and value.ndim > 0:
        return value[torch.from_numpy(index)]
    if isinstance(value, list):
        return [value[i] for i in index]
    return value


def plan_rollouts(
    rollouts: dict[str, Any], micro_batches: int, num_generations: int, packing: chronica.Packing
) -> list[dict[str, Any]]:
    """The rank's rollouts cut into ``micro_batches`` micro-batches, every group of
    ``num_generations`` consecutive rows (one prompt's responses, as TRL's sampler emits
    them) whole in one, balanced by tokens (prompt and completion) under ``packing``'s cap.

    Guarantees: exactly ``micro_batches`` micro-batches (``ValueError`` naming the fix when
    the rollouts need more), every row in exactly one, a group's rows together, none above
    ``packing.max_tokens`` tokens; each holds at least one group when there are at least
    ``micro_batches`` groups.

    Args:
        rollouts: TRL's rollout dict (``prompt_mask``, ``completion_mask`` and the rest,
            one row per response).
        micro_batches: TRL's ``steps_per_generation``.
        num_generations: responses per prompt.
        packing: the cap and objective; its ``micro_batches`` must be ``micro_batches``.

    Example::

        >>> rollouts = {"prompt_mask": torch.ones(4, 2, dtype=torch.long),
        ...             "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0],
        ...                                              [1, 1, 0], [1, 0, 0]]),
        ...             "num_items_in_batch": torch.tensor(7)}
        >>> parts = plan_rollouts(rollouts, 2, 2, chronica.Packing(max_tokens=16, micro_batches=2))
        >>> [p["completion_mask"].sum(1).tolist() for p in parts]
        [[3, 1], [2, 1]]
    """
    tokens = rollouts["prompt_mask"].sum(1) + rollouts["completion_mask"].sum(1)
    groups = np.arange(tokens.shape[0]) // num_generations
    plan = chronica.plan_step(
        tokens.cpu().numpy(),
        1,
        packing,
        groups=groups,
        loss_tokens=rollouts["completion_mask"].sum(1).cpu().numpy()
        if packing.loss == "loss_token"
        else None,
    )
    if plan.num_micro != micro_batches:
        raise ValueError(
            f"the rollouts need {plan.num_micro} micro-batches of at most "
            f"{packing.max_tokens} tokens, TRL runs steps_per_generation={micro_batches}: raise "
            "max_tokens or steps_per_generation, or generate fewer rollouts per step"
        )
    return [
        {key: _rows(value, micro) for key, value in rollouts.items()}
        for micro in plan.micro_batches(0)
    ]


def grouped_trainer_class() -> type:
    """``GroupedGRPOTrainer``: TRL's ``GRPOTrainer`` whose buffered micro-batches come from
    ``plan_rollouts`` (built on first use: importing this module does not import TRL)."""
    from trl import GRPOTrainer

    class GroupedGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` keeping every prompt's responses in one micro-batch; ``packing``
        is the cap (its ``micro_batches`` is ``steps_per_generation``). Every buffered
        micro-batch's rows are recorded in ``planned`` (per generation, per micro-batch:
        ``[row, prompt]`` with the prompt's token ids)."""

        def __init__(self, *args: Any, packing: chronica.Packing, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.rollout_packing = packing
            self.planned: list[list[list[int]]] = []

        def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
            if not self.model.training:
                return super()._prepare_inputs(generation_batch)
            every = self.args.steps_per_generation * self.num_iterations
            if self._step % every == 0 or self._buffered_inputs is None:
                rollouts = self._generate_and_score_completions(generation_batch)
                rollouts["row"] = torch.arange(rollouts["prompt_ids"].shape[0])
                self._buffered_inputs = plan_rollouts(
                    rollouts,
                    self.args.steps_per_generation,
                    self.num_generations,
                    self.rollout_packing,
                )
                self.planned.append(
                    [
                        [
                            [int(row), ids[mask.bool()].tolist()]
                            for row, ids, mask in zip(
                                b.pop("row"), b["prompt_ids"], b["prompt_mask"], strict=True
                            )
                        ]
                        for b in self._buffered_inputs
                    ]
                )
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    return GroupedGRPOTrainer


def reward_sevens(completions: list[str], **_: Any) -> list[float]:
    """The share of ``t7`` among a completion's tokens."""
    return [c.split().count("t7") / max(1, len(c.split())) for c in completions]


def main(steps: int, out: str | None) -> None:
    """One rank of the job (torchrun's environment variables say which)."""
    import datasets
    from trl import GRPOConfig

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prompts = [
        " ".join(f"t{t}" for t in rng.integers(2, VOCAB, rng.integers(2, 24)))
        for _ in range(PROMPTS)
    ]
    args = GRPOConfig(
        output_dir=out or "trl-grpo-output",
        per_device_train_batch_size=PER_DEVICE,
        steps_per_generation=STEPS_PER_GENERATION,
        num_generations=GENERATIONS,
        max_completion_length=24,
        gradient_accumulation_steps=STEPS_PER_GENERATION,
        max_steps=steps,
        learning_rate=1e-2,
        beta=0.0,
        loss_type="dapo",
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=300,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    trainer = grouped_trainer_class()(
        model=tiny_llama(),
        args=args,
        reward_funcs=reward_sevens,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=tiny_tokenizer(),
        packing=PACKING,
    )
    trainer.train()
    rank = args.process_index
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"planned_{rank}.json").write_text(json.dumps(trainer.planned))
    for line in trainer.state.log_history:
        if rank == 0 and "loss" in line:
            print(f"step {line['step']}: loss {line['loss']:.4f} reward {line['reward']:.3f}")


def _spawned(rank: int, world: int, port: int, steps: int, out: str | None) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    main(steps, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", help="folder for the planned micro-batches")
    cli = parser.parse_args()
    if "RANK" in os.environ:
        main(cli.steps, cli.out)
    else:  # start 2 ranks that meet at a store on a port the OS picks
        import torch.distributed as dist
        import torch.multiprocessing as mp

        store = dist.TCPStore(
            "127.0.0.1",
            0,
            2,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=300),
        )
        mp.spawn(_spawned, args=(2, store.port, cli.steps, cli.out), nprocs=2)
