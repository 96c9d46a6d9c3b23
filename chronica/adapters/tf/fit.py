"""Keras's ``model.fit`` on chronica's batches: ``ScheduleCallback``, ``patch_keras_multiworker``.

``chronica.tf.schedule(..., x=..., y=...)`` yields ``(x, y, sample_weight)`` elements, one
epoch per iteration, sized for ``fit``. Keras iterates its data afresh every epoch (and once
more, before training, to build the model), but cannot tell the data set which epoch it
trains; this callback does: it selects Keras's epoch ``e`` as chronica's epoch ``e`` before
Keras opens the epoch's iterator, follows the steps Keras trained (not what ``tf.data``
prefetched), and given ``backup_dir`` backs training up and restores it, mid-epoch included,
exactly.

A backup is one ``tf.train.Checkpoint`` of the model, its optimizer and chronica's position
after the last batch trained (``Schedule.get_state(delivered=...)``, a
``tf.train.experimental.PythonState``), so the weights and the data position cannot come
from different steps. Under a ``tf.distribute`` strategy every worker writes it at the same
step (reading distributed variables may need every worker); the chief's goes to
``backup_dir``, the others' to a temporary directory they delete, as TensorFlow's multi-worker
guide does, and a small ``latest.json`` written last (an atomic rename) names the complete
one. Every worker restores the chief's, so ``backup_dir`` must be one directory every worker
reads (a shared file system, as for Keras's ``BackupAndRestore``); the workers check that
they restored the same position.

Keras has no way to start an epoch mid-way: a restored mid-epoch position is resumed by
Keras's epoch ``e`` (through ``model._initial_epoch``, as ``keras.callbacks.BackupAndRestore``
sets it) training the epoch's remaining steps only, after which this callback ends the
epoch (``StopIteration`` from ``on_train_batch_begin``, the way Keras ends an epoch whose data
ran out), before the empty elements that keep the iteration at its cardinality.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

import keras
import tensorflow as tf

from chronica.adapters.tf.data import Schedule

__all__ = ["ScheduleCallback", "patch_keras_multiworker"]

logger = logging.getLogger("chronica")

_LATEST = "latest.json"
_PREFIX = "ckpt"
# Keras's warning when an epoch ends before its cardinality, as a resumed epoch does.
_RAN_OUT = "Your input ran out of data"


class _Position(tf.train.experimental.PythonState):
    """Chronica's position inside the backup checkpoint: the state after the last batch
    trained, as JSON; restoring keeps the saved value in ``restored``."""

    def __init__(self, callback: ScheduleCallback) -> None:
        self.callback = callback
        self.restored: dict[str, Any] | None = None

    def serialize(self) -> str:
        return json.dumps(self.callback.state())

    def deserialize(self, string_value: Any) -> None:
        text = string_value.decode() if isinstance(string_value, bytes) else string_value
        self.restored = json.loads(text)


class ScheduleCallback(keras.callbacks.Callback):
    """Keeps ``model.fit``'s epochs and chronica's in step, and backs training up exactly.

    Pass it to ``model.fit(data, epochs=..., callbacks=[ScheduleCallback(schedule)])``, with
    ``schedule`` the ``chronica.tf.schedule(..., x=..., y=...)`` that ``data`` comes from
    (inside ``strategy.distribute_datasets_from_function``, the one the ``dataset_fn`` built
    on this worker) and without ``steps_per_epoch``. Guarantees:

    * Keras's epoch ``e`` trains exactly chronica's epoch ``e``, every step once, in plan
      order (``fit(initial_epoch=k)`` starts at chronica's epoch ``k``), so every example is
      used once per epoch and the order changes between epochs as the seed says;
    * ``state()``, at any point of training, is ``schedule.get_state`` after the last batch
      Keras trained (whatever ``tf.data`` prefetched); a ``schedule.set_state(state)``
      before ``fit`` (a checkpoint of your own) continues there, as a restored backup does;
    * with ``backup_dir``: every ``save_freq`` batches (``"epoch"``: at every epoch's end) the
      model's weights, its optimizer's state and that position are written as one
      checkpoint; when ``fit`` starts and ``backup_dir`` holds one, it is restored and
      training continues with the batch after the last one backed up, mid-epoch included:
      the remaining steps of that epoch, then the following epochs, the batches and updates
      an uninterrupted run would have made. ``delete_checkpoint`` removes the backup when
      ``fit`` completes (as ``keras.callbacks.BackupAndRestore``, which this replaces);
    * it fails loudly, naming the fix, when ``fit`` is given ``steps_per_epoch`` that
      differs from an epoch's steps, when ``fit`` ends an epoch before its last step
      without ``model.stop_training``, when the workers restored different backups, and
      when mid-epoch backups meet a ``steps_per_execution`` that does not divide an epoch.

    Args:
        schedule: the ``chronica.tf.Schedule`` with ``x=`` and ``y=`` feeding ``fit``.
        backup_dir: where backups go; ``None``: no backups, epochs only.
        save_freq: ``"epoch"`` or a number of batches between backups.
        delete_checkpoint: remove ``backup_dir``'s backup when ``fit`` completes.

    Raises ``TypeError`` for a ``schedule`` that is not a ``chronica.tf.Schedule``, a
    ``save_freq`` that is neither a string nor an int, or a ``backup_dir`` that is not a
    path; ``ValueError`` for a schedule without ``x=``/``y=`` or another ``save_freq``.

    Example::

        >>> schedule = chronica.tf.schedule(lengths, global_batch_size=32, num_replicas=1,
        ...                                 rank=0, x="tokens", y="label")
        >>> callback = chronica.tf.ScheduleCallback(schedule, backup_dir="/shared/backup")
        >>> callback
        chronica.tf.ScheduleCallback(backup_dir='/shared/backup', save_freq='epoch', ...)
        >>> model.fit(dataset.apply(schedule), epochs=3, callbacks=[callback])
    """

    def __init__(
        self,
        schedule: Schedule,
        backup_dir: str | os.PathLike[str] | None = None,
        save_freq: str | int = "epoch",
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__()
        needed = "the chronica.tf.schedule(..., x=..., y=...) whose output model.fit trains on"
        if not isinstance(schedule, Schedule):
            raise TypeError(f"ScheduleCallback needs {needed}, got {type(schedule).__name__}")
        if schedule.keras is None:
            raise ValueError(f"ScheduleCallback needs {needed}, got {schedule!r} without x=/y=")
        if not isinstance(save_freq, (str, int)) or isinstance(save_freq, bool):
            raise TypeError(
                f"save_freq={save_freq!r} must be 'epoch' or a number of batches (an int >= 1)"
            )
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq >= 1):
            raise ValueError(f"save_freq={save_freq!r} must be 'epoch' or a number of batches >= 1")
        if backup_dir is not None and not isinstance(backup_dir, (str, os.PathLike)):
            raise TypeError(
                f"backup_dir={backup_dir!r} must be a directory's path (a str or os.PathLike) "
                f"or None"
            )
        self.schedule = schedule
        self.backup_dir = None if backup_dir is None else os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = bool(delete_checkpoint)
        self._epoch: int | None = None  # Keras's (and chronica's) epoch being trained
        self._first = 0  # the chronica step this epoch's iteration starts at
        self._steps = 0  # steps of this epoch's plan
        self._done = -1  # the last step trained
        self._unsaved = 0  # batches trained since the last backup
        self._resumed: int | None = None  # epoch restored mid-way, until it begins
        self._quiet: warnings.catch_warnings | None = None
        self._checkpoint: tf.train.Checkpoint | None = None
        self._position = _Position(self)
        # Keras iterates the data once to build the model before any hook runs: a fit that
        # follows an interrupted one must find the schedule's next iteration selected.
        schedule._selected = True
        if schedule.num_replicas > 1 and not _patched():
            logger.warning(
                "chronica: Keras 3's model.fit fails under MultiWorkerMirroredStrategy with "
                "several workers before its first step (keras-team/keras#20585): call "
                "chronica.tf.patch_keras_multiworker() before model.fit"
            )

    def __repr__(self) -> str:
        return (
            f"chronica.tf.ScheduleCallback(backup_dir={self.backup_dir!r}, "
            f"save_freq={self.save_freq!r}, delete_checkpoint={self.delete_checkpoint}, "
            f"schedule={self.schedule!r})"
        )

    # -- the position ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """``schedule.get_state`` after the last batch Keras trained; raises
        ``RuntimeError`` before the first batch of an epoch.

        Example::

            >>> json.dump(callback.state(), open("position.json", "w"))  # in a callback
        """
        if self._epoch is None or self._done < self._first:
            raise RuntimeError("no batch of this model.fit epoch has been trained yet")
        return self.schedule.get_state(delivered={"epoch": self._epoch, "step": self._done})

    # -- Keras's hooks ---------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        """Checks ``fit``'s steps per epoch and restores the backup, if any. Keras calls
        the ``on_*`` hooks; no code of yours needs to.

        Args:
            logs: Keras's logs (unused).
        """
        steps = self.schedule.steps_per_epoch
        given = self.params.get("steps")
        if given is not None and given != steps:
            raise ValueError(
                f"model.fit runs {given} steps per epoch but an epoch of chronica's schedule "
                f"has {steps}: do not pass steps_per_epoch (the data set tells Keras its length)"
            )
        every = self.model.steps_per_execution
        if self.backup_dir and self.save_freq != "epoch" and every > 1 and steps % every:
            raise ValueError(
                f"mid-epoch backups (save_freq={self.save_freq}) need steps_per_execution "
                f"({every}) to divide an epoch's {steps} steps, so a resumed epoch ends on a "
                f"whole execution: change one of them, or back up with save_freq='epoch'"
            )
        if self.backup_dir:
            self._restore()
        if self.schedule._start is not None:
            self._continue()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        """Selects chronica's epoch ``epoch`` (kept where a restored backup left it).

        Args:
            epoch: Keras's epoch about to begin.
            logs: Keras's logs (unused).
        """
        if self._resumed != epoch:
            self.schedule.set_epoch(epoch)
        self._resumed = None
        selected, first, steps = self.schedule._next_iteration()
        if selected != epoch:
            raise RuntimeError(f"chronica selected epoch {selected} for Keras's epoch {epoch}")
        self._epoch, self._first, self._steps, self._done = epoch, first, steps, first - 1
        if first:
            # The resumed epoch ends early, on purpose: silence Keras's warning about it.
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """Ends a resumed epoch once its remaining steps are trained.

        Args:
            batch: the batch of Keras's epoch about to train (from 0).
            logs: Keras's logs (unused).
        """
        if self._first + batch >= self._steps:
            # Every step of the (resumed) epoch is trained; the elements after them are
            # empty: end Keras's epoch as when its data runs out.
            raise StopIteration

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        """Follows the step trained; backs up every ``save_freq`` batches.

        Args:
            batch: the batch of Keras's epoch just trained (from 0).
            logs: Keras's logs (unused).
        """
        done = min(self._first + batch, self._steps - 1)
        self._unsaved += done - self._done
        self._done = done
        if isinstance(self.save_freq, int) and self._unsaved >= self.save_freq:
            self._save()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        """Checks that the whole epoch was trained; backs up with ``save_freq="epoch"``.

        Args:
            epoch: Keras's epoch just ended.
            logs: Keras's logs (unused).
        """
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        if self._done != self._steps - 1 and not self.model.stop_training:
            trained = self._done - self._first + 1
            raise ValueError(
                f"model.fit ended epoch {epoch} after {trained} of its "
                f"{self._steps - self._first} steps: do not pass steps_per_epoch (the data set "
                f"tells Keras its length), and iterate chronica's output only through fit"
            )
        if self.save_freq == "epoch":
            self._save()

    def on_train_end(self, logs: Any = None) -> None:
        """Selects the next epoch for a later ``fit``; deletes the backup if asked.

        Args:
            logs: Keras's logs (unused).
        """
        if self._epoch is not None:
            # A later fit starts afresh at the following epoch.
            self.schedule.set_epoch(self._epoch + 1)
        self.model._initial_epoch = None  # a restored epoch applies to this fit only
        if self.backup_dir and self.delete_checkpoint and self._chief():
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    # -- backups ---------------------------------------------------------------------------

    def _chief(self) -> bool:
        return bool(self.model.distribute_strategy.extended.should_checkpoint)

    def _checkpoint_of_model(self) -> tf.train.Checkpoint:
        if self._checkpoint is None:
            optimizer = self.model.optimizer
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            parts: dict[str, Any] = {"model": self.model, "position": self._position}
            if optimizer is not None:
                parts["optimizer"] = optimizer
            self._checkpoint = tf.train.Checkpoint(**parts)
        return self._checkpoint

    def _save(self) -> None:
        self._unsaved = 0
        if not self.backup_dir or self._epoch is None or self._done < self._first:
            return
        checkpoint = self._checkpoint_of_model()
        if not self._chief():
            scratch = tempfile.mkdtemp(prefix="chronica-backup-")
            try:
                checkpoint.write(os.path.join(scratch, _PREFIX))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        latest = os.path.join(self.backup_dir, _LATEST)
        previous = _read_latest(latest)
        number = 0 if previous is None else previous["number"] + 1
        path = checkpoint.write(os.path.join(self.backup_dir, f"{_PREFIX}-{number}"))
        temporary = latest + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"number": number, "path": os.path.basename(path)}, f)
        os.replace(temporary, latest)  # the new backup is complete and named: atomic
        if previous is not None:
            prefix = os.path.join(self.backup_dir, previous["path"])
            for name in tf.io.gfile.glob(prefix + ".*"):
                tf.io.gfile.remove(name)

    def _restore(self) -> None:
        assert self.backup_dir is not None
        latest = _read_latest(os.path.join(self.backup_dir, _LATEST))
        epoch, first = -1, 0
        if latest is not None:
            if not self.model.built:
                raise ValueError(
                    f"{self.backup_dir!r} holds a backup to restore, but the model is not built "
                    f"yet: build it before model.fit (call it on a batch, or create and "
                    f"compile it under a tf.distribute strategy's scope), as for "
                    f"keras.callbacks.BackupAndRestore"
                )
            checkpoint = self._checkpoint_of_model()
            checkpoint.read(os.path.join(self.backup_dir, latest["path"])).assert_consumed()
            restored = self._position.restored
            assert restored is not None
            self.schedule.set_state(restored)
            epoch, first, _ = self.schedule._next_iteration()
        self._agree([epoch, first])

    def _continue(self) -> None:
        """Training continues where ``schedule.set_state`` (a backup's, or the user's) put
        the schedule: that epoch's remaining steps, or the next epoch after a whole one."""
        epoch, first, steps = self.schedule._next_iteration()
        if first >= steps:  # an epoch's end
            epoch += 1
            self.schedule.set_epoch(epoch)
        else:
            self._resumed = epoch
        self.model._initial_epoch = epoch  # how keras.callbacks.BackupAndRestore resumes

    def _agree(self, position: list[int]) -> None:
        """Every worker restored the same position (else the backup_dir they read differs)."""
        strategy = self.model.distribute_strategy
        if strategy.num_replicas_in_sync == 1:
            return
        local = tf.constant([position], dtype=tf.int64)
        values = strategy.experimental_distribute_values_from_function(lambda _: local)
        found = {tuple(row) for row in strategy.gather(values, axis=0).numpy().tolist()}
        if len(found) > 1:
            raise ValueError(
                f"the workers restored different backups from backup_dir={self.backup_dir!r} "
                f"((epoch, step) {sorted(found)}; -1 where none was found): backup_dir must "
                f"be one directory every worker reads, e.g. on a shared file system"
            )


def patch_keras_multiworker() -> bool:
    """Let ``model.fit`` run under ``MultiWorkerMirroredStrategy`` with several workers.

    Keras 3 (3.15 and before, keras-team/keras#20585) fails every ``fit`` there, whatever
    the data, in two places: to build the model it reduces the first batch across the
    replicas with ``strategy.reduce``, which ``MultiWorkerMirroredStrategy`` cannot do for a
    ``(x, y, sample_weight)`` tuple; and it averages every step's logs (the scalar loss) over
    the replicas with ``axis=0``, which a scalar lacks. This makes Keras build from the
    first local replica's batch (the shapes and dtypes it needs, with no communication) and
    average the logs over the replicas element-wise, as it does on one worker. Training,
    its gradients and updates are untouched. Call it once, before ``fit``; calling it again
    does nothing. Returns whether Keras was patched (``False`` for a Keras whose trainer has
    no such step, which then needs no patch).

    Example::

        >>> chronica.tf.patch_keras_multiworker()
        True
        >>> with strategy.scope():  # a MultiWorkerMirroredStrategy over several workers
        ...     model = make_model()
        >>> model.fit(data, epochs=3, callbacks=[chronica.tf.ScheduleCallback(schedule)])
    """
    owner = _trainer()
    if owner is None:
        return False
    original = vars(owner)["_maybe_symbolic_build"]
    if _patched():
        return True

    def build(model: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = getattr(model, "_distribute_strategy", None)
        if strategy is None or iterator is None or strategy.num_replicas_in_sync == 1:
            return original(model, iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:
            first = next(batches)
            break
        else:
            return original(model, iterator=None, data_batch=data_batch)

        def local(value: Any) -> Any:
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        return original(model, iterator=None, data_batch=tf.nest.map_structure(local, first))

    build._chronica_patched = True  # type: ignore[attr-defined]
    owner._maybe_symbolic_build = build  # type: ignore[attr-defined]
    trainer = sys.modules[owner.__module__]
    reduce = getattr(trainer, "reduce_per_replica", None)
    if reduce is not None:

        def reduce_per_replica(values: Any, strategy: Any, reduction: Any = "auto") -> Any:
            if reduction in ("auto", "mean") and _multi_worker(strategy):

                def mean(value: Any) -> Any:
                    if isinstance(value, tf.distribute.DistributedValues):
                        return strategy.reduce("MEAN", value, axis=None)
                    return value

                return tf.nest.map_structure(mean, values)
            return reduce(values, strategy, reduction)

        trainer.reduce_per_replica = reduce_per_replica  # type: ignore[attr-defined]
    return True


def _trainer() -> type | None:
    """Keras's TensorFlow trainer class (the one that builds the model before ``fit``)."""
    return next((c for c in keras.Model.__mro__ if "_maybe_symbolic_build" in vars(c)), None)


def _patched() -> bool:
    """Whether ``patch_keras_multiworker`` was applied (or Keras needs no patch)."""
    owner = _trainer()
    return owner is None or getattr(
        vars(owner)["_maybe_symbolic_build"], "_chronica_patched", False
    )


def _multi_worker(strategy: Any) -> bool:
    """Whether ``strategy`` is a ``MultiWorkerMirroredStrategy`` over several workers."""
    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )


def _read_latest(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return dict(json.load(f))
