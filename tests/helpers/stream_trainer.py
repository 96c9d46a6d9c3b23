"""``chronica.torch.hf.Trainer`` on a ``StreamingDataset`` over local parquet shards written
here (supervised fine-tuning data: prompt tokens labelled -100): a tiny config-built causal
language model (``packed_trainer.model``) trained for
``MAX_STEPS`` optimizer steps (more than one pass), once uninterrupted and once stopped at
``STOP`` (mid-window) with a checkpoint, then resumed from it by a new Trainer and a new
stream, and once on a ``kind="dynamic"`` stream, for test_hf (the 2-process job).

``run`` returns, per run, every step's ``[pass, step, documents, micro-batches promised,
micro-batches received, packed loss share, unpacked reference share over the labelled
tokens (uninterrupted run only), scale]``, a digest of the final parameters and the
stream's final speeds, and the documents' lengths and loss-bearing tokens by global id.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from packed_trainer import model

from chronica import Packing
from chronica.runtime.sources import ParquetSource
from chronica.torch import StreamingDataset
from chronica.torch.hf import Trainer

SHARDS, PER_SHARD, PER_STEP, MAX_STEPS, STOP = 4, 12, 8, 8, 3  # 6 steps a pass
LENGTHS = np.random.default_rng(3).integers(2, 40, size=SHARDS * PER_SHARD)
TOKENS = [np.random.default_rng(4 + i).integers(1, 64, n).tolist() for i, n in enumerate(LENGTHS)]
# Supervised fine-tuning: a document's first PROMPTS[i] tokens are a prompt (labels -100).
PROMPTS = np.random.default_rng(5).integers(0, LENGTHS + 1)
LABELS = [[-100] * int(p) + t[int(p) :] for t, p in zip(TOKENS, PROMPTS, strict=True)]
PACKING = Packing(max_tokens=64)


def write(folder: str) -> list[str]:
    """The parquet shards (document ``s * PER_SHARD + j`` is row ``j`` of shard ``s``)."""
    os.makedirs(folder, exist_ok=True)
    files = []
    for s in range(SHARDS):
        path = os.path.join(folder, f"shard-{s}.parquet")
        part = slice(s * PER_SHARD, (s + 1) * PER_SHARD)
        table = pa.table({"input_ids": TOKENS[part], "labels": LABELS[part]})
        pq.write_table(table, path, row_group_size=4)
        files.append(path)
    return files


class Recording(Trainer):
    """Records every step (see the module docstring); the reference runs each document
    alone, unpacked, with the step's normaliser (with ``check``; else it is 0)."""

    def __init__(self, *args, check: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps: list[list] = []
        self.check = check

    def training_step(self, model, inputs, *args, **kwargs):
        from chronica.adapters.torch.hf_stream import stream_step_norms

        accelerator = self.accelerator
        scale, _ = stream_step_norms(inputs, "token", lambda t: accelerator.reduce(t, "sum"))
        world = accelerator.num_processes
        docs = [int(d) for micro in inputs for d in micro["indices"]]
        with torch.no_grad():
            reference = 0.0
            for d in docs if self.check else ():
                ids, labels = torch.tensor(TOKENS[d])[None], torch.tensor(LABELS[d])[1:]
                logits = model(input_ids=ids).logits[0, :-1]
                losses = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
                reference += float(losses) * scale * world
        loss = super().training_step(model, inputs, *args, **kwargs)
        head = inputs[0]
        self.steps.append(
            [int(head["epoch"]), int(head["step"]), docs, int(head["num_micro"]), len(inputs),
             float(loss), reference, scale]
        )  # fmt: skip
        return loss


def train(
    files: list[str], folder: str, resume: bool = False, kind: str = "static", **options
) -> dict:
    """One Trainer run on a new ``kind`` stream: its steps, its final parameters' digest,
    the stream's speeds at the end (``kind="dynamic"``: fitted from the reported times)."""
    args = transformers.TrainingArguments(
        output_dir=folder,
        max_steps=options.pop("max_steps", MAX_STEPS),
        lr_scheduler_type="constant",
        learning_rate=0.05,
        use_cpu=True,
        report_to=[],
        save_strategy=options.pop("save_strategy", "no"),
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        **options,
    )
    stream = StreamingDataset(
        ParquetSource(files, length="input_ids"), PACKING, batch_size=PER_STEP,
        window_steps=2, buffer_size=4, seed=5, kind=kind,
    )  # fmt: skip
    check = kind == "static" and not resume and args.max_steps == MAX_STEPS
    trainer = Recording(model=model(), args=args, train_dataset=stream, check=check)
    trainer.train(resume_from_checkpoint=True if resume else None)
    digest = hashlib.sha256()
    for tensor in trainer.model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    speeds = stream.state_dict()["speeds"]
    return {"steps": trainer.steps, "params": digest.hexdigest(), "speeds": speeds}


def run(folder: str, rank: int) -> dict:
    """The uninterrupted, stopped and resumed runs (see the module docstring)."""
    files = write(os.path.join(folder, f"data-{rank}"))  # the same shards on every rank
    cut = os.path.join(folder, "cut")
    return {
        "full": train(files, os.path.join(folder, "full")),
        "stopped": train(files, cut, max_steps=STOP, save_strategy="steps", save_steps=STOP),
        "resumed": train(files, cut, resume=True),
        "dynamic": train(files, os.path.join(folder, "dynamic"), kind="dynamic"),
        "lengths": LENGTHS.tolist(),
        "loss_tokens": [sum(x != -100 for x in labels[1:]) for labels in LABELS],
    }
