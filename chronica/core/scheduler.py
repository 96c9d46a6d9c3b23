"""The scheduler: from sizes and a configuration to one ``EpochPlan`` per epoch.

A plan is a pure function of (sizes, configuration, epoch): every rank computes the same
bytes locally. Kinds:

``static``, ``exact=True`` (default)
    Global batches are exactly what plain data-parallel training forms: consecutive
    ``batch_size`` samples of the epoch's permutation (torch's order semantics, padding and
    ``drop_last``). Only the split of each batch between ranks changes, so every step
    averages the gradient over the same samples and the training maths is unchanged.
``static``, ``exact=False`` (pool balancing, upstream Chronica's ``static``)
    The epoch's samples are packed into ``steps × W`` local batches of equal count and
    near-equal cost (capacity-bounded LPT over the whole epoch), then local batches of
    similar cost form a step, so heavy samples share a step with other heavy samples. This
    changes step composition: a step is no longer a uniform random batch.
``guided``
    Samples of similar size share a step (sorted, with a little seeded jitter so steps
    differ between epochs), minimising padding; then each step is balanced. Changes step
    composition like length-grouped samplers do.

In pool and guided modes the order of steps is shuffled from the seed. A trailing partial
step (``len % batch_size``) always stays last and keeps equal counts per rank.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chronica.core.balance import balance_steps
from chronica.core.cost import CostModel, as_cost_model
from chronica.core.plan import EpochPlan, PlanStats
from chronica.core.pool import fill_slack, lpt_bins
from chronica.core.rng import Stream, derive_key, permutation, uniforms
from chronica.core.sizes import sizes_digest, validate_sizes

__all__ = ["KINDS", "ScheduleConfig", "Scheduler"]

KINDS = ("static", "guided")


@dataclass(frozen=True)
class ScheduleConfig:
    """Everything besides the sizes that a plan depends on. Validated on construction.

    ``batch_size`` is the *global* batch (all ranks together) and must be a multiple of
    ``num_replicas``; ``None`` means no per-step balancing: each rank gets torch's strided
    share of the permutation.
    """

    num_replicas: int
    batch_size: int | None = None
    kind: str = "static"
    exact: bool = True
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    cost: CostModel = field(default_factory=CostModel.linear)
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not _is_int(self.num_replicas) or self.num_replicas < 1:
            raise ValueError(f"num_replicas={self.num_replicas!r} must be an int >= 1")
        if self.batch_size is not None:
            if not _is_int(self.batch_size) or self.batch_size < 1:
                raise ValueError(
                    f"batch_size={self.batch_size!r} must be a positive int (the global batch "
                    f"over all ranks) or None"
                )
            if self.batch_size % self.num_replicas:
                raise ValueError(
                    f"batch_size={self.batch_size} (global) must be a multiple of "
                    f"num_replicas={self.num_replicas}; e.g. use "
                    f"{max(1, self.batch_size // self.num_replicas) * self.num_replicas}"
                )
        if self.kind == "dynamic":
            raise ValueError(
                "kind='dynamic' needs the feedback coordinator, which this release does not "
                "ship yet; use kind='static' (balanced by predicted cost) for now"
            )
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {KINDS}")
        if self.batch_size is None and (self.kind != "static" or not self.exact):
            raise ValueError(
                f"kind={self.kind!r}, exact={self.exact} balances whole steps and needs "
                f"batch_size= (the global batch)"
            )
        if not _is_int(self.seed):
            raise ValueError(f"seed={self.seed!r} must be an int")
        for name in ("exact", "shuffle", "drop_last"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if not isinstance(self.cost, CostModel):
            object.__setattr__(self, "cost", as_cost_model(self.cost))
        if not (isinstance(self.jitter, (int, float)) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter={self.jitter!r} must be a number in [0, 1]")

    def digest(self, sizes_hex: str) -> str:
        """A hex digest of this configuration and the sizes digest: equal digests, equal plans."""
        payload = {
            "version": 1,
            "num_replicas": self.num_replicas,
            "batch_size": self.batch_size,
            "kind": self.kind,
            "exact": self.exact,
            "shuffle": self.shuffle,
            "seed": int(self.seed),
            "drop_last": self.drop_last,
            "cost": self.cost.to_tuple(),
            "jitter": float(self.jitter),
            "sizes": sizes_hex,
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()


# A plan's parts: (indices, bounds, loads) as in ``EpochPlan``.
_Parts = tuple[np.ndarray, np.ndarray, np.ndarray]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Scheduler:
    """Plans epochs for ``sizes`` under ``config``. Plans depend only on (sizes, config,
    epoch): equal inputs give byte-identical plans on every rank, process and restart.
    The most recent plan is cached."""

    def __init__(self, sizes: Any, config: ScheduleConfig) -> None:
        self.sizes = validate_sizes(sizes)
        self.config = config
        self.costs = config.cost(self.sizes)
        self.digest = config.digest(sizes_digest(self.sizes))
        self._cached: EpochPlan | None = None

    @property
    def num_samples(self) -> int:
        return int(self.sizes.shape[0])

    def samples_per_replica(self) -> int:
        """Samples each rank receives per epoch: torch's ``len(DistributedSampler)``."""
        n, w = self.num_samples, self.config.num_replicas
        return n // w if self.config.drop_last else -(-n // w)

    def num_steps(self) -> int:
        """Steps per epoch, the same on every rank."""
        per_rank = self.samples_per_replica()
        b = self.config.batch_size
        return per_rank if b is None else -(-per_rank * self.config.num_replicas // b)

    def plan_epoch(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` (an int >= 0)."""
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        if self._cached is not None and self._cached.epoch == epoch:
            return self._cached
        order, num_padded, num_dropped = self._epoch_order(int(epoch))
        cfg = self.config
        if cfg.batch_size is None:
            indices, bounds, loads = self._strided_plan(order)
        elif cfg.kind == "guided":
            indices, bounds, loads = self._guided_plan(epoch, order)
        elif cfg.exact:
            indices, bounds, loads = self._exact_plan(order)
        else:
            indices, bounds, loads = self._pool_plan(epoch, order)
        plan = EpochPlan(
            epoch=int(epoch),
            num_replicas=cfg.num_replicas,
            indices=indices,
            bounds=bounds,
            loads=loads,
            num_padded=num_padded,
            num_dropped=num_dropped,
            digest=self.digest,
        )
        for array in (plan.indices, plan.bounds, plan.loads):
            array.setflags(write=False)
        self._cached = plan
        return plan

    def stats(self, epoch: int) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan."""
        return self.plan_epoch(epoch).stats(self.sizes, self.costs)

    # -- epoch order ---------------------------------------------------------------------

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, int, int]:
        """The epoch's permutation, padded or truncated to ``W * samples_per_replica``."""
        cfg, n = self.config, self.num_samples
        if cfg.shuffle:
            order = permutation(n, derive_key(cfg.seed, epoch, Stream.ORDER))
        else:
            order = np.arange(n, dtype=np.int64)
        total = self.samples_per_replica() * cfg.num_replicas
        if total <= n:
            return order[:total], 0, n - total
        pad = total - n
        return np.concatenate([order, np.resize(order, pad)]), pad, 0

    def _step_starts(self, total: int) -> np.ndarray:
        b = self.config.batch_size
        assert b is not None
        return np.append(np.arange(0, total, b, dtype=np.int64), total)

    # -- kinds -----------------------------------------------------------------------------

    def _assemble(
        self, ordered: np.ndarray, starts: np.ndarray, perm: np.ndarray, loads: np.ndarray
    ) -> _Parts:
        """Plan parts from the step-ordered samples and the balancing kernel's output."""
        w = self.config.num_replicas
        k = np.diff(starts) // w
        bounds = starts[:-1, None] + k[:, None] * np.arange(w + 1)[None, :]
        return ordered[perm], bounds.astype(np.int64), loads

    def _strided_plan(self, order: np.ndarray) -> _Parts:
        w = self.config.num_replicas
        steps = order.shape[0] // w
        # torch's split: rank r takes positions r, r + W, ...; one sample per rank per step.
        bounds = np.arange(steps)[:, None] * w + np.arange(w + 1)[None, :]
        loads = self.costs[order].reshape(steps, w)
        return order, bounds.astype(np.int64), loads

    def _exact_plan(self, order: np.ndarray) -> _Parts:
        starts = self._step_starts(order.shape[0])
        perm, loads = balance_steps(self.costs[order], starts, self.config.num_replicas)
        return self._assemble(order, starts, perm, loads)

    def _sort_keys(self, epoch: int, order: np.ndarray) -> np.ndarray:
        """Costs with seeded multiplicative jitter, so similar samples mix between epochs."""
        cfg = self.config
        noise = uniforms(order.shape[0], derive_key(cfg.seed, epoch, Stream.JITTER))
        return self.costs[order] * (1.0 + cfg.jitter * noise)

    def _shuffled_steps(self, epoch: int, full_steps: int) -> np.ndarray:
        cfg = self.config
        if not cfg.shuffle:
            return np.arange(full_steps)
        return permutation(full_steps, derive_key(cfg.seed, epoch, Stream.STEPS))

    def _guided_plan(self, epoch: int, order: np.ndarray) -> _Parts:
        b = self.config.batch_size
        assert b is not None
        total = order.shape[0]
        by_size = order[np.argsort(-self._sort_keys(epoch, order), kind="stable")]
        full = total // b
        step_order = self._shuffled_steps(epoch, full)
        blocks = by_size[: full * b].reshape(full, b)[step_order].ravel()
        ordered = np.concatenate([blocks, by_size[full * b :]])
        starts = self._step_starts(total)
        perm, loads = balance_steps(self.costs[ordered], starts, self.config.num_replicas)
        return self._assemble(ordered, starts, perm, loads)

    def _pool_plan(self, epoch: int, order: np.ndarray) -> _Parts:
        cfg = self.config
        b, w = cfg.batch_size, cfg.num_replicas
        assert b is not None
        total = order.shape[0]
        full = total // b
        if full == 0:  # only a partial step: nothing to pool
            return self._exact_plan(order)
        pool = order[: full * b]
        costs = self.costs[pool]
        bins, bin_loads = lpt_bins(costs, self._sort_keys(epoch, pool), full * w)
        by_load = np.argsort(-bin_loads, kind="stable")
        step_order = self._shuffled_steps(epoch, full)
        grouped = by_load.reshape(full, w)[step_order]
        members = bins[grouped]  # (steps, W, k) positions into `pool`
        loads = bin_loads[grouped]
        fill_slack(costs, members, loads)
        ordered = np.concatenate([pool[members.ravel()], order[full * b :]])
        starts = self._step_starts(total)
        costs = self.costs[ordered]
        perm_full, loads_full = balance_steps(
            costs[: full * b], starts[: full + 1], w, use_lpt=False
        )
        perm_rest, loads_rest = balance_steps(costs[full * b :], starts[full:] - full * b, w)
        perm = np.concatenate([perm_full, perm_rest + full * b])
        return self._assemble(ordered, starts, perm, np.concatenate([loads_full, loads_rest]))
