"""A tiny config-built causal language model trained by ``chronica.torch.hf.Trainer`` on
packed documents, recording for every step the documents it trained, this rank's share of
the packed loss and the same share computed document by document, unpacked, with the same
weights (the reference), for test_hf (one process and the 2-process job)."""

from __future__ import annotations

import datasets
import numpy as np
import torch
import transformers

from chronica import Packing
from chronica.torch.hf import Trainer

DOCUMENTS, DOCUMENTS_PER_STEP, EPOCHS = 48, 8, 2
LENGTHS = np.random.default_rng(3).integers(2, 40, size=DOCUMENTS)
PACKING = Packing(max_tokens=64)


def documents() -> datasets.Dataset:
    rng = np.random.default_rng(4)
    return datasets.Dataset.from_dict(
        {"input_ids": [rng.integers(1, 64, n).tolist() for n in LENGTHS]}
    )


def model() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config)


class Recording(Trainer):
    """Records ``[epoch, step, documents, packed loss, unpacked reference]`` per step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps: list[list] = []
        self.table = kwargs["train_dataset"]

    def training_step(self, model, inputs, *args, **kwargs):
        from chronica.adapters.torch.hf_packed import step_norms

        scale, _ = step_norms(self.train_sampler, inputs[0]["step"])
        world = self.train_sampler.num_replicas
        docs = [int(d) for micro in inputs for d in micro["indices"]]
        with torch.no_grad():
            reference = 0.0
            for d in docs:  # every document alone: no packing, no mask but the causal one
                ids = torch.tensor(self.table[d]["input_ids"])[None]
                logits = model(input_ids=ids).logits[0, :-1]
                losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
                reference += float(losses) * scale * world
        loss = super().training_step(model, inputs, *args, **kwargs)
        epoch = self.train_sampler.epoch
        self.steps.append([epoch, inputs[0]["step"], docs, float(loss), reference])
        return loss


def train(folder: str, **arguments) -> list[list]:
    args = transformers.TrainingArguments(
        output_dir=folder,
        per_device_train_batch_size=DOCUMENTS_PER_STEP // arguments.pop("world", 1),
        num_train_epochs=EPOCHS,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        learning_rate=0.05,
        seed=0,
        **arguments,
    )
    trainer = Recording(
        model=model(), args=args, train_dataset=documents(), scheduling={"packing": PACKING}
    )
    trainer.train()
    return trainer.steps
