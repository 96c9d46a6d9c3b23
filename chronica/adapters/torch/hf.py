"""chronica's samplers under Hugging Face accelerate and the transformers ``Trainer``.

accelerate's ``prepare`` shards every ``DataLoader`` of a map-style data set once more, by
batches (``BatchSamplerShard``): over a chronica sampler, which already yields this rank's
batches only, every rank would train ``1/W`` of them. ``unshard`` turns that shard into a
pass-through of exactly the batches chronica planned, the way transformers does for its own
rank-aware ``BatchRebalanceSampler``, and lets ``set_epoch`` reach the sampler through the
wrappers accelerate adds later (``skip_first_batches`` on resume). ``prepare`` is
``accelerator.prepare`` followed by ``unshard``. A ``StreamingDataset`` already yields this
rank's micro-batches only, and accelerate would shard it again (``IterableDatasetShard``,
which also cannot take ``batch_size=None``): ``unshard`` makes that shard a pass-through too.

``Trainer`` (a ``transformers.Trainer``) and ``TrainerMixin`` (for Trainer subclasses such as
TRL's) train on a ``DistributedSampler`` built from the training arguments: the global batch
``per_device_train_batch_size × world_size``, the data seed, ``dataloader_drop_last``, and
sizes from the data set's ``length_column_name`` column when it has one. The Trainer's own
checkpoints resume it exactly: ``resume_from_checkpoint`` skips the epoch's trained batches
of the same plan. With ``packing`` in ``scheduling`` it trains on packed micro-batches, one
Trainer batch per step (``chronica.adapters.torch.hf_packed``); a ``StreamingDataset`` as
``train_dataset`` trains the same way, step by step of the stream, its position saved in
the Trainer's checkpoints (``chronica.adapters.torch.hf_stream``).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from chronica.adapters.hf import arrow_sizes, hf_dataset
from chronica.adapters.torch.data import (
    DistributedBatchSampler,
    DistributedSampler,
    _ScheduledSampler,
)
from chronica.adapters.torch.packed import PackedDataset
from chronica.adapters.torch.streaming import StreamingDataset
from chronica.core.modes import DYNAMIC

__all__ = ["Trainer", "TrainerMixin", "prepare", "unshard"]

Trainer: type  # ``transformers.Trainer`` with ``TrainerMixin``, built by ``__getattr__``

# Arguments the Trainer integration takes from the training arguments, not from
# ``scheduling``.
_FROM_ARGS = ("dataset", "num_replicas", "rank", "batch_size")


def unshard(loader: Any) -> Any:
    """Undo accelerate's second sharding of a prepared ``loader`` whose sampler or batch
    sampler is chronica's; returns ``loader`` (changed in place).

    Guarantees: afterwards the loader yields exactly the batches chronica's sampler plans
    for this rank (a trailing partial step included, nothing padded or dropped), ``len``
    counts them, and ``set_epoch`` on the loader, or on what accelerate's
    ``skip_first_batches`` makes of it, reaches the sampler. A loader without accelerate's
    shard, or whose sampler is not chronica's, is returned unchanged. Over a chronica
    ``StreamingDataset`` (``DataLoader(dataset, batch_size=None)``), the loader yields exactly
    this rank's micro-batches, each once. Raises ``ValueError`` for accelerate's
    ``dispatch_batches=True`` (rank 0 would iterate a sampler or stream that plans for
    itself only; accelerate's default for an iterable data set).

    Args:
        loader: a ``DataLoader`` that ``accelerator.prepare`` returned.

    Example::

        loader = unshard(accelerator.prepare(DataLoader(ds, batch_sampler=sampler)))
    """
    from accelerate.data_loader import (
        BatchSamplerShard,
        DataLoaderDispatcher,
        IterableDatasetShard,
    )

    dataset = getattr(loader, "dataset", None)
    streamed = isinstance(getattr(dataset, "dataset", dataset), StreamingDataset)
    shard = None
    for name in ("batch_sampler", "sampler"):
        candidate = getattr(loader, name, None)
        if isinstance(candidate, BatchSamplerShard):
            shard = candidate
            break
    inner = getattr(shard, "batch_sampler", None) if shard is not None else None
    ours = inner if isinstance(inner, DistributedBatchSampler) else getattr(inner, "sampler", None)
    if isinstance(loader, DataLoaderDispatcher) and (streamed or _holds_chronica(loader)):
        what = "StreamingDataset yields" if streamed else "sampler plans"
        raise ValueError(
            "accelerate's dispatch_batches=True lets rank 0 iterate the loader and send "
            f"slices to the others, but chronica's {what} rank 0's batches only; use "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))"
        )
    if streamed and isinstance(dataset, IterableDatasetShard):
        # Every micro-batch to this process, one at a time, as the stream yields it.
        dataset.num_processes, dataset.process_index, dataset.batch_size = 1, 0, 1
        dataset.split_batches, dataset.drop_last = False, False
        return loader
    if shard is None or not isinstance(ours, _ScheduledSampler):
        return loader
    # A pass-through: every batch goes to this process, as it comes (no round-robin, no
    # padding of a short last batch with the epoch's first samples, nothing dropped).
    shard.num_processes, shard.process_index = 1, 0
    shard.even_batches, shard.drop_last = False, False
    # accelerate reaches a sampler's epoch through ``batch_sampler.batch_sampler.sampler``
    # once ``skip_first_batches`` wrapped the shard; the shard itself has no ``sampler``.
    shard.sampler = ours.sampler if isinstance(ours, DistributedBatchSampler) else ours
    return loader


def _holds_chronica(loader: Any) -> bool:
    batches = getattr(loader, "batch_sampler", None)
    return isinstance(batches, DistributedBatchSampler) or isinstance(
        getattr(batches, "sampler", None) or getattr(loader, "sampler", None), _ScheduledSampler
    )


def prepare(accelerator: Any, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects, **kwargs)``, with every prepared ``DataLoader`` over
    a chronica sampler passed through ``unshard``: what ``accelerator.prepare`` returns
    (one object, or a tuple), with the same guarantees as ``unshard`` for the loaders.

    Args:
        accelerator: the ``accelerate.Accelerator``.
        objects: what to prepare (models, optimizers, loaders), as for ``prepare``.
        kwargs: passed on to ``accelerator.prepare``.

    Example::

        model, optimizer, loader = chronica.torch.hf.prepare(accelerator, model, optimizer, loader)
    """
    prepared = accelerator.prepare(*objects, **kwargs)
    for item in prepared if isinstance(prepared, tuple) else (prepared,):
        if isinstance(item, torch.utils.data.DataLoader):
            unshard(item)
    return prepared


class TrainerMixin:
    """Mix into a ``transformers.Trainer`` class, before it
    (``class MyTrainer(TrainerMixin, SFTTrainer)``): training batches come from chronica's
    ``DistributedSampler``, balanced per step, sharded once.

    ``scheduling`` holds the sampler's other arguments (``sizes``, ``cost``, ``kind``,
    ``shuffle``, ``seed``, ``drop_last``...); the global batch (``per_device_train_batch_size``
    times the world size), the world and the rank come from the training arguments; ``seed``
    defaults to ``args.data_seed`` (else ``args.seed``), ``drop_last`` to
    ``args.dataloader_drop_last``, ``sizes`` to the column ``args.length_column_name`` of a
    ``datasets.Dataset`` that has it (read before the Trainer removes unused columns; a
    column name in ``sizes`` is read the same way).

    Guarantees: every rank trains its planned local batch at every step, each sample once
    per epoch (up to ``drop_last``'s padding or dropping), in a new order every epoch; a
    run resumed from one of the Trainer's checkpoints trains the same batches as an
    uninterrupted one (for ``kind="dynamic"``: the same samples per step). The sampler of
    the last built training loader is ``train_sampler``. ``train_sampling_strategy`` is
    replaced (a warning says so when it was set).

    A ``chronica.torch.StreamingDataset`` as ``train_dataset`` (with ``max_steps``, no
    ``scheduling``, ``gradient_accumulation_steps=1``, ``dataloader_num_workers=0``) trains
    one whole step of the stream per Trainer batch: every rank the same micro-batches
    count, the update the gradient of the step's global mean loss over its loss-bearing
    tokens, and a run resumed from one of the Trainer's checkpoints continues the stream
    where it stopped (bitwise the same run for the same world size).

    Args:
        args: the ``transformers.Trainer``'s positional arguments.
        scheduling: the sampler's other arguments: ``sizes``, ``labels``, ``partitions``,
            ``dynamic`` and any plan option of ``chronica.ScheduleConfig`` (``kind``,
            ``cost``, ``packing``...), by name; never the world, rank or batch.
        kwargs: the ``transformers.Trainer``'s keyword arguments.

    Example::

        trainer = chronica.torch.hf.Trainer(model=model, args=training_args,
                                            train_dataset=ds, scheduling={"cost": "quadratic"})
    """

    # What transformers.Trainer provides.
    args: Any
    train_dataset: Any

    def __init__(self, *args: Any, scheduling: Mapping[str, Any] | None = None, **kwargs: Any):
        options = dict(scheduling or {})
        taken = [name for name in _FROM_ARGS if name in options]
        if taken:
            raise ValueError(
                f"scheduling= cannot set {taken}: the Trainer's training arguments give the "
                "global batch (per_device_train_batch_size x world size), the world and the rank"
            )
        self.scheduling = options
        self.train_sampler: DistributedSampler | DistributedBatchSampler | None = None
        self._stream_steps: Any = None  # the loader's StreamSteps over a StreamingDataset
        self._stream_trained: int | None = None  # the stream's step trained last
        self._stream_timed: Any = None  # the DDP model a ComputeTimer times for the stream
        super().__init__(*args, **kwargs)

    def _sampler_arguments(self, dataset: Any) -> dict[str, Any]:
        """The sampler's arguments: ``scheduling``, with the world, rank, global batch,
        seed, ``drop_last`` and sizes from the training arguments and the data set."""
        args = self.args
        options = dict(self.scheduling)
        sizes = options.pop("sizes", None)
        original = self.train_dataset
        if sizes is None and hf_dataset(original):
            columns = original.column_names
            if args.length_column_name in columns:
                sizes = args.length_column_name
            elif "packing" in options and "input_ids" in columns:
                sizes = "input_ids"  # a packed document's size is its length in tokens
        if isinstance(sizes, str) and hf_dataset(original) and len(original) == len(dataset):
            sizes = arrow_sizes(original, sizes)  # before unused columns were removed
        # transformers 5 names the strategy; 4.x has a group_by_length flag.
        strategy = getattr(args, "train_sampling_strategy", None) or (
            "group_by_length" if getattr(args, "group_by_length", False) else "random"
        )
        if strategy not in ("random", "sequential"):
            warnings.warn(
                f"train_sampling_strategy={strategy!r} is replaced by chronica's "
                "DistributedSampler; leave it at 'random'",
                stacklevel=3,
            )
        options.setdefault("seed", args.data_seed if args.data_seed is not None else args.seed)
        options.setdefault("drop_last", args.dataloader_drop_last)
        world = max(1, args.world_size)
        local = getattr(self, "_train_batch_size", args.per_device_train_batch_size)
        return dict(
            num_replicas=world,
            rank=args.process_index if world > 1 else 0,
            batch_size=local * world,
            sizes=sizes,
            **options,
        )

    def _get_train_sampler(self, train_dataset: Any = None) -> DistributedSampler:
        """chronica's ``DistributedSampler`` for the training loader (transformers' hook)."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        self.train_sampler = DistributedSampler(dataset, **self._sampler_arguments(dataset))
        return self.train_sampler

    def get_train_dataloader(self) -> Any:
        """The Trainer's training loader, passed through ``unshard``; with ``packing`` in
        ``scheduling``, a loader of whole packed steps (``hf_packed.PackedSteps``); over a
        ``StreamingDataset``, a loader of the stream's whole steps
        (``hf_stream.StreamSteps``), after refusing (``ValueError``) what a stream cannot
        honour: ``scheduling=``, no ``max_steps``, ``gradient_accumulation_steps != 1``,
        worker processes, ``dispatch_batches=True``."""
        if isinstance(self.train_dataset, StreamingDataset):
            return self._stream_loader(self.train_dataset)
        if "packing" not in self.scheduling:
            return unshard(super().get_train_dataloader())  # type: ignore[misc]
        from chronica.adapters.torch.hf_packed import PackedSteps, collate_steps

        packing = self.scheduling["packing"]
        if getattr(packing, "tokens_per_step", None) is not None:
            raise ValueError(
                "chronica.torch.hf.Trainer with packing= takes the documents per step from "
                "per_device_train_batch_size x world size, so every epoch has the steps the "
                "Trainer counted; use Packing(tokens_per_step=None)"
            )
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError(
                "with packing=, every Trainer batch is one whole chronica step (its "
                "micro-batches are accumulated inside it): use gradient_accumulation_steps=1"
            )
        dataset = self.train_dataset
        batches = DistributedBatchSampler(dataset, **self._sampler_arguments(dataset))
        self.train_sampler = batches
        return torch.utils.data.DataLoader(
            PackedDataset(dataset),
            batch_sampler=PackedSteps(batches),
            collate_fn=collate_steps,
            num_workers=self.args.dataloader_num_workers,
        )

    def _stream_loader(self, stream: StreamingDataset) -> Any:
        """A loader of the stream's whole steps (``hf_stream.StreamSteps``), after refusing
        the training arguments a stream cannot honour."""
        from chronica.adapters.torch.hf_stream import StreamSteps

        args = self.args
        refused = {
            "scheduling=": (
                bool(self.scheduling),
                "a StreamingDataset carries its own plan (packing, batch_size, kind...): "
                "give it to the StreamingDataset and leave scheduling= out",
            ),
            "max_steps": (
                args.max_steps <= 0,
                "a stream has no length: set TrainingArguments(max_steps=...), the "
                "optimizer steps to train (a pass ends, the next one starts)",
            ),
            "gradient_accumulation_steps": (
                args.gradient_accumulation_steps != 1,
                "every Trainer batch is one whole step of the stream (its micro-batches are "
                "accumulated inside it): use gradient_accumulation_steps=1",
            ),
            "dataloader_num_workers": (
                args.dataloader_num_workers != 0,
                "a StreamingDataset reads ahead in a thread of its own, and each worker "
                "process would read the whole stream: use dataloader_num_workers=0",
            ),
            "dispatch_batches": (
                getattr(args.accelerator_config, "dispatch_batches", None) is True,
                "every rank reads its own lanes of the stream; rank 0 cannot read for the "
                "others: leave accelerator_config's dispatch_batches unset or False",
            ),
        }
        for name, (wrong, fix) in refused.items():
            if wrong:
                raise ValueError(f"chronica.torch.hf.Trainer on a StreamingDataset: {name}: {fix}")
        self._stream_steps, self._stream_trained = StreamSteps(stream), None
        return torch.utils.data.DataLoader(self._stream_steps, batch_size=None)

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' training step; a packed step (a list of micro-batches) runs every
        micro-batch's forward and backward (``hf_packed.packed_step_loss``), its loss
        normalised over the whole step's loss-bearing tokens (labels not -100) on every
        rank (``hf_packed.labelled_step_norms``: one all-reduce of two integers). A
        stream's step time is reported to it (``StreamingDataset.report``: used by
        ``kind="dynamic"``; on a DDP model, by a ``ComputeTimer``)."""
        if not isinstance(inputs, list):
            return super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        from chronica.adapters.torch.hf_packed import labelled_step_norms, packed_step_loss

        model.train()
        accelerator = self.accelerator  # type: ignore[attr-defined]
        device = self.args.device
        stream = self.train_dataset if isinstance(self.train_dataset, StreamingDataset) else None
        if stream is None:
            sampler = self.train_sampler
            assert isinstance(sampler, DistributedBatchSampler)
            assert sampler.stream.config.packing is not None
            loss, world = sampler.stream.config.packing.loss, sampler.num_replicas
        else:
            loss, world = stream.engine.packing.loss, accelerator.num_processes
        # Normalised over the step's loss-bearing tokens (labels not -100) on every rank.
        norms = labelled_step_norms(inputs, loss, lambda t: accelerator.reduce(t, "sum"), device)
        if stream is not None:
            # Only kind="dynamic" uses step times: a static stream's step is not timed
            # (no device synchronisation per step).
            dynamic = stream.engine.config.mode is DYNAMIC
            timed = dynamic and self._stream_timer(model)
            started = time.perf_counter()
        total = packed_step_loss(
            model,
            inputs,
            norms,
            world,
            accelerator.backward,
            lambda: accelerator.no_sync(model),
            device,
        )
        if stream is not None:
            if dynamic and not timed:  # one process: the step's time is its own compute
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                stream.report(time.perf_counter() - started, inputs[0]["step"])
            self._stream_trained = int(inputs[0]["step"])
        return total

    def _stream_timer(self, model: Any) -> bool:
        """Whether a ``ComputeTimer`` on the DDP ``model`` reports a ``kind="dynamic"``
        stream's step times (this rank's forward and backward, none of the waiting at the
        gradient all-reduce); made on first use for each model."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            return False
        if self._stream_timed is not model:
            from chronica.adapters.torch.feedback import ComputeTimer

            ComputeTimer(model, self.train_dataset)
            self._stream_timed = model
        return True

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' ``train``; on a ``StreamingDataset``, its planning thread is
        stopped afterwards on every rank (``StreamingDataset.close``: a later ``train``
        continues from the last step trained)."""
        output = super().train(*args, **kwargs)  # type: ignore[misc]
        if isinstance(self.train_dataset, StreamingDataset):
            self.train_dataset.close()
        return output

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """transformers' checkpoint, plus a stream's position at the last step trained
        (``hf_stream.save_stream_state``) in the checkpoint folder."""
        super()._save_checkpoint(model, trial)  # type: ignore[misc]
        steps = self._stream_steps
        if not isinstance(self.train_dataset, StreamingDataset) or steps is None:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from chronica.adapters.torch.hf_stream import save_stream_state

        if steps.step != self._stream_trained:
            raise RuntimeError(
                f"the stream's loader read step {steps.step} but step "
                f"{self._stream_trained} was trained last: a loader that reads ahead "
                "cannot save the stream's position; train on get_train_dataloader()'s loader"
            )
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"  # type: ignore[attr-defined]
        output = os.path.join(self._get_output_dir(trial=trial), folder)  # type: ignore[attr-defined]
        save_stream_state(self.train_dataset, output, self.args.process_index)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' one pass over the training loader (``epoch``, ``train_dataloader``
        by keyword), after selecting the epoch on a chronica sampler found in that loader:
        also one that a ``get_train_dataloader`` of your own built, which transformers
        cannot reach (a plain ``DataLoader`` has no ``set_epoch``). Resuming a
        ``StreamingDataset`` (``resume_from_checkpoint``), its first pass loads the stream's
        saved position (``hf_stream.load_stream_state``) and skips no batch."""
        sampler = _chronica_sampler(kwargs.get("train_dataloader"))
        epoch = kwargs.get("epoch")
        if sampler is not None and isinstance(epoch, int):
            sampler.set_epoch(epoch)
        checkpoint = kwargs.get("resume_from_checkpoint")
        stream = self.train_dataset
        if isinstance(stream, StreamingDataset) and checkpoint is not None:
            if epoch == kwargs.get("epochs_trained"):
                # The stream resumes at its own saved position: nothing to skip.
                from chronica.adapters.torch.hf_stream import load_stream_state

                load_stream_state(stream, checkpoint, self.args.process_index)
                kwargs["steps_trained_in_current_epoch"] = 0
        return super()._run_epoch(*args, **kwargs)  # type: ignore[misc]


def _chronica_sampler(loader: Any) -> _ScheduledSampler | None:
    """The chronica sampler or batch sampler that ``loader`` (a ``DataLoader``, maybe
    wrapped by accelerate) draws from, if any."""
    batches = getattr(loader, "batch_sampler", None)
    for candidate in (
        getattr(loader, "sampler", None),
        batches,
        getattr(batches, "sampler", None),
        getattr(batches, "batch_sampler", None),
    ):
        if isinstance(candidate, _ScheduledSampler):
            return candidate
    return None


def __getattr__(name: str) -> Any:
    # ``Trainer`` subclasses transformers.Trainer, so it is built on first use: importing
    # this module for ``prepare`` alone does not import transformers.
    if name != "Trainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import transformers

    trainer = type(
        "Trainer",
        (TrainerMixin, transformers.Trainer),
        {
            "__module__": __name__,
            "__doc__": "``transformers.Trainer`` with chronica's ``TrainerMixin``: "
            "balanced, once-sharded, resumable training batches.\n\n"
            "Args:\n"
            "    args: the ``transformers.Trainer``'s positional arguments.\n"
            "    scheduling: the sampler's other arguments (see ``TrainerMixin``).\n"
            "    kwargs: the ``transformers.Trainer``'s keyword arguments.\n\n"
            "Example::\n\n"
            "    trainer = chronica.torch.hf.Trainer(model=model, args=training_args,\n"
            "                                        train_dataset=ds,\n"
            "                                        scheduling={'cost': 'quadratic'})\n",
        },
    )
    globals()["Trainer"] = trainer
    return trainer
