"""From a plan's indices to numpy batches of a random-access source (numpy only).

The JAX iterator (``chronica.jax.iterator``) and the Grain step source
(``chronica.jax.StepSource``) hand out the same arrays for the same plan; this module is what
they share, with no framework in it:

- ``random_access`` checks a source (``len`` and ``[]``) and turns a dict of equal-length
  columns into a sequence of per-sample dicts (``Columns``);
- ``PaddedBatches`` makes a local batch into static-shape arrays: the batch dimension is
  ``rows`` (or, with ``variable_batch``, a power of two), the sequence dimension the
  smallest bucket boundary that holds the longest sample, with ``mask``, ``lengths``,
  ``valid``, ``indices`` and ``loss_weight``;
- ``PackedBatches`` makes a packed micro-batch into dense rows of several documents
  (``chronica.runtime.rows``'s layout), and a whole packed step into its micro-batches
  stacked on a leading axis.

Records are read when a batch needs them, never ahead: given sizes (so that no sample's
length is needed to plan), ``PaddedBatches`` learns a sample's length when its batch reads
it, and ``PackedBatches`` reads the first record (for the fields' dtypes and shapes) and
then only the documents of the micro-batch it makes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chronica.core import Packing, ScheduleConfig, resolve_sizes
from chronica.core.checks import check_int
from chronica.core.sizes import defines_sizeof
from chronica.runtime.micro import MicroBatch
from chronica.runtime.rows import (
    TOKENS,
    check_field_lengths,
    packed_dtype,
    packed_names,
    row_layout,
)
from chronica.runtime.stream import LocalBatch

__all__ = [
    "META_KEYS",
    "Columns",
    "PackedBatches",
    "PaddedBatches",
    "default_boundaries",
    "random_access",
    "read_lengths",
    "record_batches",
    "sample_length",
]

# What a padded batch holds besides the samples' fields.
META_KEYS = ("mask", "lengths", "indices", "loss_weight", "valid")
# A padded batch's keys that stay numpy when the arrays go on a device.
HOST_KEYS = ("indices", "loss_weight")
# A packed micro-batch's keys that stay numpy (plain numbers, the documents' indices).
PACKED_HOST_KEYS = ("loss_weight", "step", "micro", "num_micro", "indices")


class Columns:
    """A mapping of equal-length columns seen as a sequence of per-sample dicts: sample
    ``i`` is ``{name: column[i]}``.

    Args:
        columns: column name (a str) -> a column with ``len`` and ``[]``, all of one length.
        reserved: names no column may have (they are batch keys).

    Example::

        >>> data = Columns({"tokens": [np.arange(3), np.arange(5)], "label": np.array([0, 1])})
        >>> len(data), data[1]["label"]
        (2, 1)
    """

    def __init__(self, columns: Mapping[str, Any], reserved: Sequence[str] = META_KEYS) -> None:
        if not columns:
            raise ValueError("source is an empty mapping; give at least one column")
        lengths = {}
        for key, column in columns.items():
            if not isinstance(key, str):
                raise TypeError(f"source column names must be str, got {key!r}; rename it")
            if key in reserved:
                raise ValueError(f"source column {key!r} clashes with a batch key; rename it")
            try:
                lengths[key] = len(column)
            except TypeError as exc:
                raise TypeError(
                    f"source column {key!r} has no len(); give a list or an array"
                ) from exc
        if len(set(lengths.values())) != 1:
            raise ValueError(f"source columns differ in length: {lengths}")
        self.columns = dict(columns)
        self.n = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Columns({sorted(self.columns)}, n={self.n})"

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {key: column[index] for key, column in self.columns.items()}


def random_access(source: Any, reserved: Sequence[str] = META_KEYS) -> Any:
    """``source`` as a random-access sequence of samples: a mapping of columns becomes
    ``Columns``; anything else must have ``__len__`` and ``__getitem__``. Raises
    ``ValueError`` naming what is missing.

    Args:
        source: a numpy array, a list of arrays, a dict of columns, or any object with
            ``__len__`` and ``__getitem__``.
        reserved: names a dict's columns may not have (the face's batch keys).

    Example: ``random_access({"tokens": docs})[0] == {"tokens": docs[0]}``.
    """
    if source is None:
        raise ValueError("source is required: a random-access data set (len and [])")
    if isinstance(source, Mapping):
        return Columns(source, reserved)
    if not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
        raise TypeError(
            f"source of type {type(source).__name__} is not random-access; it needs "
            f"__len__ and __getitem__ (a numpy array, a list of arrays, a dict of columns)"
        )
    return source


def sample_length(sample: Any) -> int:
    """Sequence length of one sample: its first axis (the longest over a dict's fields;
    scalar fields do not count). ``ValueError`` for a scalar sample.

    Args:
        sample: an array-like with at least one axis, or a dict of such arrays and scalars.

    Example::

        >>> sample_length({"tokens": np.arange(7), "label": 3})
        7
    """
    if isinstance(sample, Mapping):
        lengths = [sample_length(v) for v in sample.values() if np.ndim(v) >= 1]
        return max(lengths, default=0)
    if np.ndim(sample) < 1:
        raise ValueError(
            "every sample must be a sequence (an array with at least one axis) or a dict of "
            f"arrays; got a scalar of type {type(sample).__name__}"
        )
    return len(sample)


def read_lengths(source: Any) -> np.ndarray:
    """Every sample's length (``sample_length``), int64, reading every record once.

    Args:
        source: a random-access source (``random_access``).

    Example: ``read_lengths([np.arange(3), np.arange(5)])`` is ``array([3, 5])``.
    """
    n = len(source)
    return np.fromiter((sample_length(source[i]) for i in range(n)), dtype=np.int64, count=n)


def default_boundaries(max_length: int) -> tuple[int, ...]:
    """Powers of two below the longest sample, then the longest sample itself.

    Args:
        max_length: the longest sample's length (0 or more).

    Example::

        >>> default_boundaries(20)
        (1, 2, 4, 8, 16, 20)
    """
    bounds = []
    b = 1
    while b < max_length:
        bounds.append(b)
        b *= 2
    bounds.append(max(max_length, 1))
    return tuple(bounds)


def _power_of_two(count: int) -> int:
    """The smallest power of two ``>= count`` (1 for 0)."""
    return 1 << max(count - 1, 0).bit_length()


def _checked_boundaries(boundaries: Any) -> tuple[int, ...]:
    try:
        values = [int(b) for b in boundaries]
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"bucket_boundaries={boundaries!r} must be a sequence of positive ints"
        ) from exc
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        raise ValueError(
            f"bucket_boundaries={boundaries!r} must be non-empty, positive and strictly increasing"
        )
    return tuple(values)


def _too_long(length: int, largest: int, sample: str = "the longest sample") -> ValueError:
    return ValueError(
        f"{sample} has length {length} > the largest bucket boundary {largest}; add a "
        f"boundary >= {length} to bucket_boundaries"
    )


class PaddedBatches:
    """Static-shape numpy batches of ``source``'s samples, one per local batch.

    Guarantees, for a ``LocalBatch`` of ``k`` samples (``make``):

    - one key per field of dict samples (else ``inputs``), each padded with ``pad_value``
      to ``(batch_rows(k), length, ...)`` (scalar fields: ``(batch_rows(k),)``, padding 0),
      where ``length`` is ``bucket()`` of the batch's longest sample (with ``everyone``,
      the longest of those samples: the whole step's, so every rank pads alike);
    - ``mask[i, t]`` is True exactly for ``t < lengths[i]``; ``valid`` is True on the ``k``
      real rows; ``indices`` is ``-1`` and ``lengths`` 0 on padding rows; ``loss_weight``
      is the batch's (float32);
    - ``(rows, length)`` is added to ``shapes_seen``; at most ``num_shapes`` shapes occur.

    Args:
        source: a random-access source (``random_access``).
        rows: the most rows a batch has (``>= 1``): the local batch size, or ``max_batch``.
        variable_batch: a batch of ``k`` samples has the smallest power of two ``>= k``
            rows, at most ``rows``.
        same_rows: every batch has ``rows`` rows even with ``variable_batch``.
        bucket_boundaries: the padded sequence lengths, strictly increasing (default:
            powers of two up to the longest sample).
        pad_value: what padding holds in sequence fields.
        lengths: every sample's length, if known up front (``read_lengths``); ``None``
            reads a sample's length when a batch first reads it, and without
            ``bucket_boundaries`` buckets are then every power of two.

    Example::

        >>> maker = PaddedBatches([np.arange(3), np.arange(9)], rows=2, bucket_boundaries=(4, 16))
        >>> maker.make(LocalBatch(0, 0, np.array([0, 1]), 1.0))["inputs"].shape
        (2, 16)
    """

    def __init__(
        self,
        source: Any,
        *,
        rows: int,
        variable_batch: bool = False,
        same_rows: bool = False,
        bucket_boundaries: Sequence[int] | None = None,
        pad_value: Any = 0,
        lengths: np.ndarray | None = None,
    ) -> None:
        self.source = source
        self.rows = check_int("rows", rows, 1, hint=" (the most rows of a batch)")
        self.variable_batch = variable_batch
        self.same_rows = same_rows
        self.pad_value = pad_value
        self.shapes_seen: set[tuple[int, int]] = set()
        n = len(source)
        self._lengths = (
            np.full(n, -1, dtype=np.int64) if lengths is None else np.asarray(lengths, np.int64)
        )
        self._boundaries: tuple[int, ...] | None
        if bucket_boundaries is not None:
            self._boundaries = _checked_boundaries(bucket_boundaries)
            longest = int(self._lengths.max(initial=0))
            if longest > self._boundaries[-1]:
                raise _too_long(longest, self._boundaries[-1])
        elif lengths is not None:
            self._boundaries = default_boundaries(int(self._lengths.max(initial=0)))
        else:
            self._boundaries = None  # every power of two

    def __repr__(self) -> str:
        return (
            f"PaddedBatches(rows={self.rows}, variable_batch={self.variable_batch}, "
            f"same_rows={self.same_rows}, bucket_boundaries={self._boundaries!r}, "
            f"pad_value={self.pad_value!r})"
        )

    # -- shapes ---------------------------------------------------------------------------

    @property
    def bucket_boundaries(self) -> tuple[int, ...]:
        """The padded sequence lengths: given, or the default; with buckets of every power
        of two, those up to the bucket of the longest sample read so far."""
        if self._boundaries is not None:
            return self._boundaries
        top = self.bucket(int(self._lengths.max(initial=0)))
        return tuple(1 << k for k in range(top.bit_length()))

    def bucket(self, length: int) -> int:
        """The padded length for a batch whose longest sample has ``length`` elements (a
        Python or numpy int)."""
        length = int(length)
        if self._boundaries is None:
            return _power_of_two(length)
        pos = int(np.searchsorted(self._boundaries, length, side="left"))
        if pos == len(self._boundaries):
            raise _too_long(length, self._boundaries[-1], "a sample")
        return self._boundaries[pos]

    def batch_rows(self, count: int) -> int:
        """Rows of a batch holding ``count`` real samples: ``rows``, or with
        ``variable_batch`` (and not ``same_rows``) the smallest power of two ``>= count``
        capped at ``rows``."""
        if not self.variable_batch or self.same_rows:
            return self.rows
        return min(_power_of_two(count), self.rows)

    @property
    def num_shapes(self) -> int:
        """An upper bound on the distinct ``(rows, length)`` shapes: row sizes times the
        length buckets some sample's length falls into. Samples whose length was not read
        yet are read now (only when the lengths were not given up front)."""
        rows = {self.batch_rows(count) for count in range(1, self.rows + 1)}
        lengths = self.lengths(np.arange(self._lengths.shape[0]))
        return len(rows) * len({self.bucket(int(length)) for length in np.unique(lengths)})

    def lengths(self, indices: np.ndarray) -> np.ndarray:
        """The lengths of samples ``indices``, reading those not known yet."""
        indices = np.asarray(indices, dtype=np.int64)
        out = self._lengths[indices]
        for j in np.flatnonzero(out < 0):
            i = int(indices[j])
            self._lengths[i] = out[j] = sample_length(self.source[i])
        return out

    # -- batches --------------------------------------------------------------------------

    def make(
        self,
        batch: LocalBatch,
        everyone: np.ndarray | None = None,
        reserved: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The padded batch of ``batch`` (see the class); ``everyone``: the samples whose
        longest decides the padded length (default: the batch's); ``reserved``: more keys
        that samples' fields may not use."""
        indices = batch.indices
        k = int(indices.shape[0])
        rows = self.batch_rows(k)
        samples = [self.source[int(i)] for i in indices]
        lengths = np.zeros(rows, dtype=np.int32)
        for j, (i, sample) in enumerate(zip(indices, samples, strict=True)):
            if self._lengths[i] < 0:
                self._lengths[i] = sample_length(sample)
            lengths[j] = self._lengths[i]
        longest = int(lengths.max(initial=0))
        if everyone is not None:
            longest = max(longest, int(self.lengths(everyone).max(initial=0)))
        if self._boundaries is not None and longest > self._boundaries[-1]:
            pool = indices if everyone is None else np.concatenate([indices, everyone])
            i = int(pool[np.argmax(self._lengths[pool])])
            raise _too_long(longest, self._boundaries[-1], f"sample {i}")
        length = self.bucket(longest)
        template = samples[0] if samples else self.source[0]
        out: dict[str, Any] = {}
        if isinstance(template, Mapping):
            for key in template:
                if key in META_KEYS or key in reserved:
                    raise ValueError(f"sample field {key!r} clashes with a batch key; rename it")
                column = [s[key] for s in samples]
                out[key] = self._stack(column, template[key], rows, length, key)
        else:
            out["inputs"] = self._stack(samples, template, rows, length, "inputs")
        valid = np.zeros(rows, dtype=bool)
        valid[:k] = True
        padded_indices = np.full(rows, -1, dtype=np.int64)
        padded_indices[:k] = indices
        out["mask"] = np.arange(length)[None, :] < lengths[:, None]
        out["lengths"] = lengths
        out["valid"] = valid
        out["indices"] = padded_indices
        out["loss_weight"] = np.float32(batch.loss_weight)
        self.shapes_seen.add((rows, length))
        return out

    def _stack(
        self, values: list[Any], template: Any, rows: int, length: int, key: str
    ) -> np.ndarray:
        arrays = [np.asarray(v) for v in values]
        first = np.asarray(template)
        if first.ndim == 0:  # a per-sample scalar (a label): no sequence axis
            out = np.zeros(rows, dtype=first.dtype)
            out[: len(arrays)] = arrays
            return out
        tail = first.shape[1:]
        out = np.full((rows, length, *tail), self.pad_value, dtype=first.dtype)
        for i, a in enumerate(arrays):
            if a.shape[1:] != tail:
                raise ValueError(
                    f"field {key!r}: sample shapes {first.shape} and {a.shape} differ beyond "
                    f"the first (sequence) axis"
                )
            out[i, : a.shape[0]] = a
        return out


class PackedBatches:
    """Packed micro-batches of ``source``'s documents: dense rows of several documents.

    Guarantees (``make``): micro-batch ``m`` of a packed ``LocalBatch`` holds exactly its
    pieces, each piece's tokens once, laid out as ``chronica.runtime.rows`` says:
    ``tokens`` (int32, ``(rows, row_length)``, ``pad_value`` on padding), ``segment_ids``,
    ``positions``, and a dict record's other fields packed the same way under their own
    names (each must be a per-token sequence as long as its tokens); then ``loss_weight``
    (float32), ``step``, ``micro``, ``num_micro`` (ints) and ``indices`` (int64, one entry
    per piece). Every micro-batch has the same shapes and dtypes: the fields' dtypes and
    trailing shapes come from the first record, the only one read before a micro-batch
    needs it. ``step_arrays`` stacks a step's micro-batches on a leading axis.

    Args:
        source: a random-access source of documents: token sequences, or dicts of
            per-token sequences.
        packing: the micro-batches' shape (``ScheduleConfig.packing``).
        token_field: with dict records, the field holding the tokens (yielded as
            ``tokens``); plain sequence records are the tokens themselves.
        pad_value: what padding holds in the packed fields.

    Example::

        >>> maker = PackedBatches(docs, Packing(256, row_length=128))
        >>> maker.make(batch, 0)["tokens"].shape  # a packed LocalBatch's first micro-batch
        (2, 128)
    """

    def __init__(
        self, source: Any, packing: Packing, token_field: str = TOKENS, pad_value: Any = 0
    ) -> None:
        if not isinstance(packing, Packing):
            raise TypeError(f"packing={packing!r} must be a chronica.core.packing.Packing")
        if not isinstance(token_field, str):
            raise TypeError(f"token_field={token_field!r} must be a str: the records' token field")
        self.source = source
        self.packing = packing
        self.token_field = token_field
        self.pad_value = pad_value
        self.record = False  # dict records (else sequences)
        self.fields = self._fields()
        self.shapes_seen: set[tuple[int, int]] = set()

    def __repr__(self) -> str:
        return f"PackedBatches({self.packing!r}, token_field={self.token_field!r})"

    def _field(self, record: Any, field: str) -> Any:
        return record[field] if isinstance(record, Mapping) else record

    def _fields(self) -> dict[str, tuple[str, Any, tuple[int, ...]]]:
        """Every packed field of the records: its batch key, dtype and trailing shape, read
        from the first record (so every micro-batch, empty ones included, has one shape)."""
        token_field = self.token_field
        if len(self.source) == 0:
            return {token_field: (TOKENS, np.dtype(np.int32), ())}
        first = self.source[0]
        self.record = isinstance(first, Mapping)
        names = packed_names(
            list(first.keys()) if self.record else None, token_field, reserved=("indices",)
        )
        out = {}
        for field, name in names.items():
            value = np.asarray(self._field(first, field))
            dtype = packed_dtype(name, field, value.dtype, value.ndim)
            out[field] = (name, dtype, tuple(value.shape[1:]))
        return out

    def document_lengths(self) -> np.ndarray:
        """Every document's length in tokens, reading every record's token field once."""
        n = len(self.source)
        return np.fromiter(
            (len(self._field(self.source[i], self.token_field)) for i in range(n)),
            dtype=np.int64,
            count=n,
        )

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, row_length)`` of every micro-batch."""
        return self.packing.rows, self.packing.length

    def make(self, batch: LocalBatch, m: int) -> dict[str, Any]:
        """Micro-batch ``m`` of the packed ``batch`` (see the class)."""
        packing = self.packing
        micro: MicroBatch = batch.micro[m]
        layout = row_layout(micro, packing.rows, packing.length)
        records = [self.source[int(i)] for i in micro.indices]
        if self.record and len(self.fields) > 1:
            tokens = [len(r[self.token_field]) for r in records]
            for field in self.fields:
                lengths = [len(r[field]) for r in records]
                check_field_lengths(field, lengths, tokens, self.token_field, micro.indices)
        out: dict[str, Any] = {}
        for field, (name, dtype, trailing) in self.fields.items():
            documents = [r[field] for r in records] if self.record else records
            out[name] = layout.fill(documents, self.pad_value, dtype, field, trailing)
        out["segment_ids"] = layout.segment_ids.copy()
        out["positions"] = layout.positions.copy()
        out["loss_weight"] = np.float32(micro.loss_weight)
        out["step"] = batch.step
        out["micro"] = m
        out["num_micro"] = len(batch.micro)
        out["indices"] = np.array(micro.indices, dtype=np.int64)
        self.shapes_seen.add(self.shape)
        return out

    def step_arrays(self, batch: LocalBatch) -> dict[str, Any]:
        """All micro-batches of the packed ``batch`` at once: every array of ``make``
        stacked on a leading axis of ``num_micro`` (``loss_weight`` float32
        ``(num_micro,)``; ``indices`` int64 ``(num_micro, pieces)``, ``-1`` past a
        micro-batch's pieces), plus ``step`` and ``num_micro``."""
        parts = [self.make(batch, m) for m in range(len(batch.micro))]
        rows = self.shape
        out: dict[str, Any] = {}
        arrays = [(name, dtype, trailing) for name, dtype, trailing in self.fields.values()]
        arrays += [(name, np.dtype(np.int32), ()) for name in ("segment_ids", "positions")]
        for name, dtype, trailing in arrays:
            empty = np.empty((0, *rows, *trailing), dtype=dtype)
            out[name] = np.stack([p[name] for p in parts]) if parts else empty
        out["loss_weight"] = np.array([p["loss_weight"] for p in parts], dtype=np.float32)
        width = max((p["indices"].shape[0] for p in parts), default=0)
        indices = np.full((len(parts), width), -1, dtype=np.int64)
        for j, p in enumerate(parts):
            indices[j, : p["indices"].shape[0]] = p["indices"]
        out["indices"] = indices
        out["step"] = batch.step
        out["num_micro"] = len(parts)
        return out


def record_batches(
    source: Any,
    sizes: Any,
    config: ScheduleConfig,
    *,
    bucket_boundaries: Sequence[int] | None = None,
    pad_value: Any = 0,
    token_field: str = TOKENS,
    same_rows: bool = False,
) -> tuple[PaddedBatches | PackedBatches, np.ndarray]:
    """The batch maker of a face planned by ``config`` over ``source`` (a ``random_access``
    source), and the validated sizes to plan with.

    Records are read up front only when the plan needs what they hold: without ``sizes``
    (and without the source's own ``sizes``/``__sizeof__``), every sample's length is the
    default size and is read once (unpacked: its ``sample_length``; packed: its token
    count); otherwise nothing is read (unpacked) or only the first record (packed, for the
    fields' dtypes and shapes).

    Args:
        source: a random-access source (``random_access``).
        sizes: per-sample sizes, or ``None`` (the source's own, else the lengths read).
        config: the face's configuration (the rows of a batch, or the packing).
        bucket_boundaries: unpacked only: the padded sequence lengths.
        pad_value: what padding holds.
        token_field: packed dict records: the field holding the tokens.
        same_rows: every batch has the most rows (one shape over several processes).

    Example::

        >>> maker, sizes = record_batches(docs, None, ScheduleConfig(2, 16))
        >>> type(maker).__name__, sizes.shape
        ('PaddedBatches', (1000,))
    """
    own_sizes = getattr(source, "sizes", None) is not None or defines_sizeof(source)
    derive = sizes is None and not own_sizes
    maker: PaddedBatches | PackedBatches
    if config.packing is None:
        if config.variable_batch:
            rows = config.batch_bounds()[1]
        else:
            assert config.batch_size is not None
            rows = config.batch_size // config.num_replicas
        lengths = read_lengths(source) if derive else None
        if derive:
            sizes = lengths  # default cost proxy: the sequence length
        maker = PaddedBatches(
            source,
            rows=rows,
            variable_batch=config.variable_batch,
            same_rows=same_rows,
            bucket_boundaries=bucket_boundaries,
            pad_value=pad_value,
            lengths=lengths,
        )
    else:
        packing = config.packing
        if bucket_boundaries is not None:
            raise ValueError(
                "bucket_boundaries= pads unpacked batches; packed micro-batches always "
                f"have {packing.rows} rows of row_length={packing.length} tokens"
            )
        maker = PackedBatches(source, packing, token_field, pad_value)
        if derive:
            sizes = maker.document_lengths()  # document lengths, read once
    return maker, resolve_sizes(source, sizes)
