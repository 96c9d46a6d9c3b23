"""One rank's dynamic schedule: coordinator (on rank 0), client, fallback and feedback.

``DynamicSession`` is what an adapter needs for ``kind="dynamic"``, whatever the framework:

* rank 0 starts the ``Coordinator`` in a background thread (unless ``CHRONICA_COORDINATOR``
  names a standalone one, ``host:port``); every rank connects a ``PlanClient``;
* ``steps(epoch, start)`` yields ``(step, indices, loss_weight, micro_batches)`` for this
  rank (``micro_batches`` empty unless packed), window by window, from the coordinator's
  plan, or from the static plan when the coordinator does not deliver. Both hold the same
  samples at every step, so coverage stays exactly-once provided *all* ranks take the same
  source for a window and, for the coordinator's, their parts together are the static
  window. ``agree``, given by the adapter (``chronica.runtime.agreement.Agreement``: two
  small all-reduces over the framework's own process group), decides that on every rank
  alike; without it (and more than one rank) no rank can prove the others hold the same
  window, so every window is the static plan and exactly-once holds;
* ``report(seconds, step)`` sends this rank's own compute time for a step it yielded.

A plan from the coordinator is this rank's part only (its bytes do not grow with the world).
The rank checks it alone against the static plan (``chronica.runtime.window.fault``: it
covers the window, with counts every rank's loop can run and the loss weights its counts
imply; packed: also every micro-batch under the caps, with the weight its tokens or
documents imply), then votes: every rank passes the token of its plan (or ``NO_PLAN``) and
its part's keyed multiset hash minus its static part's, and the window is used only if all
tokens match and the hashes sum to 0, i.e. the parts together are the static window
(``chronica.runtime.window``). Every failure of the coordinator's path ends the same way: a
plan that fails the check (a bug, or tampering on an unauthenticated network), parts that
do not fit together, ranks holding different windows, a refusal, an error answer, garbage,
a flood or silence (``PlanClient`` bounds every wait by ``timeout``) give a warning and the
static plan for that window, on every rank together.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import threading
import weakref
from collections import Counter
from collections.abc import Iterator

import numpy as np

from chronica.comm.address import external_coordinator, listens_everywhere, resolve_endpoint
from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.protocol import Plan
from chronica.core.checks import check_int, check_seconds
from chronica.core.plan import EpochPlan
from chronica.core.scheduler import Scheduler
from chronica.runtime import window
from chronica.runtime.agreement import NO_PLAN, Agreement
from chronica.runtime.micro import (
    MicroBatch,
    check_micro_batch,
    micro_batch,
    planned_micro_batches,
)
from chronica.runtime.progress import plan_epoch

__all__ = ["DynamicSession"]

logger = logging.getLogger("chronica")

_OPEN: weakref.WeakSet[DynamicSession] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


def _close_open_sessions() -> None:
    with _OPEN_LOCK:
        sessions = list(_OPEN)
    for session in sessions:
        session.close()


atexit.register(_close_open_sessions)


class DynamicSession:
    """Rank ``rank``'s plans for ``kind="dynamic"`` (see the module docstring).

    ``timeout`` bounds every wait for the coordinator (seconds). Guarantees: ``steps``
    yields every step of the epoch from ``start`` once, in order, each with exactly this
    rank's samples of either the dynamic or the static plan of that window, the same choice
    on every rank (without ``agree`` and with more than one rank: the static plan, always);
    it never waits longer than ``timeout`` per window.

    Args:
        scheduler: the plans; its mode must open a session (``kind="dynamic"``).
        rank: this process's rank (rank 0 runs the coordinator).
        host: where the coordinator listens (see ``chronica.runtime.DynamicOptions``).
        port: its port (see ``chronica.runtime.DynamicOptions``).
        timeout: the longest wait for a window's plan, in seconds.
        agree: the all-ranks agreement, or ``None`` (a single rank votes alone; with more
            ranks, every window is the static plan).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        rank: int,
        *,
        host: str | None = None,
        port: int | None = None,
        timeout: float = 10.0,
        agree: Agreement | None = None,
    ) -> None:
        if not isinstance(scheduler, Scheduler):
            raise TypeError(f"scheduler must be a chronica Scheduler, not {type(scheduler)}")
        config = scheduler.config
        if not config.mode.opens_session:
            raise ValueError("DynamicSession needs kind='dynamic'")
        world = config.num_replicas
        rank = check_int("rank", rank, 0, world - 1, f" (num_replicas={world})")
        timeout = check_seconds("timeout", timeout)
        if agree is not None and not isinstance(agree, Agreement):
            raise TypeError(
                f"agree must be a chronica.runtime.agreement.Agreement, or None, not {type(agree)}"
            )
        self.scheduler = scheduler
        self.rank = rank
        self.window = config.window
        # A single rank's part is the whole window: it votes alone (the sum of one rank).
        self.agree = Agreement(np.asarray, 0, 1) if agree is None and world == 1 else agree
        if self.agree is None:
            logger.warning(
                "chronica: rank %d has no agreement between ranks (agree=None), so it cannot "
                "prove every rank holds the same window: every window uses the static plan; "
                "initialise the framework's distributed runtime before building the data "
                "pipeline to balance dynamically",
                rank,
            )
        self.coordinator: Coordinator | None = None
        external = external_coordinator()
        if external is not None:
            host, port = external
            pub_port = port + 1
        else:
            connect, port = resolve_endpoint(host, port)
            pub_port = port + 1
            if rank == 0:
                self.coordinator = Coordinator(scheduler, host, port).start()
                endpoint = self.coordinator.endpoint
                assert endpoint is not None  # start() bound the sockets
                bound, port, pub_port = endpoint
                # Rank 0 runs beside its coordinator: its bound address (or loopback, when it
                # listens everywhere) always reaches it.
                connect = "127.0.0.1" if listens_everywhere(bound) else bound
            host = connect
        _, high = config.batch_bounds()
        if config.packing is not None:
            # A rank's part of a packed step holds at most the step's pieces, each with a
            # row and perhaps a micro-batch of its own (40 bytes), on the longest step.
            static = plan_epoch(scheduler, 0)
            high = 3 * int(np.diff(static.bounds[:, [0, -1]], axis=1).max(initial=1))
        try:
            self.client = PlanClient(
                rank,
                world,
                scheduler.digest,
                host,
                port,
                pub_port=pub_port,
                timeout=timeout,
                max_plan_bytes=1024 + config.window * (16 * high + 64),
            )
        except BaseException:
            if self.coordinator is not None:
                self.coordinator.close()
            raise
        # Loads of the steps yielded, by (epoch, step): a pipeline that prefetches reports the
        # last steps of an epoch after it began yielding the next one.
        self._loads: dict[tuple[int, int], float] = {}
        # A packed step's work (pieces, tokens, squared tokens), reported for calibration.
        self._work: dict[tuple[int, int], np.ndarray] = {}
        self._epoch = -1
        self._next_report = 0
        self.windows_dynamic = 0
        self.windows_static = 0
        self._fallbacks: Counter[str] = Counter()  # windows that fell back, by cause
        self.plans_refused = 0
        with _OPEN_LOCK:
            _OPEN.add(self)
        self.client.connect()

    def steps(
        self, epoch: int, start: int = 0
    ) -> Iterator[tuple[int, np.ndarray, float, tuple[MicroBatch, ...]]]:
        """``(step, indices, loss_weight, micro_batches)`` of this rank for steps ``start..``
        of ``epoch`` (``micro_batches`` empty unless packed)."""
        num_steps = self.scheduler.num_steps(epoch)
        static = plan_epoch(self.scheduler, epoch)
        if epoch != self._epoch:
            self._loads = {key: load for key, load in self._loads.items() if key[0] == self._epoch}
            self._work = {key: work for key, work in self._work.items() if key[0] == self._epoch}
            self._epoch = epoch
        self._next_report = start
        k = self.window
        for first in range(start - start % k, num_steps, k):
            stop = min(first + k, num_steps)
            plan = self.client.plan(epoch, first)
            if plan is not None and not self._consistent(plan, static, first, stop):
                plan = None
            packed = None
            if plan is not None and static.micro is not None:
                packed = self._packed(plan, static, first, stop)
                plan = None if packed is None else plan
            # Without an agreement no rank can prove the others hold the same window: every
            # window is then the static plan, so exactly-once holds whatever arrives.
            use = plan is not None and self.agree is not None
            if self.agree is not None:
                use = self.agree(
                    window.token(plan) if plan is not None else NO_PLAN,
                    functools.partial(window.imbalance, plan, static, self.rank, first, stop),
                )
                if plan is not None and not use:
                    self._fall_back(epoch, first, stop)
            if use:
                self.windows_dynamic += 1
            else:
                self.windows_static += 1
            for step in range(max(first, start), stop):
                if step == first + k // 2 and stop < num_steps:
                    self.client.prefetch(epoch, stop)
                micro: tuple[MicroBatch, ...] = ()
                if use:
                    assert plan is not None
                    i = step - first
                    indices, weight, load = plan.local(step), plan.weights[i], plan.loads[i]
                    if packed is not None:
                        micro = packed[i]
                        indices = np.concatenate([m.indices for m in micro])
                else:
                    indices = static.local(step, self.rank)
                    weight = static.loss_weights[step, self.rank]
                    load = static.loads[step, self.rank]
                    if static.micro is not None:
                        micro = planned_micro_batches(static, step, self.rank)
                self._loads[epoch, step] = float(load)
                if micro:
                    lengths = np.concatenate([m.lengths for m in micro]).astype(np.float64)
                    work = (float(lengths.shape[0]), lengths.sum(), (lengths**2).sum())
                    self._work[epoch, step] = np.array(work)
                yield step, indices, float(weight), micro
            if stop >= num_steps:
                self.client.prefetch(epoch + 1, 0)

    def _packed(
        self, plan: Plan, static: EpochPlan, first: int, stop: int
    ) -> list[tuple[MicroBatch, ...]] | None:
        """A packed plan's micro-batches, step by step, if every micro-batch keeps the caps
        and carries the weight its tokens (or documents) imply; else ``None`` (and a
        warning). The plan passed ``window.fault``: its pieces exist; whether they are the
        step's is the vote's to tell."""
        config = self.scheduler.config
        table, packing = self.scheduler.pieces, config.packing
        layout = static.micro
        assert table is not None and packing is not None and layout is not None
        world = config.num_replicas
        out = []
        why = None
        for i, step in enumerate(range(first, stop)):
            whole = layout.pieces[static.bounds[step, 0] : static.bounds[step, -1]]
            total = table.length[whole].sum() if packing.loss == "token" else whole.shape[0]
            micro = []
            for pieces, rows, weight in plan.micro_batches(step):
                batch = micro_batch(table, pieces, rows, weight)
                why = check_micro_batch(batch, packing)
                share = batch.lengths.sum() if packing.loss == "token" else pieces.shape[0]
                expected = share * world / max(total, 1)
                if why is None and not math.isclose(weight, expected, rel_tol=1e-9, abs_tol=1e-12):
                    why = f"a micro-batch weighs {weight!r}, not {expected!r}"
                if why is not None:
                    why = f"step {step}: {why}"
                    break
                micro.append(batch)
            if why is not None:
                break
            if not math.isclose(
                sum(m.loss_weight for m in micro), plan.weights[i], rel_tol=1e-9, abs_tol=1e-12
            ):
                why = f"step {step}'s weight is not its micro-batches' sum"
                break
            out.append(tuple(micro))
        if why is None:
            return out
        self._refuse(plan.epoch, first, stop, why)
        return None

    def _consistent(self, plan: Plan, static: EpochPlan, first: int, stop: int) -> bool:
        table = self.scheduler.pieces
        items = self.scheduler.sizes.shape[0] if table is None else table.length.shape[0]
        why = window.fault(plan, static, self.scheduler.config, self.rank, first, stop, items)
        if why is None:
            return True
        self._refuse(static.epoch, first, stop, why)
        return False

    def _fall_back(self, epoch: int, first: int, stop: int) -> None:
        """This rank held a plan that the vote did not take: say why. Another rank without
        a plan (its link to the coordinator failed, and it says why itself) is told once,
        then on the 10th, 100th... such window, not once per window; plans that do not fit
        together (a bug, or tampering) are told for every window."""
        # An agreement that cannot tell (any callable voting alike) names no missing rank.
        missing = getattr(self.agree, "without_plan", None)
        if missing:
            cause = "missing"
            text = (
                f"{missing} other rank(s) had no plan from the coordinator for it (their "
                "link to it failed: unreachable, missing or wrong CURVE keys, a time-out; "
                "their own logs say which)"
            )
        else:
            cause = "unfit"
            text = (
                "the ranks' plans do not fit together (another rank's failed its check or "
                "comes from another planning, or the parts are not the static window's "
                "samples: a bug, or tampering on an unauthenticated network)"
            )
        self._fallbacks[cause] += 1
        n = self._fallbacks[cause]
        if cause == "unfit" or n == 10 ** (len(str(n)) - 1):
            logger.warning(
                "chronica: rank %d: epoch %d steps %d..%d use the static plan on every rank: "
                "%s (%d window(s) for this cause so far)",
                self.rank,
                epoch,
                first,
                stop - 1,
                text,
                n,
            )

    def _refuse(self, epoch: int, first: int, stop: int, why: str) -> None:
        self.plans_refused += 1
        logger.warning(
            "chronica: rank %d: the coordinator's plan for epoch %d steps %d..%d does not fit "
            "the static plan (%s); the static plan serves the window",
            self.rank,
            epoch,
            first,
            stop - 1,
            why,
        )

    def report(self, seconds: float, step: int | None = None, epoch: int | None = None) -> None:
        """This rank spent ``seconds`` computing ``step`` of ``epoch`` (defaults: the epoch
        being yielded, and the step after the one reported last, starting at the first step
        yielded this epoch). Steps of the epoch before the current one can still be
        reported; others that this rank did not yield are ignored."""
        if epoch is None:
            epoch = self._epoch
        if step is None:
            step = self._next_report
        self._next_report = step + 1
        load = self._loads.get((epoch, step))
        if load is None:
            return  # not a step this rank has yielded lately
        self.client.report(epoch, step, load, seconds, self._work.get((epoch, step)))

    def close(self) -> None:
        """Close the client and, on rank 0, stop the coordinator (idempotent)."""
        self.client.close()
        if self.coordinator is not None:
            self.coordinator.close()
            self.coordinator = None
        with _OPEN_LOCK:
            _OPEN.discard(self)
