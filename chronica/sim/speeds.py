"""Rank speeds for emulation and simulation: ``SpeedProfile`` and the one ``--speeds`` grammar.

A ``SpeedProfile`` gives each rank a relative speed (higher is faster; a rank of speed 2 does
the same work in half the time of a rank of speed 1) that may change at given steps. The
simulator (``chronica simulate``), the demo's emulator (``chronica demo``), the tests and the
benchmarks all read the same profiles, and both commands parse ``--speeds`` with
``parse_speeds``, so a simulated cluster and an emulated one are the same cluster. A rank's
compute time is multiplied by ``SpeedProfile.slowdown(step)`` (the fastest rank's speed over
its own). OmniLearn's profiles are included as data: the CPU cores of its four workers,
``HL1`` (12, 12, 12, 12) to ``HL8`` (6, 6, 4, 32).

Emulation only: nothing here is a scheduling decision, so it lives in ``sim``, not ``core``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_int, is_int
from chronica.core.rng import Stream, derive_key, uniforms

__all__ = [
    "OMNILEARN_PROFILES",
    "PROFILE_HELP",
    "SpeedProfile",
    "hl_speeds",
    "parse_speeds",
    "slowdown_matrix",
]

OMNILEARN_PROFILES: dict[str, tuple[float, ...]] = {
    "HL1": (12.0, 12.0, 12.0, 12.0),
    "HL2": (12.0, 12.0, 8.0, 16.0),
    "HL4": (9.0, 9.0, 6.0, 24.0),
    "HL8": (6.0, 6.0, 4.0, 32.0),
}

PROFILE_HELP = (
    "constant; HL1..HL8 (OmniLearn's heterogeneity levels, slowest/fastest = k, the "
    "4-rank pattern repeated over W ranks); HL1,HL8@STEP[,...] (a level, then another from "
    "STEP on); drifting[:EVERY[:SPREAD]] (speeds redrawn in [1-SPREAD, 1+SPREAD] every EVERY "
    "steps; default 50, 0.5); slowdown[:RANK@STEP*FACTOR] or straggler:RANK@STEP*FACTOR "
    "(rank RANK runs FACTOR times slower from STEP on; default rank 0, half-way, 2x); or W "
    "comma-separated speeds (a shorter list is repeated when it divides W)"
)


@dataclass(frozen=True)
class SpeedProfile:
    """Relative rank speeds over time: ``changes[i] = (step, speeds)`` holds from ``step`` on.

    Guarantees: the first change is at step 0, steps strictly increase, every entry has one
    finite positive speed per rank. ``speeds(step)`` is the entry in force at ``step``.
    """

    changes: tuple[tuple[int, tuple[float, ...]], ...]

    def __post_init__(self) -> None:
        if not self.changes:
            raise ValueError("a SpeedProfile needs at least one (step, speeds) entry")
        normalised: list[tuple[int, tuple[float, ...]]] = []
        previous = -1
        for entry in self.changes:
            if not (isinstance(entry, Sequence) and len(entry) == 2):
                raise ValueError(f"profile entry {entry!r} must be a (step, speeds) pair")
            step, speeds = int(entry[0]), tuple(float(s) for s in entry[1])
            if step <= previous:
                raise ValueError(f"profile steps must increase; got {step} after {previous}")
            if not speeds or any(not math.isfinite(s) or s <= 0 for s in speeds):
                raise ValueError(f"speeds {speeds!r} at step {step} must be finite and > 0")
            if normalised and len(speeds) != len(normalised[0][1]):
                raise ValueError(
                    f"speeds at step {step} name {len(speeds)} ranks, the profile has "
                    f"{len(normalised[0][1])}"
                )
            normalised.append((step, speeds))
            previous = step
        if normalised[0][0] != 0:
            raise ValueError("the first profile entry must be at step 0")
        object.__setattr__(self, "changes", tuple(normalised))

    @property
    def num_ranks(self) -> int:
        return len(self.changes[0][1])

    def speeds(self, step: int) -> np.ndarray:
        """Every rank's relative speed at ``step``."""
        current = self.changes[0][1]
        for start, speeds in self.changes:
            if start > step:
                break
            current = speeds
        return np.asarray(current, dtype=np.float64)

    def slowdown(self, step: int) -> np.ndarray:
        """Per-rank time multipliers (>= 1) that make equally fast ranks behave like this
        profile at ``step``: the fastest rank runs as it is, a rank half as fast takes 2×."""
        speeds = self.speeds(step)
        return speeds.max() / speeds

    @classmethod
    def constant(cls, num_ranks: int, speed: float = 1.0) -> SpeedProfile:
        """Every rank equally fast, forever."""
        return cls(((0, (speed,) * check_int("num_ranks", num_ranks, 1)),))

    @classmethod
    def omnilearn(cls, name: str, *later: tuple[int, str]) -> SpeedProfile:
        """OmniLearn's 4-worker profile ``name`` (``"HL1"`` ... ``"HL8"``), then the profile of
        each ``(step, name)`` in ``later``, e.g. ``omnilearn("HL1", (100, "HL8"))``."""
        entries = [(0, name), *later]
        for _, label in entries:
            if label not in OMNILEARN_PROFILES:
                raise ValueError(f"profile {label!r} is not one of {sorted(OMNILEARN_PROFILES)}")
        return cls(tuple((step, OMNILEARN_PROFILES[label]) for step, label in entries))

    @classmethod
    def straggler(cls, num_ranks: int, rank: int, at_step: int, factor: float) -> SpeedProfile:
        """Equal ranks until ``at_step``, then rank ``rank`` runs ``factor`` times slower."""
        check_int("num_ranks", num_ranks, 1)
        if not 0 <= rank < num_ranks:
            raise ValueError(f"rank={rank} must be in [0, {num_ranks})")
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor={factor!r} must be a finite number >= 1 (how much slower)")
        slow = [1.0] * num_ranks
        slow[rank] = 1.0 / factor
        if at_step <= 0:
            return cls(((0, tuple(slow)),))
        return cls(((0, (1.0,) * num_ranks), (int(at_step), tuple(slow))))

    @classmethod
    def drifting(
        cls, num_ranks: int, steps: int, every: int = 50, spread: float = 0.5, seed: int = 0
    ) -> SpeedProfile:
        """Speeds that wander: every ``every`` steps each rank's speed is redrawn uniformly
        in ``[1 - spread, 1 + spread]`` (seeded, deterministic), up to ``steps``."""
        check_int("num_ranks", num_ranks, 1)
        check_int("every", every, 1)
        if not 0 <= spread < 1:
            raise ValueError(f"spread={spread!r} must be in [0, 1)")
        entries = []
        for index, start in enumerate(range(0, max(int(steps), 1), every)):
            u = uniforms(num_ranks, derive_key(seed, index, Stream.SPEED))
            entries.append((start, tuple(1.0 - spread + 2.0 * spread * u)))
        return cls(tuple(entries))


def hl_speeds(level: int) -> tuple[float, ...]:
    """The 4 worker speeds of heterogeneity level ``level`` (1..8): slowest/fastest = level.

    HL1, HL2, HL4 and HL8 are OmniLearn's worker cores (``OMNILEARN_PROFILES``); the levels in
    between extend the same family, whose speeds are ``(1.5x, 1.5x, x, level·x)`` with
    ``x = 48 / (4 + level)`` (48 cores in all), as HL2, HL4 and HL8 are.
    """
    if not is_int(level) or not 1 <= level <= 8:
        raise ValueError(f"heterogeneity level {level!r} must be an int in 1..8 (HL1..HL8)")
    known = OMNILEARN_PROFILES.get(f"HL{level}")
    if known is not None:
        return known
    x = 48.0 / (4 + level)
    return (1.5 * x, 1.5 * x, x, level * x)


def parse_speeds(text: str, world: int, total_steps: int) -> SpeedProfile:
    """The ``--speeds`` argument of ``chronica simulate`` and ``chronica demo`` as a
    ``SpeedProfile`` of ``world`` ranks over a run of ``total_steps`` steps (see
    ``PROFILE_HELP``). Raises ``ValueError`` naming ``--speeds`` and the accepted forms."""
    spec = text.strip()
    head, _, rest = spec.partition(":")
    try:
        if spec == "constant":
            return SpeedProfile.constant(world)
        if spec.upper().startswith("HL") and not rest:
            first, *later = spec.split(",")
            changes = [(0, _hl_tiled(first, world))]
            for part in later:
                label, step = part.split("@")
                changes.append((int(step), _hl_tiled(label, world)))
            return SpeedProfile(tuple(changes))
        if head == "drifting":
            every, spread = (rest.split(":") + [""])[:2] if rest else ("", "")
            return SpeedProfile.drifting(
                world, max(total_steps, 1), int(every or 50), float(spread or 0.5)
            )
        if head in ("slowdown", "straggler"):
            if not rest and head == "slowdown":
                return SpeedProfile.straggler(world, 0, max(total_steps // 2, 1), 2.0)
            rank, after = rest.split("@")
            step, factor = after.split("*")
            return SpeedProfile.straggler(world, int(rank), int(step), float(factor))
        speeds = tuple(float(p) for p in spec.split(","))
        return SpeedProfile(((0, _tiled(speeds, world)),))
    except (ValueError, IndexError) as exc:
        raise ValueError(f"--speeds {text!r} not understood ({exc}); use {PROFILE_HELP}") from None


def slowdown_matrix(profile: SpeedProfile, first_step: int, num_steps: int) -> np.ndarray:
    """``profile.slowdown(step)`` for ``first_step .. first_step + num_steps - 1``, shape
    ``(num_steps, W)`` (rows are read-only views of one array per change)."""
    out = np.empty((num_steps, profile.num_ranks))
    stop = first_step + num_steps
    starts = [start for start, _ in profile.changes] + [stop]
    for (start, _), end in zip(profile.changes, starts[1:], strict=True):
        lo, hi = max(start, first_step), min(end, stop)
        if lo < hi:
            out[lo - first_step : hi - first_step] = profile.slowdown(start)
    return out


def _hl_tiled(label: str, world: int) -> tuple[float, ...]:
    if not label.upper().startswith("HL"):
        raise ValueError(f"{label!r} is not a heterogeneity level HL1..HL8")
    speeds = hl_speeds(int(label[2:]))
    if world % 4:
        raise ValueError(
            "HL profiles describe groups of 4 ranks (OmniLearn's workers); use a world size "
            "that is a multiple of 4"
        )
    return _tiled(speeds, world)


def _tiled(pattern: tuple[float, ...], world: int) -> tuple[float, ...]:
    if world % len(pattern) and len(pattern) != world:
        raise ValueError(f"{len(pattern)} speeds neither match nor divide the {world} ranks")
    return tuple(np.resize(np.asarray(pattern), world).tolist())
