"""Keras's ``(x, y, sample_weight)`` elements of ``chronica.tf.schedule(..., x=..., y=...)``.

``KerasOutput`` names the output features that form ``model.fit``'s inputs and targets,
refuses the schedule options ``fit`` cannot train (it iterates one epoch per iteration of
dense batches and reports no per-replica times), and turns a step's gathered features into
the element Keras trains on. ``sample_weight`` is the step's loss weight on every row:
Keras's default loss reduction divides each replica's weighted sum by its row count and the
replica count, and sums the replicas' gradients, so that weight makes it the mean over the
step's global batch. ``chronica.adapters.tf.fit`` holds the callback that selects each epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from chronica.adapters.tf.store import Row

__all__ = ["KerasOutput", "Names"]

# Which output features form Keras's x or y: one name (a tensor) or several (a dict).
Names = str | tuple[str, ...]


@dataclass(frozen=True)
class KerasOutput:
    """Which output features are Keras's ``x`` and ``y``; builds ``fit``'s elements.

    Guarantees: ``x`` and ``y`` are each one feature name (the element holds that tensor)
    or a tuple of distinct names (the element holds a dict of those tensors), checked on
    construction; ``element`` returns ``(x, y, sample_weight)`` with ``sample_weight`` the
    step's loss weight on every row (float32, ``(batch,)``), so that Keras's default loss
    reduction (each replica's weighted sum over its rows, divided by its rows and by the
    replica count, the replicas' gradients summed) is the mean over the step's global
    batch. The schedule's output is then one epoch per iteration, of
    ``steps_per_epoch`` elements (``whole_epoch``); ``chronica.tf.ScheduleCallback``
    selects the epoch ``fit`` trains, and backs up and restores training mid-epoch exactly.

    Args:
        x: the inputs of ``model.fit``: an output feature's name (e.g. ``"tokens"``,
            ``"tokens_mask"``; ``"x"`` for non-dict examples) or a sequence of names.
        y: the targets, named the same way (e.g. ``"label"``).

    Raises ``TypeError`` when ``x`` or ``y`` is neither a string nor a sequence of strings,
    ``ValueError`` for an empty sequence or a name given twice.

    Example::

        >>> KerasOutput(x=["tokens", "tokens_mask"], y="label")
        KerasOutput(x=('tokens', 'tokens_mask'), y='label')
    """

    x: Names
    y: Names

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", _names("x", self.x))
        object.__setattr__(self, "y", _names("y", self.y))

    @classmethod
    def of(
        cls,
        x: Any,
        y: Any,
        *,
        packed: bool,
        padded: Any,
        dynamic: bool,
        epochs: Any,
        served: int,
    ) -> KerasOutput | None:
        """The validated output of ``chronica.tf.schedule``'s ``x=`` and ``y=``, or
        ``None`` when neither is given; refuses the options ``model.fit`` cannot train.

        Args:
            x: the schedule's ``x=`` (``None``: not given).
            y: the schedule's ``y=`` (``None``: not given).
            packed: whether the schedule has ``packing=``.
            padded: the schedule's ``padded=`` (Keras needs ``True``).
            dynamic: whether the schedule is ``kind="dynamic"``.
            epochs: the schedule's ``epochs=`` (Keras needs ``1``).
            served: the replicas the input pipeline serves (Keras needs ``1``).

        Raises ``ValueError`` when only one of ``x``/``y`` is given or naming every option
        that cannot be combined with them; ``TypeError`` for names of a wrong type.

        Example::

            >>> KerasOutput.of("tokens", "label", packed=False, padded=True, dynamic=False,
            ...                epochs=1, served=1)
            KerasOutput(x='tokens', y='label')
        """
        if x is None and y is None:
            return None
        if x is None or y is None:
            raise ValueError(
                "x= and y= go together: name the output features Keras's model.fit takes as "
                "inputs and as targets (e.g. x='tokens', y='label')"
            )
        output = cls(x, y)
        fixes = {
            "packing=": packed,
            "padded=False (Keras takes dense batches; use the '<feature>_mask' outputs)": (
                padded is not True
            ),
            "kind='dynamic' (model.fit reports no per-replica compute times; use a custom "
            "training loop with schedule.report, see the TensorFlow quick start)": dynamic,
            f"epochs={epochs!r} (each iteration is one epoch: pass epochs= to model.fit "
            f"instead)": epochs != 1,
            f"an input pipeline serving {served} replicas (Keras sizes an epoch by the "
            f"pipeline's elements, one per replica; run one device per worker, e.g. "
            f"MultiWorkerMirroredStrategy)": served > 1,
        }
        refused = [what for what, found in fixes.items() if found]
        if refused:
            raise ValueError(
                "x=/y= (Keras's (x, y, sample_weight) elements, one epoch per iteration) "
                "cannot be combined with " + "; nor with ".join(refused)
            )
        return output

    def check_features(self, available: Sequence[str]) -> None:
        """Raise ``ValueError`` unless every name of ``x`` and ``y`` is an output feature.

        Args:
            available: the output's features (``ExampleStore.output_names(padded=True)``).

        Example::

            >>> KerasOutput("tok", "label").check_features(["tok", "tok_length", "tok_mask"])
            Traceback (most recent call last):
            ValueError: x=/y= name ['label'], which the output lacks; ...
        """
        named = [n for names in (self.x, self.y) for n in _tuple(names)]
        missing = [n for n in named if n not in available]
        if missing:
            raise ValueError(
                f"x=/y= name {missing}, which the output lacks; its features are {list(available)}"
            )

    def element(
        self, out: Mapping[str, Any], index: tf.Tensor, weight: tf.Tensor
    ) -> tuple[Any, Any, tf.Tensor]:
        """Keras's ``(x, y, sample_weight)`` of one step, in the ``tf.data`` graph.

        Args:
            out: the step's gathered features by name (``ExampleStore.gather``).
            index: the step's example indices (one per row).
            weight: the step's loss weight (float32 scalar).

        Example::

            >>> x, y, w = KerasOutput("tok", "label").element(features, index, weight)
        """
        # Keras's default loss reduction divides each replica's weighted sum by its row
        # count and the replica count, and sums the replicas' gradients: the loss weight
        # per row makes that the mean over the step's global batch.
        weights = tf.fill(tf.shape(index), weight)
        return _pick(out, self.x), _pick(out, self.y), weights

    @staticmethod
    def repeated(what: str) -> ValueError:
        """The error for an output iterated again without an epoch selected, which
        ``model.fit`` would train as the same epoch again.

        Args:
            what: what happened, the start of the message.

        Example::

            >>> raise KerasOutput.repeated("the output is iterated again")
        """
        return ValueError(
            f"{what}. Keras's model.fit iterates its data once per epoch (and once more "
            f"before training, to build the model): pass "
            f"callbacks=[chronica.tf.ScheduleCallback(schedule)] to model.fit, which selects "
            f"every epoch, and no steps_per_epoch (the data set tells Keras its length); in "
            f"a loop of your own call schedule.set_epoch(epoch) before every epoch"
        )

    @staticmethod
    def whole_epoch(rows: list[Row], epoch: int, steps: int, varying: int) -> list[Row]:
        """``rows`` of one epoch filled up to ``steps`` elements, so that every iteration of
        the output is exactly one epoch of ``model.fit``: a resumed epoch's missing steps
        come last as empty elements (step -1), which ``ScheduleCallback`` never lets Keras
        train.

        Args:
            rows: the epoch's rows the schedule produced (at most ``steps``).
            epoch: the epoch they belong to.
            steps: the elements of every iteration (``Schedule.steps_per_epoch``).
            varying: the number of variable-length features (a row's padded lengths).

        Raises ``ValueError`` when ``rows`` holds more than ``steps`` rows (an epoch resumed
        at a smaller global batch size, which ``fit`` cannot run as one epoch).

        Example::

            >>> len(KerasOutput.whole_epoch(rows[:3], epoch=0, steps=5, varying=1))
            5
        """
        if len(rows) > steps:
            raise ValueError(
                f"the resumed epoch {epoch} has {len(rows)} steps left at this world and "
                f"global batch size, more than an epoch's {steps}, which model.fit cannot "
                f"run as one epoch: resume it at its former global batch size"
            )
        empty = np.zeros(0, dtype=np.int64)
        pads = np.zeros(varying, dtype=np.int64)
        return rows + [(epoch, -1, empty, 0.0, pads)] * (steps - len(rows))


def _names(argument: str, value: Any) -> Names:
    """``x=``/``y=``: a feature name, or a non-empty sequence of distinct ones."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise TypeError(
            f"{argument}={value!r} must name an output feature (a string, giving a tensor) or "
            f"several (a list of strings, giving a dict of tensors)"
        )
    if not value or len(set(value)) != len(value):
        raise ValueError(
            f"{argument}={value!r} must name at least one output feature, each once (a list "
            f"of distinct strings, giving a dict of tensors)"
        )
    return tuple(value)


def _tuple(names: Names) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names


def _pick(out: Mapping[str, Any], names: Names) -> Any:
    """The tensor ``names`` names, or the dict of the tensors it names."""
    if isinstance(names, str):
        return out[names]
    return {name: out[name] for name in names}
