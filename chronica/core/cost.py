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

__all__ = ["CostModel", "as_cost_model"]


@dataclass(frozen=True)
class CostModel:
    """``cost(s) = a + b·s + c·s²`` with non-negative finite coefficients.

    Guarantees: costs are finite and non-negative for non-negative sizes, and a larger size
    never costs less (the model is monotone on ``s ≥ 0``).
    """

    a: float = 0.0
    b: float = 1.0
    c: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
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
        """Cost equal to the size."""
        return cls(0.0, 1.0, 0.0)

    @classmethod
    def affine(cls, a: float, b: float) -> CostModel:
        """A fixed per-sample cost ``a`` plus ``b`` per unit of size."""
        return cls(float(a), float(b), 0.0)

    @classmethod
    def quadratic(cls, a: float = 0.0, b: float = 0.0, c: float = 1.0) -> CostModel:
        """``a + b·s + c·s²``."""
        return cls(float(a), float(b), float(c))

    @classmethod
    def attention(cls, hidden: int) -> CostModel:
        """Transformer layer cost ``s² + 8·h·s`` (attention scores plus projections)."""
        hidden = check_int("hidden", hidden, 1, hint=" (the model width)")
        return cls(0.0, 8.0 * hidden, 1.0)

    def __call__(self, sizes: np.ndarray) -> np.ndarray:
        """Costs of ``sizes`` as a new float64 array."""
        s = np.asarray(sizes, dtype=np.float64)
        out = np.full_like(s, self.a)
        if self.b:
            out += self.b * s
        if self.c:
            out += self.c * s * s
        return out

    def to_tuple(self) -> tuple[float, float, float]:
        return (float(self.a), float(self.b), float(self.c))


_NAMED = {"linear": CostModel.linear(), "quadratic": CostModel.quadratic()}


def as_cost_model(cost: Any) -> CostModel:
    """Turn the ``cost=`` argument into a ``CostModel``.

    Accepts ``None`` (linear), ``"linear"``, ``"quadratic"``, a ``CostModel``, or a tuple
    ``(a, b, c)``.
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
    if isinstance(cost, tuple) and len(cost) == 3:
        return CostModel(*(float(x) for x in cost))
    raise ValueError(
        f"cost={cost!r} is not understood; use 'linear', 'quadratic', a CostModel or a "
        f"tuple (a, b, c)"
    )
