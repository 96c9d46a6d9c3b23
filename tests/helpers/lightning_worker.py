"""One rank of a 2-process Lightning job (ddp on gloo, CPU), started by test_lightning.

Reads LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (Lightning's own
variables for processes launched outside it) and the checkpoint folder from argv[2]; writes
to argv[1] as JSON the batches every training step received, for each scenario:

* ``sampler``: ``DataLoader(sampler=DistributedSampler)`` under Lightning's defaults
  (``use_distributed_sampler=True``), 2 epochs;
* ``batch_sampler``: ``DataLoader(batch_sampler=DistributedBatchSampler)`` with
  ``use_distributed_sampler=False``, 2 epochs;
* ``stopped`` and ``resumed``: a ``StatefulDataLoader`` run stopped mid-epoch 1 by
  ``max_steps`` with a ``ModelCheckpoint`` at that step, then a new Trainer, model, loader
  and sampler resumed from that checkpoint with ``fit(ckpt_path=...)``;
* ``packed``: a packed ``DistributedBatchSampler`` (``PackedDataset``, ``collate_packed``)
  with ``use_distributed_sampler=False`` for ``PACKED_EPOCHS`` epochs, whose micro-batch
  counts differ from epoch to epoch, trained with manual optimization (an optimizer step
  at every step's last micro-batch): ``[epoch, documents, last, loss weight, tokens]`` of
  every micro-batch, ``packed_steps`` (optimizer steps per epoch) and ``packed_plan``
  (the epochs' own micro-batch and step counts);
* ``stream``: a ``StreamingDataset`` over an in-memory sharded source
  (``DataLoader(stream, batch_size=None)``, Lightning's defaults), one pass, trained by the
  same module: the same records per micro-batch as ``packed``, and ``stream_samples`` (the
  source's sample count);
* ``stream_stopped`` and ``stream_resumed``: the same stream in a ``StatefulDataLoader``,
  trained one whole step per ``training_step(dataloader_iter)`` (``StepModel``), stopped
  by ``max_steps`` at ``STREAM_STOP`` with a ``ModelCheckpoint`` there, then a new
  Trainer, model and stream resumed from that checkpoint (``fit(ckpt_path=...)``): their
  micro-batches as ``stream`` records them, and ``stream_params`` (the final parameters
  of ``stream``, of ``stream_resumed`` and of ``stream_micro_resumed``);
* ``stream_micro_stopped`` and ``stream_micro_resumed``: the same, trained one micro-batch
  per ``training_step(batch, batch_idx)`` (``MicroModel``: Lightning reads one micro-batch
  ahead) with ``chronica.torch.StreamCheckpoint`` among the callbacks;
* ``refused``: the message of the error a ``DistributedBatchSampler`` under Lightning's
  default ``use_distributed_sampler=True`` raises;
* ``sizes`` (of the samples) and ``stop`` (the global step the stopped run ended at).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import warnings

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from stream_source import make_source
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from chronica import Packing
from chronica.torch import StreamCheckpoint, StreamingDataset
from chronica.torch.utils.data import (
    Dataset,
    DistributedBatchSampler,
    DistributedSampler,
    PackedDataset,
    collate_packed,
)

N, GLOBAL_BATCH, EPOCHS = 88, 8, 2
SIZES = np.random.default_rng(0).lognormal(3, 1, N).round() + 1
DOCUMENTS, DOCUMENTS_PER_STEP, PACKED_EPOCHS = 200, 20, 3
LENGTHS = np.random.default_rng(0).integers(5, 120, size=DOCUMENTS)
PACKING = Packing(max_tokens=256)
STREAM_STOP = 3  # optimizer steps; the stream plans 2 steps a window: mid-window


class Clips(Dataset):
    """Sample ``i`` is ``(i, x_i)``; its size is ``SIZES[i]`` (the quick start's style)."""

    def __len__(self):
        return N

    def __getitem__(self, index):
        return index, torch.tensor([float(index % 7)])

    def __sizeof__(self, index):
        return SIZES[index]


class Model(L.LightningModule):
    """A one-weight regression that records the indices of every batch it trains on; its
    training loader is ``make_loader()``, built in ``train_dataloader`` as Lightning
    recommends (the process group exists there)."""

    def __init__(self, make_loader):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.make_loader = make_loader
        self.seen: list[list] = []

    def train_dataloader(self):
        return self.make_loader()

    def training_step(self, batch, batch_idx):
        indices, x = batch
        self.seen.append([self.current_epoch, batch_idx, indices.tolist()])
        return self.layer(x).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Documents(torch.utils.data.Dataset):
    """Document ``i`` is ``LENGTHS[i]`` tokens."""

    def __len__(self):
        return DOCUMENTS

    def __getitem__(self, index):
        return torch.arange(int(LENGTHS[index])) % 50 + 1


class PackedModel(L.LightningModule):
    """A token embedding trained on packed micro-batches with manual optimization: the
    loss of each micro-batch times its loss weight, one optimizer step at the last
    micro-batch of every step; records every micro-batch and every optimizer step. Its
    training loader is ``make_loader()``, for ``epochs`` epochs."""

    def __init__(self, make_loader, epochs):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)  # the same start in every run
        self.embedding = torch.nn.Embedding(64, 1)
        self.make_loader = make_loader
        self.seen: list[list] = []
        self.steps = [0] * epochs

    def train_dataloader(self):
        return self.make_loader()

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        tokens = batch["input_ids"] if batch["num_tokens"] else torch.zeros(1, dtype=torch.long)
        loss = self.embedding(tokens % 64).square().mean() * batch["loss_weight"]
        self.manual_backward(loss)  # an empty micro-batch (weight 0) still takes part
        self.seen.append(
            [
                self.current_epoch,
                batch["indices"].tolist(),
                bool(batch["last"]),
                float(batch["loss_weight"]),
                int(batch["num_tokens"]),
            ]
        )
        if batch["last"]:
            optimizer.step()
            optimizer.zero_grad()
            self.steps[self.current_epoch] += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepModel(PackedModel):
    """``PackedModel`` taking one whole step of the stream per ``training_step``, from
    ``dataloader_iter``: Lightning then reads no micro-batch ahead, so the stream's state
    in its checkpoints is the one after the last step trained. ``stream`` is the stream
    of the last loader built."""

    def train_dataloader(self):
        self.stream = self.make_loader()
        return StatefulDataLoader(self.stream, batch_size=None)

    def training_step(self, dataloader_iter):
        while True:
            batch, batch_idx, _ = next(dataloader_iter)
            super().training_step(batch, batch_idx)
            if batch["last"]:
                return


class MicroModel(PackedModel):
    """``PackedModel`` over the stream in a ``StatefulDataLoader``, one micro-batch per
    ``training_step(batch, batch_idx)``: Lightning reads one ahead of what was trained.
    ``stream`` is the stream of the last loader built."""

    def train_dataloader(self):
        self.stream = self.make_loader()
        return StatefulDataLoader(self.stream, batch_size=None)


def trainer(**kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def fit(make_loader, ckpt_path=None, **kwargs) -> list:
    model = Model(make_loader)
    trainer(**kwargs).fit(model, ckpt_path=ckpt_path)
    return model.seen


def main(out_path: str, folder: str) -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    results: dict = {"rank": int(os.environ["LOCAL_RANK"])}
    local = GLOBAL_BATCH // int(os.environ["WORLD_SIZE"])

    def sampler():
        return DistributedSampler(Clips(), batch_size=GLOBAL_BATCH)

    results["sampler"] = fit(lambda: DataLoader(Clips(), batch_size=local, sampler=sampler()))

    def batches():
        return DataLoader(Clips(), batch_sampler=DistributedBatchSampler(Clips(), GLOBAL_BATCH))

    results["batch_sampler"] = fit(batches, use_distributed_sampler=False)

    steps = -(-len(sampler()) // local)  # per epoch
    results["sizes"] = SIZES.tolist()
    results["stop"] = stop = steps + 3  # mid-epoch 1

    def stateful():
        return StatefulDataLoader(Clips(), batch_size=local, sampler=sampler())

    checkpoint = ModelCheckpoint(dirpath=folder, every_n_train_steps=stop, save_top_k=-1)
    results["stopped"] = fit(
        stateful, max_steps=stop, enable_checkpointing=True, callbacks=[checkpoint]
    )
    (saved,) = glob.glob(os.path.join(folder, "*.ckpt"))  # Trainer.save_checkpoint has a barrier
    results["resumed"] = fit(stateful, ckpt_path=saved)

    packed_sampler = DistributedBatchSampler(
        Documents(), DOCUMENTS_PER_STEP, sizes=LENGTHS, packing=PACKING
    )
    packed = PackedModel(
        lambda: DataLoader(
            PackedDataset(Documents()), batch_sampler=packed_sampler, collate_fn=collate_packed
        ),
        PACKED_EPOCHS,
    )
    trainer(max_epochs=PACKED_EPOCHS, use_distributed_sampler=False).fit(packed)
    results["packed"], results["packed_steps"] = packed.seen, packed.steps
    counts = []
    for epoch in range(PACKED_EPOCHS):
        plan = packed_sampler.plan(epoch)
        counts.append([int(plan.micro.num_micro.sum()), plan.num_steps])
    results["packed_plan"] = counts

    def stream():  # built in train_dataloader, where the process group exists
        return StreamingDataset(make_source(high=256), PACKING, batch_size=DOCUMENTS_PER_STEP)

    streamed = PackedModel(lambda: DataLoader(stream(), batch_size=None), 1)
    trainer(max_epochs=1).fit(streamed)
    results["stream"], results["stream_samples"] = (
        streamed.seen,
        int(make_source(high=256).offsets[-1]),
    )
    stream_folder = os.path.join(folder, "stream")
    checkpoint = ModelCheckpoint(
        dirpath=stream_folder, every_n_train_steps=STREAM_STOP, save_top_k=-1
    )
    stopped = StepModel(stream, 1)
    trainer(
        max_epochs=1, max_steps=STREAM_STOP, enable_checkpointing=True, callbacks=[checkpoint]
    ).fit(stopped)
    stopped.stream.close()  # the pass is unfinished: stop its planning thread on every rank
    (saved,) = glob.glob(os.path.join(stream_folder, "*.ckpt"))
    resumed = StepModel(stream, 1)
    trainer(max_epochs=1).fit(resumed, ckpt_path=saved)
    results["stream_stopped"], results["stream_resumed"] = stopped.seen, resumed.seen
    micro_folder = os.path.join(folder, "stream-micro")
    checkpoint = ModelCheckpoint(
        dirpath=micro_folder, every_n_train_steps=STREAM_STOP, save_top_k=-1
    )
    micro_stopped = MicroModel(stream, 1)
    trainer(
        max_epochs=1,
        max_steps=STREAM_STOP,
        enable_checkpointing=True,
        callbacks=[StreamCheckpoint(), checkpoint],
    ).fit(micro_stopped)
    micro_stopped.stream.close()
    (saved,) = glob.glob(os.path.join(micro_folder, "*.ckpt"))
    micro_resumed = MicroModel(stream, 1)
    trainer(max_epochs=1, callbacks=[StreamCheckpoint()]).fit(micro_resumed, ckpt_path=saved)
    results["stream_micro_stopped"] = micro_stopped.seen
    results["stream_micro_resumed"] = micro_resumed.seen
    results["stream_params"] = [
        model.embedding.weight.detach().flatten().tolist()
        for model in (streamed, resumed, micro_resumed)
    ]

    try:
        fit(batches)
        results["refused"] = None
    except ValueError as error:
        results["refused"] = str(error)
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
