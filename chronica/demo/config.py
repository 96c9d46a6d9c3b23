"""What one demo run depends on (``DemoConfig``) and its data and cost model; no torch here."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from chronica import sizes_io
from chronica.core.checks import check_int
from chronica.core.cost import CostModel
from chronica.sim.speeds import SpeedProfile, parse_speeds

__all__ = ["SAMPLERS", "DemoConfig", "cost_model_for", "load_lengths", "make_lengths"]

SAMPLERS = ("torch", "chronica", "dynamic")


def make_lengths(
    n: int, seed: int = 0, mean_log: float = 5.0, sigma: float = 1.0, low: int = 8, high: int = 4096
) -> np.ndarray:
    """``n`` token lengths drawn from lognormal(``mean_log``, ``sigma``), rounded and clipped
    to ``[low, high]``, as int64. The same ``seed`` gives the same lengths everywhere."""
    n = check_int("n", n, 1, hint=" (number of samples)")
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(mean_log, sigma, n)), low, high).astype(np.int64)


def load_lengths(
    path: str | os.PathLike[str], limit: int | None = None, column: str | None = None
) -> np.ndarray:
    """Token lengths from a sizes file (read by ``chronica.sizes_io``, as ``chronica simulate
    --sizes`` reads it: text with one number per line, ``.npy``, or a ``.csv``/``.parquet``
    ``column``), optionally only the first ``limit``. Every length must be an integer >= 1."""
    values = sizes_io.read_sizes(path, column, option="--lengths")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 1) | (values != np.rint(values)))
    if bad.size:
        where = sizes_io.describe(path, column, option="--lengths")
        raise ValueError(
            f"{where}[{bad[0]}] is {values[bad[0]]:g}; every length must be an integer >= 1 "
            f"(a token count)"
        )
    if limit is not None:
        if limit > len(values):
            raise ValueError(
                f"--samples {limit} asks for more samples than {path} holds ({len(values)}); "
                f"leave --samples out to use them all"
            )
        values = values[:limit]
    return values.astype(np.int64)


def cost_model_for(cost: str, dim: int, hidden: int) -> CostModel:
    """The cost model matching ``PackedClassifier``'s multiply-adds per sequence of length s.

    ``linear``: the per-token MLP, cost ∝ s. ``quadratic``: with attention, 4·d·s² for the
    scores and their use plus (4·d·h + 8·d²)·s for the MLP and projections, divided by 4·d.
    """
    if cost == "linear":
        return CostModel.linear()
    if cost == "quadratic":
        return CostModel.quadratic(0.0, float(hidden + 2 * dim), 1.0)
    raise ValueError(f"cost={cost!r} must be 'linear' or 'quadratic'")


@dataclass
class DemoConfig:
    """Everything one demo run depends on; travels to the workers as JSON."""

    lengths: list[int]
    lengths_source: str
    batch_size: int = 32
    epochs: int = 6
    kind: str = "static"
    cost: str = "linear"
    seed: int = 0
    world_size: int = 2
    dim: int = 128
    hidden: int = 512
    lr: float = 3e-3
    warmup_steps: int = 3
    progress: bool = True
    collective_timeout_s: float = 120.0
    samplers: tuple[str, ...] = field(default=SAMPLERS[:2])
    speeds: str = "constant"
    coordinator_port: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the option to fix."""
        if self.world_size < 1:
            raise ValueError(f"--world-size {self.world_size} must be >= 1")
        if self.batch_size < self.world_size or self.batch_size % self.world_size:
            raise ValueError(
                f"--batch-size {self.batch_size} (global) must be a positive multiple of the "
                f"world size {self.world_size}"
            )
        if self.epochs < 1:
            raise ValueError(f"--epochs {self.epochs} must be >= 1")
        if len(self.lengths) < self.batch_size:
            raise ValueError(
                f"{len(self.lengths)} samples are fewer than one global batch "
                f"({self.batch_size}); raise --samples or lower --batch-size"
            )
        unknown = sorted(set(self.samplers) - set(SAMPLERS))
        if unknown or not self.samplers:
            raise ValueError(f"--samplers {unknown} must be a comma list of {SAMPLERS}")
        self.profile()  # raises naming --speeds and the accepted forms

    def profile(self) -> SpeedProfile:
        """The emulated rank speeds (``--speeds``, the grammar of ``chronica simulate``)."""
        total_steps = self.epochs * math.ceil(len(self.lengths) / self.batch_size)
        return parse_speeds(self.speeds, self.world_size, total_steps)
