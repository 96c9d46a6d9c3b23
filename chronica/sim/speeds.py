"""Per-rank speed profiles for W simulated ranks, built on ``chronica.core.hetero``.

Every profile is a ``chronica.core.hetero.SpeedProfile``, the same data the demo's emulator
and the benchmarks read, so a simulated cluster and an emulated one are the same cluster.
A rank's compute time is multiplied by ``SpeedProfile.slowdown(step)`` (the fastest rank's
speed over its own), exactly as the emulator slows a rank down.
"""

from __future__ import annotations

import numpy as np

from chronica.core.hetero import OMNILEARN_PROFILES, SpeedProfile

__all__ = ["PROFILE_HELP", "hl_speeds", "parse_speeds", "slowdown_matrix"]

PROFILE_HELP = (
    "constant; HL1..HL8 (OmniLearn's heterogeneity levels, slowest/fastest = k, the "
    "4-rank pattern repeated over W ranks); drifting[:EVERY[:SPREAD]] (speeds redrawn in "
    "[1-SPREAD, 1+SPREAD] every EVERY steps; default 50, 0.5); slowdown[:RANK@STEP*FACTOR] "
    "(rank RANK runs FACTOR times slower from STEP on; default rank 0, half-way, 2x); or W "
    "comma-separated speeds (a shorter list is repeated when it divides W)"
)


def hl_speeds(level: int) -> tuple[float, ...]:
    """The 4 worker speeds of heterogeneity level ``level`` (1..8): slowest/fastest = level.

    HL1, HL2, HL4 and HL8 are OmniLearn's worker cores (``OMNILEARN_PROFILES``); the levels in
    between extend the same family, whose speeds are ``(1.5x, 1.5x, x, level·x)`` with
    ``x = 48 / (4 + level)`` (48 cores in all), as HL2, HL4 and HL8 are.
    """
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 8:
        raise ValueError(f"heterogeneity level {level!r} must be an int in 1..8 (HL1..HL8)")
    known = OMNILEARN_PROFILES.get(f"HL{level}")
    if known is not None:
        return known
    x = 48.0 / (4 + level)
    return (1.5 * x, 1.5 * x, x, level * x)


def parse_speeds(text: str, world: int, total_steps: int) -> SpeedProfile:
    """The ``--speeds`` argument as a ``SpeedProfile`` of ``world`` ranks over a run of
    ``total_steps`` steps (see ``PROFILE_HELP``). Raises ``ValueError`` naming ``--speeds``."""
    spec = text.strip()
    head, _, rest = spec.partition(":")
    try:
        if spec == "constant":
            return SpeedProfile.constant(world)
        if spec.upper().startswith("HL") and not rest:
            if world % 4:
                raise ValueError(
                    "HL profiles describe groups of 4 ranks (OmniLearn's workers); use a "
                    "--world that is a multiple of 4"
                )
            return SpeedProfile(((0, _tiled(hl_speeds(int(spec[2:])), world)),))
        if head == "drifting":
            every, spread = (rest.split(":") + [""])[:2] if rest else ("", "")
            return SpeedProfile.drifting(
                world, max(total_steps, 1), int(every or 50), float(spread or 0.5)
            )
        if head == "slowdown":
            if not rest:
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


def _tiled(pattern: tuple[float, ...], world: int) -> tuple[float, ...]:
    if world % len(pattern) and len(pattern) != world:
        raise ValueError(f"{len(pattern)} speeds neither match nor divide --world {world}")
    return tuple(np.resize(np.asarray(pattern), world).tolist())
