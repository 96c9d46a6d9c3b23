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

__all__ = [
    "DEFAULT_HIGH",
    "SAMPLERS",
    "DemoConfig",
    "cost_model_for",
    "load_lengths",
    "make_lengths",
    "plural",
]

SAMPLERS = ("torch", "chronica", "dynamic")
COORDINATED = frozenset(SAMPLERS[2:])
"""The samplers whose ranks open a session with a coordinator (they need its ports)."""
DEFAULT_HIGH = 2048  # the default generated lengths' clip


def plural(n: int, word: str) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def make_lengths(
    n: int,
    seed: int = 0,
    mean_log: float = 5.0,
    sigma: float = 1.0,
    low: int = 8,
    high: int = DEFAULT_HIGH,
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
    """The a-priori cost model of ``PackedClassifier``'s multiply-adds per sequence of length s
    (what chronica balances with ``--calibration-steps 0``; the demo otherwise fits the
    model to the ranks' measured CPU time).

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
    """Everything one demo run depends on; travels to the workers as JSON.

    The defaults are ``chronica demo``'s default run (``lengths`` aside, which the command
    line generates). ``seeds`` model initialisations (``seed``, ``seed + 1``, ...) each train
    once per sampler from the same initialisation; ``calibration_steps`` steps on random
    local batches fit the cost model to the ranks' measured CPU time before training (0: the
    a-priori ``cost_model_for``); ``eval_samples`` held-out samples measure loss and
    accuracy; ``simulate_worlds`` are the cluster sizes the simulator projects the
    calibrated job to (empty: none).
    """

    lengths: list[int]
    lengths_source: str
    batch_size: int = 32
    epochs: int = 4
    kind: str = "static"
    cost: str = "quadratic"
    seed: int = 0
    world_size: int = 2
    dim: int = 64
    hidden: int = 256
    lr: float = 3e-3  # Adam, cosine decay to 0 over each run
    warmup_steps: int = 2
    progress: bool = True
    pin: bool = True  # each rank on a core of its own, where there is one per rank
    collective_timeout_s: float = 120.0
    samplers: tuple[str, ...] = field(default=SAMPLERS[:2])
    speeds: str = "constant"
    coordinator_port: int = 0
    seeds: int = 3
    calibration_steps: int = 24
    eval_samples: int = 512
    simulate_worlds: tuple[int, ...] = (8, 64, 256, 1024)

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
        if self.seeds < 1:
            raise ValueError(f"--seeds {self.seeds} must be >= 1")
        if self.calibration_steps < 0 or 0 < self.calibration_steps < 2:
            raise ValueError(
                f"--calibration-steps {self.calibration_steps} must be 0 (no calibration) or >= 2"
            )
        if self.eval_samples < 1:
            raise ValueError(f"eval_samples={self.eval_samples} must be >= 1")
        if any(w < 1 or w > 4096 for w in self.simulate_worlds):
            raise ValueError(f"--simulate {list(self.simulate_worlds)}: ranks must be 1..4096")
        unknown = sorted(set(self.samplers) - set(SAMPLERS))
        if unknown or not self.samplers:
            raise ValueError(f"--samplers {unknown} must be a comma list of {SAMPLERS}")
        self.profile()  # raises naming --speeds and the accepted forms

    @property
    def local_batch(self) -> int:
        """Samples per rank and step (torch's ``DataLoader`` ``batch_size``)."""
        return self.batch_size // self.world_size

    def profile(self) -> SpeedProfile:
        """The emulated rank speeds (``--speeds``, the grammar of ``chronica simulate``)."""
        total_steps = self.epochs * math.ceil(len(self.lengths) / self.batch_size)
        return parse_speeds(self.speeds, self.world_size, total_steps)
