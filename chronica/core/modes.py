"""Scheduling modes: what ``ScheduleConfig(kind=...)`` means, one object per kind.

A mode owns everything that differs between kinds, so no other module compares kind names:

- ``check(config)``: which other options the kind accepts (raises naming the fix);
- ``describe(config)``: the kind's own fields of the configuration digest;
- ``elastic_refusal``: why an epoch of this kind cannot continue at another world size or
  batch size (``None`` when it can: the resume policy of ``chronica.core.elastic``);
- ``opens_session``: whether every rank opens a session with rank 0's coordinator
  (``chronica.runtime.session``) that re-splits the steps from measured speeds;
- ``groups_by_size``: whether samples of similar cost share a step.

The surface accepts the names (``kind="dynamic"``) as well as the objects
(``kind=chronica.core.modes.DYNAMIC``); ``as_mode`` turns either into the object. A mode
compares equal to its name, so ``config.kind == "dynamic"`` in a user's code keeps working.

Example::

    >>> from chronica.core.modes import as_mode
    >>> as_mode("dynamic").opens_session
    True
    >>> str(as_mode("guided"))
    'guided'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chronica.core.checks import check_int
from chronica.core.controller import ControllerOptions

if TYPE_CHECKING:
    from chronica.core.config import ScheduleConfig

__all__ = ["DYNAMIC", "GUIDED", "KINDS", "MODES", "STATIC", "Mode", "as_mode"]


class Mode:
    """One scheduling kind (see the module docstring). Instances are the module's
    constants ``STATIC``, ``GUIDED`` and ``DYNAMIC``; get one with ``as_mode``.

    Args:
        name: the kind's name as users write it (``kind="static"``).
    """

    opens_session = False
    groups_by_size = False
    elastic_refusal: str | None = None

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self, config: ScheduleConfig) -> None:
        """Raise ``ValueError`` naming the fix when ``config``'s other options do not go
        with this kind. Runs at the end of ``ScheduleConfig``'s own validation.

        Args:
            config: the configuration being validated (its fields already normalised).
        """
        if config.variable_batch:
            raise ValueError(
                f"variable_batch=True needs kind='dynamic' (kind={self.name!r} keeps equal "
                "local batches)"
            )

    def needs_batch(self, config: ScheduleConfig) -> bool:
        """Whether this kind balances whole steps, so that a configuration without a step
        size (no ``batch_size``, no packing) cannot be planned.

        Args:
            config: the configuration being validated.
        """
        return True

    def packs(self, config: ScheduleConfig) -> bool:
        """Whether ``packing=`` goes with this kind and ``config``'s ``exact``.

        Args:
            config: the configuration being validated.
        """
        return False

    def describe(self, config: ScheduleConfig) -> list[Any] | None:
        """This kind's own fields of the configuration digest (JSON-ready), ``None`` when
        the kind has none.

        Args:
            config: the configuration being digested.
        """
        return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mode):
            return other.name == self.name
        if isinstance(other, str):
            return other == self.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"chronica.core.modes.{self.name.upper()}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled configurations (Grain's worker processes) come back as the same constant.
        return (as_mode, (self.name,))


class _Static(Mode):
    """``kind="static"``: every plan from the sizes alone. ``exact=True`` keeps plain
    data-parallel batches and only splits them; ``exact=False`` (pool balancing) changes
    step composition. Without ``batch_size``, exact mode deals samples as torch does."""

    def needs_batch(self, config: ScheduleConfig) -> bool:
        return not config.exact

    def packs(self, config: ScheduleConfig) -> bool:
        return config.exact


class _Guided(Mode):
    """``kind="guided"``: samples of similar size share a step, then each step is balanced."""

    groups_by_size = True


class _Dynamic(Mode):
    """``kind="dynamic"``: the exact global batches re-split window by window from measured
    rank speeds by rank 0's coordinator (a session on every rank)."""

    opens_session = True
    elastic_refusal = (
        "kind='dynamic' cannot continue an epoch at another world size or batch size: its "
        "steps are split window by window by the coordinator from the speeds of the saved "
        "ranks."
    )

    def check(self, config: ScheduleConfig) -> None:
        if config.batch_size is None and config.packing is None:
            raise ValueError("kind='dynamic' re-splits global batches and needs batch_size=")
        if not config.exact:
            raise ValueError(
                "kind='dynamic' re-splits the exact global batches; exact=False (pool) is a "
                "static-only mode"
            )
        check_int("window", config.window, 1, hint=" (steps per plan)")
        share = (config.batch_size or config.num_replicas) // config.num_replicas
        low, high = config.batch_bounds()
        if config.packing is None and not 1 <= low <= share <= high:
            raise ValueError(
                f"min_batch={config.min_batch!r} and max_batch={config.max_batch!r} must "
                f"satisfy 1 <= min_batch <= {share} <= max_batch (the equal share of "
                "batch_size)"
            )
        if not isinstance(config.controller, ControllerOptions):
            raise TypeError(
                f"controller={config.controller!r} must be a chronica.core.ControllerOptions"
            )

    def packs(self, config: ScheduleConfig) -> bool:
        return config.exact

    def describe(self, config: ScheduleConfig) -> list[Any] | None:
        return [config.variable_batch, config.window, *config.batch_bounds()]


STATIC: Mode = _Static("static")
GUIDED: Mode = _Guided("guided")
DYNAMIC: Mode = _Dynamic("dynamic")

MODES: dict[str, Mode] = {mode.name: mode for mode in (STATIC, GUIDED, DYNAMIC)}
"""Every mode by name."""

KINDS = tuple(MODES)
"""The kind names ``ScheduleConfig(kind=...)`` accepts."""


def as_mode(kind: Any) -> Mode:
    """The ``Mode`` of ``kind``: one of ``KINDS`` or a ``Mode``.

    Args:
        kind: a kind name (``"static"``, ``"guided"``, ``"dynamic"``) or a ``Mode``.

    Raises:
        TypeError: ``kind`` is neither a string nor a ``Mode``.
        ValueError: ``kind`` names no mode.
    """
    if isinstance(kind, Mode):
        return kind
    if not isinstance(kind, str):
        raise TypeError(f"kind={kind!r} must be one of {KINDS} (a string) or a chronica Mode")
    mode = MODES.get(kind)
    if mode is None:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    return mode
