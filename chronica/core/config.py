"""``ScheduleConfig``: the one request every plan is made from (besides the sizes).

Every option that shapes a plan is a field here, declared once: the faces
(``chronica.torch``'s samplers, ``chronica.tf.schedule``, ``chronica.jax.iterator``, the
Grain source and the trainer glue) accept each field as a keyword of the same name
(``chronica.runtime.request`` makes their signatures and documentation from this class),
or a whole ``ScheduleConfig`` as ``config=``. What concerns only the transport to rank 0's
coordinator (host, port, time-out) is not here: it is ``chronica.runtime.DynamicOptions``,
passed beside the configuration.

What a kind accepts is decided by its mode (``chronica.core.modes``); the packing options by
``chronica.core.packing.Packing``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from chronica.core.checks import check_bool, check_int, check_number
from chronica.core.controller import ControllerOptions
from chronica.core.cost import CostModel, as_cost_model
from chronica.core.modes import STATIC, Mode, as_mode
from chronica.core.packing import Packing
from chronica.core.partition import Owners
from chronica.core.shuffle import as_shuffle_policy

__all__ = ["MAX_REPLICAS", "ScheduleConfig"]

MAX_REPLICAS = 1 << 16
"""The most data-parallel ranks a plan is made for: more than any job runs, few enough that
a mistyped ``num_replicas`` is refused at once instead of planning per-rank arrays for a
million ranks."""


@dataclass(frozen=True, repr=False)
class ScheduleConfig:
    """Everything besides the sizes that a plan depends on; frozen, validated on
    construction (``TypeError`` for a wrong type, ``ValueError`` for a wrong value, each
    naming the argument). Equal configurations and sizes give byte-identical plans
    (``digest``).

    Args:
        num_replicas: data-parallel ranks (the faces take it from the framework's world).
        batch_size: the global batch over all ranks, a multiple of ``num_replicas`` (the
            faces call it ``batch_size`` or ``global_batch_size``); ``None``: no per-step
            balancing, each rank gets torch's strided share of the permutation.
        kind: how steps are formed and split: ``"static"`` (from sizes alone), ``"guided"``
            (samples of similar size share a step) or ``"dynamic"`` (re-split window by
            window from measured rank speeds by rank 0's coordinator); a name or a
            ``chronica.core.modes`` mode.
        exact: ``True`` keeps plain data-parallel global batches and only splits them
            between ranks; ``False`` (static only) balances with pool packing, which
            changes step composition.
        shuffle: ``True``/``False``, a policy name (``"global"``, ``"local"``,
            ``"partial"``, ``"block"``, ``"stratified"``, ``"none"``) or a
            ``ShufflePolicy`` (e.g. ``ShufflePolicy.partial(q=0.1)``).
        seed: the seed every random choice of the plan derives from.
        drop_last: drop the tail that does not fill every rank (torch's meaning) instead of
            padding it with repeats.
        cost: the cost model of a sample's size: ``"linear"``, ``"quadratic"``, a
            ``CostModel`` or ``(a, b, c)`` for ``a + b·s + c·s²``.
        jitter: guided and pool modes: how far (a fraction of the size range) a sample's
            sort key is shuffled, so steps differ between epochs.
        groups: the node id of every rank (default, for partitioned shuffles, from
            ``LOCAL_WORLD_SIZE``).
        variable_batch: ``kind="dynamic"``: local batch sizes follow rank speeds within
            ``[min_batch, max_batch]``, the global batch unchanged.
        window: ``kind="dynamic"``: steps planned at a time (the controller re-evaluates
            once per window).
        min_batch: ``variable_batch=True``: the smallest local batch (default 1).
        max_batch: ``variable_batch=True``: the largest local batch (default the global
            batch).
        controller: ``kind="dynamic"``: the feedback loop's tuning, a
            ``chronica.core.ControllerOptions``.
        packing: a ``chronica.core.packing.Packing``: sizes are document lengths in tokens
            and every step (``batch_size`` documents or ``Packing.tokens_per_step``
            tokens) is cut into token-capped micro-batches of packed rows, the same count on
            every rank; ``batch_size`` need not then be a multiple of ``num_replicas``
            (unless the shuffle is node-partitioned). Exact static or dynamic kinds only.

    Example::

        >>> from chronica.core import ScheduleConfig
        >>> ScheduleConfig(num_replicas=8, batch_size=256, kind="dynamic", window=32).window
        32
    """

    num_replicas: int
    batch_size: int | None = None
    kind: Mode | str = STATIC
    exact: bool = True
    shuffle: Any = True
    seed: int = 0
    drop_last: bool = False
    cost: CostModel = field(default_factory=CostModel.linear)
    jitter: float = 0.1
    groups: tuple[Any, ...] | None = None
    variable_batch: bool = False
    window: int = 16
    min_batch: int | None = None
    max_batch: int | None = None
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    packing: Packing | None = None

    def __post_init__(self) -> None:
        # numpy integers are accepted (as torch does) and stored as Python ints, so that
        # digests and states serialise the same whatever the caller passed.
        replicas = check_int(
            "num_replicas",
            self.num_replicas,
            1,
            MAX_REPLICAS,
            hint=" (data-parallel ranks; planning holds a few arrays per rank)",
        )
        object.__setattr__(self, "num_replicas", replicas)
        if self.batch_size is not None:
            batch = check_int(
                "batch_size", self.batch_size, 1, hint=" (the global batch over all ranks) or None"
            )
            object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "shuffle", as_shuffle_policy(self.shuffle))
        object.__setattr__(self, "kind", as_mode(self.kind))  # ``mode`` below
        for name in ("exact", "drop_last", "variable_batch"):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))
        self._check_packing()
        if self.batch_size is not None and (self.packing is None or self.shuffle.partitioned):
            if self.batch_size % self.num_replicas:
                raise ValueError(
                    f"batch_size={self.batch_size} (global) must be a multiple of "
                    f"num_replicas={self.num_replicas}; e.g. use "
                    f"{max(1, self.batch_size // self.num_replicas) * self.num_replicas}"
                )
        if self.batch_size is None and self.packing is None and self.mode.needs_batch(self):
            raise ValueError(
                f"kind={self.mode.name!r}, exact={self.exact} balances whole steps and needs "
                f"batch_size= (the global batch)"
            )
        object.__setattr__(self, "seed", check_int("seed", self.seed))
        if self.groups is not None:
            object.__setattr__(self, "groups", tuple(self.groups))
            Owners.of(self.groups, self.num_replicas)  # validates the length
        object.__setattr__(self, "window", check_int("window", self.window, 1))
        for name in ("min_batch", "max_batch"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        self.mode.check(self)
        if not isinstance(self.cost, CostModel):
            object.__setattr__(self, "cost", as_cost_model(self.cost))
        check_number("jitter", self.jitter, 0, 1)

    def _check_packing(self) -> None:
        if self.packing is None:
            return
        if not isinstance(self.packing, Packing):
            raise TypeError(
                f"packing={self.packing!r} must be a chronica.core.packing.Packing (or None)"
            )
        if not self.mode.packs(self):
            raise ValueError(
                f"packing= plans exact steps; kind={self.mode.name!r}, exact={self.exact!r} "
                "cannot be packed (pass kind='static' or 'dynamic', exact=True)"
            )
        if self.variable_batch:
            raise ValueError(
                "variable_batch=True is implied by packing= (ranks take as many documents as "
                "their speed and the token cap allow); drop it"
            )
        if self.packing.loss == "loss_token":
            raise ValueError(
                "Packing(loss='loss_token') needs each document's loss-token count, which a "
                "sampler is not given: use loss='token' here, or chronica.plan_step(..., "
                "loss_tokens=) where the trainer holds the batch"
            )
        if self.packing.context_parallel > 1:
            raise ValueError(
                f"Packing(context_parallel={self.packing.context_parallel}) is planned by "
                "chronica.plan_step over the devices of a ('dp', 'cp') mesh; the samplers "
                "do not plan context-parallel steps yet: drop context_parallel here, or plan "
                "each global batch with chronica.plan_step"
            )
        if (self.batch_size is None) == (self.packing.tokens_per_step is None):
            raise ValueError(
                "packing= needs exactly one step size: batch_size= (documents per step) or "
                "Packing(tokens_per_step=...) (a global token budget)"
            )

    def __repr__(self) -> str:
        # The world, the batch and what differs from the defaults: what a user wrote.
        plain = ScheduleConfig(num_replicas=1)
        shown = [f"num_replicas={self.num_replicas}", f"batch_size={self.batch_size}"]
        for name in self.option_names():
            value = getattr(self, name)
            if value != getattr(plain, name):
                shown.append(f"{name}={str(value)!r}" if name == "kind" else f"{name}={value!r}")
        return f"ScheduleConfig({', '.join(shown)})"

    @property
    def mode(self) -> Mode:
        """The ``Mode`` of ``kind`` (``kind`` itself, typed: a name given is stored as its
        mode)."""
        assert isinstance(self.kind, Mode)
        return self.kind

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The fields a face accepts as keywords of the same name: every field but
        ``num_replicas`` and ``batch_size``, which each face takes in its own way."""
        return tuple(f.name for f in fields(cls) if f.name not in ("num_replicas", "batch_size"))

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """Every option of ``option_names`` with its default value."""
        out = {}
        for f in fields(cls):
            if f.name in cls.option_names():
                factory = f.default_factory
                out[f.name] = f.default if factory is MISSING else factory()
        return out

    def batch_bounds(self) -> tuple[int, int]:
        """``(min_batch, max_batch)`` per rank with their defaults filled in."""
        low = 1 if self.min_batch is None else self.min_batch
        high = self.batch_size or 1 if self.max_batch is None else self.max_batch
        return int(low), int(high)

    def digest(self, sizes_hex: str) -> str:
        """A hex digest of this configuration and the sizes digest: equal digests, equal
        plans.

        Args:
            sizes_hex: the digest of the data (``Scheduler.data_digest``).
        """
        blob = json.dumps(self.describe(sizes_hex), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()

    def describe(self, sizes_hex: str) -> dict[str, Any]:
        """Everything ``digest`` hashes, as JSON-ready values.

        Args:
            sizes_hex: the digest of the data (``Scheduler.data_digest``).
        """
        return {
            "version": 1,
            "num_replicas": self.num_replicas,
            "batch_size": self.batch_size,
            "kind": self.mode.name,
            "exact": self.exact,
            "shuffle": self.shuffle.to_tuple(),
            "groups": None if self.groups is None else [str(g) for g in self.groups],
            "seed": int(self.seed),
            "drop_last": self.drop_last,
            "cost": self.cost.to_tuple(),
            "jitter": float(self.jitter),
            "sizes": sizes_hex,
            "dynamic": self.mode.describe(self),
            # Only when set, so that the digests of unpacked configurations stay as they were.
            **({"packing": list(self.packing.to_tuple())} if self.packing is not None else {}),
        }
