"""Heterogeneity profiles: how fast every rank is, step by step, as plain data.

A ``SpeedProfile`` gives each rank a relative speed (higher is faster; a rank of speed 2
does the same work in half the time of a rank of speed 1) that may change at given steps.
Tests, benchmarks, the simulator and the demo's emulator all read the same profiles, so an
emulated cluster and a simulated one are the same cluster. OmniLearn's profiles are included
as data: the CPU cores of its four workers, ``HL1`` (12, 12, 12, 12) to ``HL8`` (6, 6, 4, 32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from chronica.core.rng import Stream, derive_key, uniforms

__all__ = ["OMNILEARN_PROFILES", "SpeedProfile"]

OMNILEARN_PROFILES: dict[str, tuple[float, ...]] = {
    "HL1": (12.0, 12.0, 12.0, 12.0),
    "HL2": (12.0, 12.0, 8.0, 16.0),
    "HL4": (9.0, 9.0, 6.0, 24.0),
    "HL8": (6.0, 6.0, 4.0, 32.0),
}


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
        normalised = []
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
        return cls(((0, (speed,) * _positive("num_ranks", num_ranks)),))

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
    def changing(cls, changes: Mapping[int, Sequence[float]]) -> SpeedProfile:
        """From ``{step: speeds}``; must include step 0."""
        return cls(tuple(sorted((int(k), tuple(v)) for k, v in changes.items())))

    @classmethod
    def straggler(cls, num_ranks: int, rank: int, at_step: int, factor: float) -> SpeedProfile:
        """Equal ranks until ``at_step``, then rank ``rank`` runs ``factor`` times slower."""
        _positive("num_ranks", num_ranks)
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
        _positive("num_ranks", num_ranks)
        _positive("every", every)
        if not 0 <= spread < 1:
            raise ValueError(f"spread={spread!r} must be in [0, 1)")
        entries = []
        for index, start in enumerate(range(0, max(int(steps), 1), every)):
            u = uniforms(num_ranks, derive_key(seed, index, Stream.SPEED))
            entries.append((start, tuple(1.0 - spread + 2.0 * spread * u)))
        return cls(tuple(entries))

    @classmethod
    def parse(cls, text: str, num_ranks: int) -> SpeedProfile:
        """From a command-line string.

        ``constant``; ``HL8``; ``HL1,HL8@100`` (HL1, then HL8 from step 100);
        ``straggler:R@S*F`` (rank R runs F× slower from step S); ``drifting`` or
        ``drifting:EVERY`` (redraw every EVERY steps, for 10⁶ steps); or explicit speeds
        ``6,6,4,32``.
        """
        text = text.strip()
        try:
            if text == "constant":
                return cls.constant(num_ranks)
            if text.startswith("straggler:"):
                rank, rest = text.split(":", 1)[1].split("@")
                step, factor = rest.split("*")
                return cls.straggler(num_ranks, int(rank), int(step), float(factor))
            if text.startswith("drifting"):
                every = int(text.split(":", 1)[1]) if ":" in text else 50
                return cls.drifting(num_ranks, 10**6, every)
            parts = text.split(",")
            if parts[0].split("@")[0] in OMNILEARN_PROFILES:
                later = []
                for part in parts[1:]:
                    label, step = part.split("@")
                    later.append((int(step), label))
                profile = cls.omnilearn(parts[0], *later)
            else:
                profile = cls(((0, tuple(float(p) for p in parts)),))
        except (ValueError, IndexError) as exc:
            raise ValueError(
                f"speed profile {text!r} not understood ({exc}); use constant, HL1..HL8, "
                f"'HL1,HL8@100', 'straggler:RANK@STEP*FACTOR', 'drifting[:EVERY]' or speeds "
                f"like '6,6,4,32'"
            ) from exc
        if profile.num_ranks != num_ranks:
            raise ValueError(
                f"speed profile {text!r} has {profile.num_ranks} ranks, the run has {num_ranks}"
            )
        return profile


def _positive(name: str, value: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")
    return int(value)
