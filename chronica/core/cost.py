"""Cost models: predicted seconds (or any consistent unit) of work for a sample of size ``s``.

Every model is the polynomial ``a + b·s + c·s²``: linear for token-wise work, quadratic for
attention (``s² + 8·h·s`` for hidden size ``h``). Models are applied once per run to the whole
size vector, vectorised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_int

__all__ = ["MAX_COST", "CostModel", "as_cost_model"]

_REAL = (int, float, np.integer, np.floating)
# The largest cost of one sample the balancing and packing kernels take: 2**128. Their sums
# (a step's, an epoch's: at most 2**63 samples) and the predicted times ``alpha + beta·load``
# then stay far inside float64, so no finite input overflows a kernel.
MAX_COST = 2.0**128


@dataclass(frozen=True)
class CostModel:
    """``cost(s) = a + b·s + c·s²`` with non-negative finite coefficients.

    Guarantees: costs are finite and non-negative for non-negative sizes, and a larger size
    never costs less (the model is monotone on ``s ≥ 0``). A coefficient that is not a real
    number raises ``TypeError``; a negative or non-finite one, or all three zero,
    ``ValueError``.

    Args:
        a: the fixed cost of every sample.
        b: the cost per unit of size.
        c: the cost per squared unit of size (attention).

    Example::

        >>> model = CostModel.attention(4)
        >>> model
        CostModel(a=0.0, b=32.0, c=1.0)
        >>> model(np.array([0.0, 2.0])).tolist()
        [0.0, 68.0]
    """

    a: float = 0.0
    b: float = 1.0
    c: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            value = getattr(self, name)
            if not isinstance(value, _REAL) or isinstance(value, (bool, np.bool_)):
                raise TypeError(
                    f"cost coefficient {name}={value!r} must be a real number "
                    f"(cost = a + b*s + c*s**2)"
                )
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"cost coefficient {name}={value!r} must be a finite number >= 0 "
                    f"(cost = a + b*s + c*s**2)"
                )
        if self.a == 0 and self.b == 0 and self.c == 0:
            raise ValueError(
                "cost model is identically zero; set b=1 for cost proportional to size"
            )

    @classmethod
    def linear(cls) -> CostModel:
        """Cost equal to the size.

        Example::

            >>> CostModel.linear()(np.array([3.0])).tolist()
            [3.0]
        """
        return cls(0.0, 1.0, 0.0)

    @classmethod
    def affine(cls, a: float, b: float) -> CostModel:
        """A fixed per-sample cost ``a`` plus ``b`` per unit of size.

        Args:
            a: the fixed cost of every sample.
            b: the cost per unit of size.

        Example::

            >>> CostModel.affine(2, 3)(np.array([1.0])).tolist()
            [5.0]
        """
        return cls(float(a), float(b), 0.0)

    @classmethod
    def quadratic(cls, a: float = 0.0, b: float = 0.0, c: float = 1.0) -> CostModel:
        """``a + b·s + c·s²`` (default: ``s²``).

        Args:
            a: the fixed cost of every sample.
            b: the cost per unit of size.
            c: the cost per squared unit of size.

        Example::

            >>> CostModel.quadratic()(np.array([3.0])).tolist()
            [9.0]
        """
        return cls(float(a), float(b), float(c))

    @classmethod
    def attention(cls, hidden: int) -> CostModel:
        """Transformer layer cost ``s² + 8·h·s`` (attention scores plus projections).

        Args:
            hidden: the model width ``h``, ``>= 1``.

        Example::

            >>> CostModel.attention(1024).b
            8192.0
        """
        hidden = check_int("hidden", hidden, 1, hint=" (the model width)")
        return cls(0.0, 8.0 * hidden, 1.0)

    @classmethod
    def transformer(
        cls,
        hidden: int,
        layers: int,
        heads: int,
        vocab: int = 0,
        ffn: int | None = None,
        head_dim: int | None = None,
        causal: bool = True,
    ) -> CostModel:
        """Training FLOPs of one document of ``L`` tokens in a decoder-only transformer
        (forward and backward, 3× the forward's multiply-adds × 2), documents attending only
        within themselves: per token, per layer, the projections ``2·h·(2·h + 2·kv)`` with
        ``kv = heads·head_dim`` for queries, keys, values and output and the feed-forward
        ``4·h·ffn`` (default ``ffn = 4·h``), plus the vocabulary projection ``2·h·vocab``;
        per token pair, per layer, scores and weighted values ``4·heads·head_dim``, halved
        by a causal mask. ``b`` is the per-token FLOPs, ``c`` the per-pair ones, ``a`` 0.

        Args:
            hidden: the model width ``h``.
            layers: transformer blocks.
            heads: attention heads.
            vocab: the vocabulary size (0: no output projection counted).
            ffn: the feed-forward width (default ``4·hidden``).
            head_dim: the width of one head (default ``hidden // heads``).
            causal: a causal mask (halves the attention pairs).

        Example::

            >>> gpt2 = CostModel.transformer(768, 12, 12, vocab=50257)
            >>> gpt2.c
            55296.0
        """
        hidden = check_int("hidden", hidden, 1, hint=" (the model width)")
        layers = check_int("layers", layers, 1)
        heads = check_int("heads", heads, 1)
        vocab = check_int("vocab", vocab, 0)
        ffn = hidden * 4 if ffn is None else check_int("ffn", ffn, 1)
        if head_dim is None:
            if hidden % heads:
                raise ValueError(
                    f"hidden={hidden} is not a multiple of heads={heads}; pass head_dim="
                )
            head_dim = hidden // heads
        head_dim = check_int("head_dim", head_dim, 1)
        width = heads * head_dim
        per_token = layers * (2 * hidden * (2 * hidden + 2 * width) + 4 * hidden * ffn)
        per_token += 2 * hidden * vocab
        per_pair = layers * 4 * width * (0.5 if causal else 1.0)
        return cls(0.0, 3.0 * per_token, 3.0 * per_pair)

    @classmethod
    def fit(cls, counts: Any, tokens: Any, squares: Any, seconds: Any) -> CostModel:
        """Calibrate ``a + b·L + c·L²`` from measured work: for every measurement (a
        micro-batch or a rank's step) the number of documents, their summed tokens, their
        summed squared tokens and the ``seconds`` it took. Non-negative least squares
        (coefficients scaled to the data, the same answer in any time unit up to scale);
        ``ValueError`` when the measurements cannot determine a non-zero model.

        Args:
            counts: documents of every measurement.
            tokens: their summed tokens.
            squares: their summed squared tokens.
            seconds: the time every measurement took.

        Example::

            >>> fitted = CostModel.fit([1, 1], [10, 20], [100, 400], [0.1, 0.2])
            >>> [round(x, 6) for x in fitted.to_tuple()]
            [0.0, 0.01, 0.0]
        """
        columns = [np.asarray(v, dtype=np.float64).ravel() for v in (counts, tokens, squares)]
        target = np.asarray(seconds, dtype=np.float64).ravel()
        lengths = {c.shape[0] for c in columns} | {target.shape[0]}
        if len(lengths) > 1 or target.shape[0] == 0:
            raise ValueError(
                "counts, tokens, squares and seconds must be equally long and not empty "
                f"(got lengths {[c.shape[0] for c in (*columns, target)]})"
            )
        features = np.column_stack(columns)
        if not (np.isfinite(features).all() and np.isfinite(target).all()):
            raise ValueError("measurements must be finite (no NaN or inf)")
        coefficients = _nonnegative_least_squares(features, target)
        if not coefficients.any():
            raise ValueError(
                "the measurements fit no positive cost; measure more varied work (documents "
                "of different lengths) or give the model's coefficients"
            )
        return cls(*(float(x) for x in coefficients))

    def __call__(self, sizes: np.ndarray, *, name: str = "sizes") -> np.ndarray:
        """Costs of ``sizes`` as a new float64 array, every one at most ``MAX_COST``
        (2**128): a larger (or overflowing) cost raises ``ValueError`` naming the sample, its
        size and this model, so that no step or epoch total can overflow a kernel.

        Args:
            sizes: non-negative sample sizes (any shape).
            name: how the message calls the sizes.

        Example::

            >>> CostModel.quadratic()(np.array([1e100]))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ValueError: cost=CostModel(a=0.0, b=0.0, c=1.0) gives sizes[0]=1e+100 a cost of ...
        """
        s = np.asarray(sizes, dtype=np.float64)
        out = np.full_like(s, self.a)
        with np.errstate(over="ignore"):
            if self.b:
                out += self.b * s
            if self.c:
                out += self.c * s * s
        too_big = ~(out <= MAX_COST)
        if too_big.any():
            flat = int(np.flatnonzero(too_big.ravel())[0])
            where = np.unravel_index(flat, s.shape) if s.ndim else ()
            place = ",".join(str(int(i)) for i in where)
            raise ValueError(
                f"cost={self!r} gives {name}[{place}]={s[where].item()!r} a cost of "
                f"{out[where].item():.3g}, more than 2**128 ({MAX_COST:.2g}); give sizes in a "
                f"larger unit or scale the coefficients down"
            )
        return out

    def to_tuple(self) -> tuple[float, float, float]:
        """``(a, b, c)`` as floats, JSON-ready (part of the configuration digest)."""
        return (float(self.a), float(self.b), float(self.c))


_NAMED = {"linear": CostModel.linear(), "quadratic": CostModel.quadratic()}


def as_cost_model(cost: Any) -> CostModel:
    """Turn the ``cost=`` argument into a ``CostModel``.

    Args:
        cost: ``None`` (linear), ``"linear"``, ``"quadratic"``, a ``CostModel``, or a tuple
            ``(a, b, c)``. Another type raises ``TypeError``; an unknown name or a tuple of
            another length ``ValueError``.

    Example::

        >>> as_cost_model((1, 2, 0))
        CostModel(a=1.0, b=2.0, c=0.0)
    """
    if cost is None:
        return _NAMED["linear"]
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, str):
        try:
            return _NAMED[cost]
        except KeyError:
            raise ValueError(
                f"cost={cost!r} is not a known model; use 'linear', 'quadratic', "
                f"CostModel.attention(hidden) or a tuple (a, b, c)"
            ) from None
    if isinstance(cost, tuple):
        if len(cost) != 3:
            raise ValueError(
                f"cost={cost!r} is not understood; a tuple holds three coefficients (a, b, c)"
            )
        return CostModel(*(float(x) for x in cost))
    raise TypeError(
        f"cost={cost!r} is not understood; use 'linear', 'quadratic', a CostModel or a "
        f"tuple (a, b, c)"
    )


def _nonnegative_least_squares(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``argmin |features·x - target|`` over ``x >= 0`` for three columns: the best of the
    unconstrained fits on every subset of columns whose solution is non-negative (exact for
    so few columns). Columns are scaled to unit norm first, so tokens and squared tokens
    weigh alike."""
    scale = np.linalg.norm(features, axis=0)
    scale[scale == 0] = 1.0
    scaled = features / scale
    best, best_error = np.zeros(features.shape[1]), float(np.sum(target**2))
    for mask in range(1, 1 << features.shape[1]):
        columns = [j for j in range(features.shape[1]) if mask >> j & 1]
        solution, *_ = np.linalg.lstsq(scaled[:, columns], target, rcond=None)
        if (solution < 0).any():
            continue
        error = float(np.sum((scaled[:, columns] @ solution - target) ** 2))
        if error < best_error * (1 - 1e-12):
            best_error = error
            best = np.zeros(features.shape[1])
            best[columns] = solution
    return best / scale
