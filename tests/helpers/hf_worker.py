"""One rank of a 2-process accelerate / transformers Trainer job (gloo, CPU), started by
test_hf with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); argv[2] is a folder for the Trainer's checkpoints.

Writes to argv[1] as JSON, per scenario, the batches (lists of sample indices) in the
order the training code received them:

* ``refused_accelerate``, ``refused_trainer``: the errors raised when chronica's sampler is
  sharded a second time by plain ``accelerator.prepare`` and by a plain
  ``transformers.Trainer`` whose ``_get_train_sampler`` returns it;
* ``accelerate``: ``chronica.torch.hf.prepare`` over ``DataLoader(sampler=...)``, 2 epochs;
  ``accelerate_batches``: the same over ``DataLoader(batch_sampler=...)``;
* ``skipped``: epoch 1 of a freshly prepared loader after ``accelerator.skip_first_batches``
  (accelerate's resume), ``SKIP`` batches skipped;
* ``trainer``: ``chronica.torch.hf.Trainer`` on a ``datasets.Dataset`` with a ``length``
  column, 2 epochs; ``stopped`` and ``resumed``: the same stopped by a callback at
  ``STOP`` (mid-epoch 1) after a checkpoint, then a new Trainer resumed from it;
* ``custom``: ``chronica.torch.hf.Trainer`` with a ``get_train_dataloader`` of its own (a
  plain ``DataLoader`` over chronica's sampler, which transformers cannot reach to call
  ``set_epoch``), 2 epochs; ``refused_custom``: the error a plain ``transformers.Trainer``
  with the same loader raises when it iterates the loader for its second epoch;
* ``packed``: ``packed_trainer.train`` (a tiny Llama trained on packed documents by
  ``chronica.torch.hf.Trainer``): per step the documents, the packed loss and the unpacked
  reference;
* ``refused_stream``: the error ``chronica.torch.hf.prepare`` raises for a loader over a
  ``StreamingDataset`` under accelerate's default for iterable data sets
  (``dispatch_batches=True``); ``stream``: the micro-batches (step, micro-batch, count,
  sample ids) of the same loader prepared with ``dispatch_batches=False``;
* ``streamed``: ``stream_trainer.run`` (``chronica.torch.hf.Trainer`` on a stream of
  parquet shards: uninterrupted, stopped mid-window with a checkpoint, resumed from it);
* ``sizes`` (of the samples) and ``stop``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import datasets
import numpy as np
import packed_trainer
import stream_trainer
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from stream_source import make_source
from torch.utils.data import DataLoader

from chronica import Packing
from chronica.torch import StreamingDataset
from chronica.torch.hf import Trainer, prepare
from chronica.torch.utils.data import DistributedBatchSampler, DistributedSampler

N, GLOBAL_BATCH, EPOCHS, SKIP = 84, 8, 2, 4
WORLD = int(os.environ["WORLD_SIZE"])
SIZES = (np.random.default_rng(1).lognormal(3, 1, N).round() + 1).astype(np.int64)
TABLE = datasets.Dataset.from_dict(
    {"idx": np.arange(N), "length": SIZES, "x": np.arange(N, dtype=np.float32) % 5}
)


class Recorder(torch.nn.Module):
    """A one-weight regression that records the indices of every batch it is given."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def forward(self, idx, x, **_):
        self.seen.append(idx.tolist())
        return {"loss": self.layer(x[:, None]).square().mean()}


def arguments(folder: str, **kwargs) -> transformers.TrainingArguments:
    options = dict(
        output_dir=folder,
        per_device_train_batch_size=GLOBAL_BATCH // int(os.environ["WORLD_SIZE"]),
        num_train_epochs=EPOCHS,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
    )
    options.update(kwargs)
    return transformers.TrainingArguments(**options)


class StopAt(transformers.TrainerCallback):
    """Saves a checkpoint and stops training at global step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


def train(folder: str, trainer_class=Trainer, callbacks=None, resume=None, **kwargs) -> list:
    model = Recorder()
    trainer = trainer_class(
        model=model, args=arguments(folder, **kwargs), train_dataset=TABLE, callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=resume)
    return model.seen


def epochs(loader, first: int = 0) -> list:
    seen = []
    for epoch in range(first, EPOCHS):
        loader.set_epoch(epoch)
        seen += [batch[0].tolist() for batch in loader]
    return seen


def main(out_path: str, folder: str) -> None:
    warnings.filterwarnings("ignore", ".*not an instance of PreTrainedModel.*")
    accelerator = Accelerator(cpu=True)
    local = GLOBAL_BATCH // accelerator.num_processes
    dataset = torch.utils.data.TensorDataset(torch.arange(N))
    results: dict = {"rank": accelerator.process_index, "sizes": SIZES.tolist()}

    def sampler():
        return DistributedSampler(dataset, batch_size=GLOBAL_BATCH, sizes=SIZES)

    try:
        epochs(accelerator.prepare(DataLoader(dataset, batch_size=local, sampler=sampler())))
        results["refused_accelerate"] = None
    except ValueError as error:
        results["refused_accelerate"] = str(error)

    results["accelerate"] = epochs(
        prepare(accelerator, DataLoader(dataset, batch_size=local, sampler=sampler()))
    )
    batches = DistributedBatchSampler(dataset, GLOBAL_BATCH, sizes=SIZES)
    results["accelerate_batches"] = epochs(
        prepare(accelerator, DataLoader(dataset, batch_sampler=batches))
    )
    fresh = prepare(accelerator, DataLoader(dataset, batch_size=local, sampler=sampler()))
    skipped = accelerator.skip_first_batches(fresh, SKIP)
    results["skipped"] = epochs(skipped, first=1)

    steps = -(-len(sampler()) // local)  # per epoch

    class Naive(transformers.Trainer):
        """What a user migrating a script writes first: chronica's sampler returned from
        the Trainer's sampler hook."""

        def _get_train_sampler(self, train_dataset=None):
            return DistributedSampler(TABLE, batch_size=GLOBAL_BATCH, sizes="length")

    try:
        train(folder, Naive)
        results["refused_trainer"] = None
    except ValueError as error:
        results["refused_trainer"] = str(error)

    results["trainer"] = train(folder)

    def custom_loader(self):
        sampler = DistributedSampler(TABLE, batch_size=GLOBAL_BATCH, sizes="length")
        return DataLoader(TABLE, batch_size=local, sampler=sampler, collate_fn=self.data_collator)

    custom = type("Custom", (Trainer,), {"get_train_dataloader": custom_loader})
    results["custom"] = train(folder, custom)
    plain = type("Plain", (transformers.Trainer,), {"get_train_dataloader": custom_loader})
    try:
        train(folder, plain)
        results["refused_custom"] = None
    except RuntimeError as error:
        results["refused_custom"] = str(error)
    stop = steps + 3  # mid-epoch 1
    results["stopped"] = train(
        folder, callbacks=[StopAt(stop)], save_strategy="steps", save_steps=10**6
    )
    results["resumed"] = train(folder, resume=True)
    results["stop"] = stop
    results["packed"] = packed_trainer.train(os.path.join(folder, "packed"), world=WORLD)

    def stream_loader():
        stream = StreamingDataset(make_source(), Packing(max_tokens=1024), batch_size=12)
        return DataLoader(stream, batch_size=None)

    try:
        prepare(accelerator, stream_loader())
        results["refused_stream"] = None
    except ValueError as error:
        results["refused_stream"] = str(error)
    streaming = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False)
    )
    results["stream"] = [
        [b["step"], b["micro"], b["num_micro"], b["indices"].tolist()]
        for b in prepare(streaming, stream_loader())
    ]
    results["stream_samples"] = int(make_source().offsets[-1])
    results["streamed"] = stream_trainer.run(
        os.path.join(folder, "streamed"), accelerator.process_index
    )
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
