"""``Packing``: how steps are cut into token-capped, packed micro-batches, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int
from chronica.core.packing.outliers import OutlierDelay
from chronica.core.pipeline import Pipeline

__all__ = ["BALANCES", "LONG_DOCUMENTS", "LOSS_NORMALISATIONS", "Packing"]

LONG_DOCUMENTS = ("error", "split", "truncate")
LOSS_NORMALISATIONS = ("token", "sample", "loss_token")
BALANCES = ("rank", "micro")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``: ``TypeError`` for a non-string, ``ValueError``
    for another string, both naming ``name`` and the choices."""
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} must be a string, one of {choices}")
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {choices}")
    return value


@dataclass(frozen=True)
class Packing:
    """How steps are cut into token-capped, packed micro-batches. Validated on construction:
    a wrong type raises ``TypeError``, a wrong value ``ValueError``, both naming the field.

    Args:
        max_tokens: the hard cap of tokens in one micro-batch (memory), ``>= 1``.
        row_length: the length of a packed row, ``1 .. max_tokens`` (default ``max_tokens``:
            one row, flat packing as flash-attention's variable-length path consumes); a
            micro-batch holds ``max_tokens // row_length`` rows.
        tokens_per_step: a global token budget per step (the step's documents are the next
            ones of the epoch's order up to about that many tokens); ``None`` keeps the
            configuration's ``batch_size`` documents per step.
        micro_batches: a fixed count per rank and step (more are taken only where the
            documents do not fit); ``None``: the fewest that fit.
        long_documents: what a document longer than a row does: ``"error"`` (default),
            ``"split"`` into row-long pieces trained as separate sequences, or
            ``"truncate"`` to its first ``row_length`` tokens.
        loss: ``"token"`` (mean over every token of the global batch, the language-model
            default), ``"sample"`` (mean over documents) or ``"loss_token"`` (mean over the
            tokens that carry loss; ``chronica.plan_step(..., loss_tokens=)`` gives their
            count per document).
        balance: the step the job runs. ``"rank"`` (default) balances every rank's *sum* of
            micro-batch costs: DDP with gradient accumulation, ``no_sync``, ZeRO-1/2, where a
            rank syncs once per step. ``"micro"`` balances micro-batch *k* of every rank
            against each other (minimises ``sum_k max_r C[r, k]``): FSDP, ZeRO-3, expert and
            tensor parallelism across data ranks, whose collectives run once per micro-batch
            so the ranks move in lockstep. See ``docs/step-planner.md`` for the table.
        micro_batch_multiple: the micro-batch count per rank is a multiple of it (``>= 1``;
            interleaved pipelines need a multiple of their stages).
        pad_multiple: every document is padded up to a multiple of it (``>= 1``, dividing
            ``row_length``; ``2 * cp`` for context parallelism, 8/64/128 for FP8 and
            tensor-core kernels); the cap and the costs count padded tokens.
        max_documents_per_row: the most documents in one row (attention kernels' segment
            limit), ``None`` for no limit.
        pipeline: a ``chronica.Pipeline`` (stages, virtual stages, schedule) each rank's
            micro-batches run through: their count obeys its rules (at least ``stages``; a
            multiple of ``stages`` when interleaved) and they are ordered to shorten its
            simulated step (``chronica.core.pipeline.order_micro_batches``); ``None``: no
            pipeline.
        outliers: a ``chronica.OutlierDelay``: documents heavier than a rank's fair share of
            their step wait (at most ``max_delay`` steps, at most ``max_queue`` at once) for
            a later step of the same epoch where they fit (``chronica.core.packing.outliers``);
            ``None``: every document trains in the step the epoch's order puts it in.
        context_parallel: the context-parallel size ``g`` (``>= 1``; default 1, none). The
            plan's ``world_size`` then counts devices, ``W = DP · g``, laid out as torch's
            device mesh ``("dp", "cp")``: device ``r`` is CP rank ``r % g`` of DP group
            ``r // g``. Per step ``chronica.plan_step`` shards the documents costlier than
            half a device's fair share over their group (head-tail chunks, ``1/g`` of the
            document's tokens and cost on each CP rank; documents up to ``g`` rows long) and
            packs the others whole; needs ``pad_multiple`` a multiple of ``2 · g``,
            ``balance="rank"``, no pipeline, ``loss="token"``; the samplers refuse it so far.
            See ``docs/step-planner.md``, "Context parallelism".

    Example::

        >>> packing = Packing(max_tokens=4096, row_length=1024, tokens_per_step=65536)
        >>> packing.rows
        4
        >>> packing
        Packing(max_tokens=4096, row_length=1024, tokens_per_step=65536)
    """

    max_tokens: int
    row_length: int | None = None
    tokens_per_step: int | None = None
    micro_batches: int | None = None
    long_documents: str = "error"
    loss: str = "token"
    balance: str = "rank"
    micro_batch_multiple: int = 1
    pad_multiple: int = 1
    max_documents_per_row: int | None = None
    pipeline: Pipeline | None = None
    outliers: OutlierDelay | None = None
    context_parallel: int = 1

    def __post_init__(self) -> None:
        hint = " (tokens in one micro-batch: the memory cap)"
        object.__setattr__(
            self, "max_tokens", check_int("max_tokens", self.max_tokens, 1, hint=hint)
        )
        if self.row_length is None:
            object.__setattr__(self, "row_length", self.max_tokens)
        object.__setattr__(
            self,
            "row_length",
            check_int("row_length", self.row_length, 1, self.max_tokens, hint=" (<= max_tokens)"),
        )
        if self.tokens_per_step is not None:
            object.__setattr__(
                self, "tokens_per_step", check_int("tokens_per_step", self.tokens_per_step, 1)
            )
        if self.micro_batches is not None:
            object.__setattr__(
                self, "micro_batches", check_int("micro_batches", self.micro_batches, 1)
            )
        _check_choice("long_documents", self.long_documents, LONG_DOCUMENTS)
        _check_choice("loss", self.loss, LOSS_NORMALISATIONS)
        _check_choice("balance", self.balance, BALANCES)
        object.__setattr__(
            self,
            "micro_batch_multiple",
            check_int("micro_batch_multiple", self.micro_batch_multiple, 1),
        )
        object.__setattr__(
            self,
            "pad_multiple",
            check_int("pad_multiple", self.pad_multiple, 1, self.length, hint=" (<= row_length)"),
        )
        if self.length % self.pad_multiple:
            raise ValueError(
                f"pad_multiple={self.pad_multiple} must divide row_length={self.length}, so "
                "that a padded row-long piece still fits its row"
            )
        if self.max_documents_per_row is not None:
            object.__setattr__(
                self,
                "max_documents_per_row",
                check_int("max_documents_per_row", self.max_documents_per_row, 1),
            )
        if self.pipeline is not None and not isinstance(self.pipeline, Pipeline):
            raise TypeError(
                f"pipeline={self.pipeline!r} must be a chronica.Pipeline (or None), e.g. "
                "Pipeline(stages=4)"
            )
        if self.outliers is not None and not isinstance(self.outliers, OutlierDelay):
            raise TypeError(
                f"outliers={self.outliers!r} must be a chronica.OutlierDelay (or None), e.g. "
                "OutlierDelay(max_delay=4)"
            )

        self._check_context_parallel()

    def _check_context_parallel(self) -> None:
        g = check_int("context_parallel", self.context_parallel, 1)
        object.__setattr__(self, "context_parallel", g)
        if g > 1 and self.pad_multiple % (2 * g):
            raise ValueError(
                f"context_parallel={g} cuts a sharded document into {2 * g} equal chunks: "
                f"pad_multiple={self.pad_multiple} must be a multiple of {2 * g}, e.g. "
                f"Packing(context_parallel={g}, pad_multiple={2 * g})"
            )

    def __repr__(self) -> str:
        """The fields that differ from their defaults (``row_length`` when it is not
        ``max_tokens``), as a call that builds an equal ``Packing``."""
        shown = [f"max_tokens={self.max_tokens}"]
        if self.row_length != self.max_tokens:
            shown.append(f"row_length={self.row_length}")
        defaults: tuple[tuple[str, object], ...] = (
            ("tokens_per_step", None),
            ("micro_batches", None),
            ("long_documents", "error"),
            ("loss", "token"),
            ("balance", "rank"),
            ("micro_batch_multiple", 1),
            ("pad_multiple", 1),
            ("max_documents_per_row", None),
            ("pipeline", None),
            ("outliers", None),
            ("context_parallel", 1),
        )
        shown += [f"{k}={getattr(self, k)!r}" for k, v in defaults if getattr(self, k) != v]
        return f"Packing({', '.join(shown)})"

    @property
    def rows(self) -> int:
        """Packed rows in one micro-batch."""
        assert self.row_length is not None
        return self.max_tokens // self.row_length

    @property
    def length(self) -> int:
        """The row length (``row_length`` with its default filled in)."""
        assert self.row_length is not None
        return self.row_length

    def to_tuple(self) -> tuple[object, ...]:
        """Every field, JSON-ready (part of the configuration digest)."""
        return (
            self.max_tokens,
            self.row_length,
            self.tokens_per_step,
            self.micro_batches,
            self.long_documents,
            self.loss,
            self.balance,
            self.micro_batch_multiple,
            self.pad_multiple,
            self.max_documents_per_row,
            None if self.pipeline is None else list(self.pipeline.to_tuple()),
            # Only when set, so that the digests of configurations without it stay as they were.
            *(() if self.outliers is None else (list(self.outliers.to_tuple()),)),
            # Appended only when set, so that the digests of existing configurations stay.
            *(() if self.context_parallel == 1 else (("context_parallel", self.context_parallel),)),
        )

    @property
    def count_multiple(self) -> int:
        """What every rank's micro-batch count is a multiple of: ``micro_batch_multiple``
        and the pipeline's rule together."""
        if self.pipeline is None:
            return self.micro_batch_multiple
        return math.lcm(self.micro_batch_multiple, self.pipeline.micro_batch_multiple)

    def padded(self, lengths: np.ndarray) -> np.ndarray:
        """``lengths`` rounded up to ``pad_multiple`` (``int64``).

        Args:
            lengths: tokens per document.

        Example::

            >>> Packing(max_tokens=64, pad_multiple=8).padded(np.array([1, 8, 9])).tolist()
            [8, 8, 16]
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        m = self.pad_multiple
        return lengths if m == 1 else -(-lengths // m) * m
