"""TRL's ``SFTTrainer`` on padding-free packed micro-batches that ``chronica.plan_step`` plans.

TRL packs SFT data into fixed-length rows before training (``packing=True``) and hands every
rank ``per_device_train_batch_size`` of them per micro-batch; the rows hold about as many
tokens, not as much work (attention grows with each document's square), and nothing makes the
ranks' steps equal. Here the trainer keeps TRL's padding-free collator (documents laid end to
end in one row, positions restarting at each, ``cu_seq_lens`` for flash-attention) and
``get_train_dataloader`` is replaced: every step takes the next ``documents_per_step``
documents of the epoch's order, ``plan_step`` cuts them into ``gradient_accumulation_steps``
token-capped micro-batches on every rank, and each rank's loader yields its own::

    class PlannedSFTTrainer(SFTTrainer):
        def get_train_dataloader(self):
            sampler = StepPlanBatchSampler(lengths, documents_per_step, world, rank, packing)
            return DataLoader(self.train_dataset, batch_sampler=sampler,
                              collate_fn=self.data_collator)

The loader is not passed through ``accelerator.prepare``: it already yields this rank's
micro-batches only (accelerate would shard it a second time). transformers' Trainer
normalises the loss by the step's loss tokens counted over every micro-batch and rank
(``num_items_in_batch``, ``average_tokens_across_devices``), so the update is the mean over
the global batch's loss tokens however the plan cut it. DDP synchronises once per step, so
``Packing(balance="rank")``; under FSDP use ``balance="micro"``.

    torchrun --nproc-per-node 2 examples/recipes/trl_sft.py
    python examples/recipes/trl_sft.py          # starts the 2 processes itself

A tiny Llama built from a config (no downloaded weights) and a word-level tokenizer built in
code train on token ids drawn here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

try:
    import chronica
except ModuleNotFoundError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import chronica

VOCAB, DOCUMENTS, DOCUMENTS_PER_STEP, ACCUMULATION, LR = 64, 96, 16, 2, 0.5
PACKING = chronica.Packing(max_tokens=1024, micro_batches=ACCUMULATION)


class StepPlanBatchSampler(Sampler[list[int]]):
    """This rank's micro-batches, step after step: every step the next ``documents_per_step``
    documents of the epoch's seeded order, planned by ``chronica.plan_step`` for all ranks.

    Guarantees: every rank yields ``packing.micro_batches`` micro-batches per step (a step
    that needs more, because its documents do not fit, raises ``ValueError`` naming the
    fix), none above the cap; over the ranks, each document of a step exactly once (a
    trailing partial step is dropped); the same order on every rank for the same
    ``seed`` and epoch (``set_epoch``).

    Args:
        lengths: tokens per document of the data set.
        documents_per_step: documents in one global batch.
        world_size: the data-parallel ranks.
        rank: this rank.
        packing: ``chronica.Packing`` with ``micro_batches`` set (the trainer's
            ``gradient_accumulation_steps``).
        seed: the order's seed.
        groups: optional group id per document, kept whole on one rank and micro-batch.

    Example::

        >>> sampler = StepPlanBatchSampler([5, 3, 4, 2, 6, 1], 4, 2, 0,
        ...                                chronica.Packing(max_tokens=8, micro_batches=1))
        >>> len(sampler), [len(b) for b in sampler]
        (1, [2])
    """

    def __init__(
        self,
        lengths: Any,
        documents_per_step: int,
        world_size: int,
        rank: int,
        packing: chronica.Packing,
        seed: int = 0,
        groups: Any = None,
    ) -> None:
        if packing.micro_batches is None:
            raise ValueError(
                "packing.micro_batches must be set to the trainer's gradient_accumulation_steps"
            )
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.documents_per_step, self.world_size, self.rank = documents_per_step, world_size, rank
        self.packing, self.seed, self.epoch = packing, seed, 0
        self.groups = None if groups is None else np.asarray(groups)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on.

        Args:
            epoch: the epoch number.
        """
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths) // self.documents_per_step * self.packing.micro_batches

    def steps(self) -> Iterator[tuple[np.ndarray, chronica.StepPlan]]:
        """Every step's documents (indices into the data set) and their plan."""
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.lengths))
        for start in range(0, len(order) - self.documents_per_step + 1, self.documents_per_step):
            docs = order[start : start + self.documents_per_step]
            groups = None if self.groups is None else self.groups[docs]
            plan = chronica.plan_step(
                self.lengths[docs], self.world_size, self.packing, groups=groups
            )
            if plan.num_micro != self.packing.micro_batches:
                raise ValueError(
                    f"a step needs {plan.num_micro} micro-batches of at most "
                    f"{self.packing.max_tokens} tokens, the trainer runs "
                    f"{self.packing.micro_batches}: raise max_tokens or "
                    "gradient_accumulation_steps, or take fewer documents per step"
                )
            yield docs, plan

    def __iter__(self) -> Iterator[list[int]]:
        for docs, plan in self.steps():
            for micro in plan.micro_batches(self.rank):
                yield docs[micro].tolist()


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over ``t0 .. t{VOCAB-1}`` built in code (``t0`` pads, ``t1``
    ends a document): TRL wants one, the data here is token ids already."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", eos_token="t1")


def tiny_llama(seed: int = 0) -> Any:
    """A 2-layer Llama built from a config, initialised from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        use_cache=False,  # training: no cache, so packed documents attend only within
    )
    return LlamaForCausalLM(config)


def documents(seed: int = 0) -> list[list[int]]:
    """``DOCUMENTS`` token-id documents of lognormal length in ``[2, 512]``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(4.0, 1.0, DOCUMENTS), 2, 512).astype(int)
    return [rng.integers(2, VOCAB, n).tolist() for n in lengths]


def planned_trainer_class() -> type:
    """``PlannedSFTTrainer``: TRL's ``SFTTrainer`` whose training loader is planned by
    ``StepPlanBatchSampler`` (built on first use: importing this module does not import
    TRL)."""
    from trl import SFTTrainer

    class PlannedSFTTrainer(SFTTrainer):
        """``SFTTrainer`` whose every step is one ``plan_step`` over ``documents_per_step``
        documents; ``packing`` gives the cap and objective, its ``micro_batches`` the
        trainer's ``gradient_accumulation_steps``."""

        def __init__(
            self, *args: Any, packing: chronica.Packing, documents_per_step: int, **kwargs: Any
        ) -> None:
            super().__init__(*args, **kwargs)
            self.step_packing, self.documents_per_step = packing, documents_per_step
            self.train_sampler: StepPlanBatchSampler | None = None

        def get_train_dataloader(self) -> DataLoader:
            args = self.args
            if args.gradient_accumulation_steps != self.step_packing.micro_batches:
                raise ValueError(
                    "Packing(micro_batches=) must equal gradient_accumulation_steps "
                    f"({self.step_packing.micro_batches} != {args.gradient_accumulation_steps})"
                )
            lengths = [len(ids) for ids in self.train_dataset["input_ids"]]
            self.train_sampler = StepPlanBatchSampler(
                lengths,
                self.documents_per_step,
                max(1, args.world_size),
                args.process_index,
                self.step_packing,
                seed=args.seed,
            )
            return DataLoader(
                self.train_dataset, batch_sampler=self.train_sampler, collate_fn=self.data_collator
            )

    return PlannedSFTTrainer


def reference_parameters(steps: int, world_size: int) -> dict[str, torch.Tensor]:
    """One process, plain torch: every step the mean loss over all loss tokens of the whole
    global batch (the documents the sampler's order gives it), SGD. What the trainer's
    ranks must end with."""
    data = documents()
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    lengths = [len(d) for d in data]
    sampler = StepPlanBatchSampler(lengths, DOCUMENTS_PER_STEP, world_size, 0, PACKING)
    for (docs, _), _ in zip(sampler.steps(), range(steps), strict=False):
        ids = torch.tensor([t for i in docs for t in data[i]])[None]
        positions = torch.cat([torch.arange(lengths[i]) for i in docs])[None]
        labels = ids.clone()
        labels[positions == 0] = -100
        model(input_ids=ids, position_ids=positions, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def main(steps: int, out: str | None) -> None:
    """One rank of the job (torchrun's environment variables say which)."""
    import datasets
    from trl import SFTConfig

    torch.set_num_threads(1)
    args = SFTConfig(
        output_dir=out or "trl-sft-output",
        per_device_train_batch_size=1,  # unused: the planned loader decides
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=steps,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        gradient_checkpointing=False,
        bf16=False,  # TRL's default is bf16: float32 keeps the update comparable
        padding_free=True,
        max_length=None,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=300,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    trainer = planned_trainer_class()(
        model=tiny_llama(),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"input_ids": documents()}),
        processing_class=tiny_tokenizer(),
        packing=PACKING,
        documents_per_step=DOCUMENTS_PER_STEP,
    )
    trainer.train()
    sampler = trainer.train_sampler
    assert sampler is not None
    rank = args.process_index
    trained = [
        [docs[m].tolist() for m in plan.micro_batches(rank)]
        for (docs, plan), _ in zip(sampler.steps(), range(steps), strict=False)
    ]
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"micro_batches_{rank}.json").write_text(json.dumps(trained))
        if rank == 0:
            model = trainer.accelerator.unwrap_model(trainer.model)
            torch.save(dict(model.named_parameters()), Path(out) / "parameters.pt")
    for line in trainer.state.log_history:
        if rank == 0 and "loss" in line:
            print(f"step {line['step']}: loss {line['loss']:.4f}")


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
    parser.add_argument("--out", help="folder for the micro-batches and final parameters")
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
