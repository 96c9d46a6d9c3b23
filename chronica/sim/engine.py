"""The simulation loop: plan with the real scheduler, time every step, feed back, summarise.

Static strategies are planned an epoch at a time and evaluated in one vectorised pass. The
dynamic kind runs the real ``chronica.core.dynamic.DynamicPlanner`` window by window, as
the coordinator does in training: every rank reports its own compute time and load for
every step, and the next window is planned once the reports reach the middle of the
current one (the moment the coordinator plans ahead), so a decision lacks the newest half
window of feedback, as it does in a real job.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from chronica.core.accounting import movement
from chronica.core.checks import is_int
from chronica.core.cost import as_cost_model
from chronica.core.dynamic import DynamicPlanner
from chronica.core.partition import Owners
from chronica.core.plan import WindowPlan, delay_quantiles
from chronica.core.scheduler import Scheduler, per_replica, step_counts
from chronica.core.sizes import validate_sizes
from chronica.sim.pipeline import PipelineModel
from chronica.sim.speeds import parse_speeds, slowdown_matrix
from chronica.sim.strategies import Assignment, Strategy, add_counts
from chronica.sim.timing import AllReduceModel, ComputeModel, StepEvaluation, evaluate_steps

__all__ = [
    "DEFAULT_STRATEGIES",
    "MAX_EPOCHS",
    "MAX_SAMPLES",
    "MAX_SIMULATED",
    "SimOptions",
    "SimulationResult",
    "StrategyResult",
    "check_simulated",
    "simulate",
]

logger = logging.getLogger("chronica.sim")

DEFAULT_STRATEGIES = ("torch", "length-grouped", "static", "pool", "guided", "dynamic")
# Samples per rank and step when no global batch is given.
DEFAULT_LOCAL_BATCH = 16
# Bounds checked before anything is allocated, so a mistyped flag is an error, not an
# out-of-memory kill or a run of days: a simulation holds a few arrays per sample and its
# time grows with samples x epochs.
MAX_SAMPLES = 10**8
MAX_EPOCHS = 10_000
MAX_SIMULATED = 10**9


def _positive_int(name: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} {value!r} must be an int >= 1")
    return int(value)


def check_simulated(samples: int, epochs: int) -> None:
    """``ValueError`` naming ``--samples`` and ``--epochs`` unless ``samples`` is at most
    ``MAX_SAMPLES`` and ``samples * epochs`` at most ``MAX_SIMULATED``."""
    if samples > MAX_SAMPLES:
        raise ValueError(
            f"--samples {samples:,} is above the simulator's {MAX_SAMPLES:,}; simulate a "
            f"sample of the data set (--sizes FILE --samples N resamples it)"
        )
    if samples * epochs > MAX_SIMULATED:
        raise ValueError(
            f"--samples {samples:,} x --epochs {epochs:,} is above the simulator's "
            f"{MAX_SIMULATED:,} simulated samples; simulate fewer epochs"
        )


@dataclass(frozen=True)
class SimOptions:
    """Everything a simulation depends on besides the sizes. Validated on construction;
    errors name the command-line flag to change.

    ``world`` ranks (1..4096); ``batch_size`` the global batch (a multiple of ``world``;
    default 16 per rank); ``epochs`` simulated; ``seed`` of the plans and the noise;
    ``cost`` the model chronica balances and the simulated compute follows; ``speeds`` a
    ``--speeds`` profile; ``strategies`` what to compare (``torch`` is always added, as the
    reference of every speed-up); ``ranks_per_node`` groups ranks into nodes for data
    movement and partitioned shuffles; ``pipeline`` (``chronica.sim.pipeline``) makes every
    rank a pipelined replica whose load is its micro-batches' makespan.
    """

    world: int
    batch_size: int | None = None
    epochs: int = 1
    seed: int = 0
    cost: Any = "linear"
    speeds: str = "constant"
    compute: ComputeModel = field(default_factory=ComputeModel)
    allreduce: AllReduceModel = field(default_factory=AllReduceModel)
    strategies: tuple[Any, ...] = DEFAULT_STRATEGIES
    ranks_per_node: int | None = None
    pipeline: PipelineModel | None = None

    def __post_init__(self) -> None:
        world = _positive_int("--world", self.world)
        if world > 4096:
            raise ValueError(f"--world {world} is above the simulator's 4096 ranks")
        batch = DEFAULT_LOCAL_BATCH * world if self.batch_size is None else self.batch_size
        batch = _positive_int("--batch-size", batch)
        if batch % world:
            raise ValueError(
                f"--batch-size {batch} (global) must be a multiple of --world {world}; e.g. "
                f"{max(1, batch // world) * world}"
            )
        object.__setattr__(self, "batch_size", batch)
        if _positive_int("--epochs", self.epochs) > MAX_EPOCHS:
            raise ValueError(f"--epochs {self.epochs} is above the simulator's {MAX_EPOCHS:,}")
        if not is_int(self.seed):
            raise ValueError(f"--seed {self.seed!r} must be an int")
        try:
            object.__setattr__(self, "cost", as_cost_model(self.cost))
        except ValueError as exc:
            raise ValueError(f"--cost: {exc}") from None
        if self.ranks_per_node is not None:
            per = _positive_int("--ranks-per-node", self.ranks_per_node)
            if world % per:
                raise ValueError(f"--ranks-per-node {per} must divide --world {world}")
        parsed = [s if isinstance(s, Strategy) else Strategy.parse(s) for s in self.strategies]
        if not any(s.name == "torch" for s in parsed):
            parsed.insert(0, Strategy("torch"))
        parsed.sort(key=lambda s: s.name != "torch")  # the reference is simulated first
        labels = [s.label for s in parsed]
        if len(set(labels)) != len(labels):
            raise ValueError(f"--config names a configuration twice: {labels}")
        object.__setattr__(self, "strategies", tuple(parsed))
        parse_speeds(self.speeds, world, 1)  # fails early on a bad profile
        if self.pipeline is not None and not isinstance(self.pipeline, PipelineModel):
            raise TypeError(f"pipeline={self.pipeline!r} must be a chronica.sim.PipelineModel")

    @property
    def global_batch(self) -> int:
        """``batch_size`` as resolved on construction (never ``None``)."""
        assert self.batch_size is not None
        return self.batch_size

    @property
    def groups(self) -> tuple[int, ...] | None:
        """Node id of every rank, or ``None`` (one node per rank)."""
        if self.ranks_per_node is None:
            return None
        return tuple(r // self.ranks_per_node for r in range(self.world))

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary of the options."""
        return {
            "world": self.world,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "seed": int(self.seed),
            "cost": list(self.cost.to_tuple()),
            "speeds": self.speeds,
            "compute": vars(self.compute).copy(),
            "allreduce": vars(self.allreduce).copy(),
            "ranks_per_node": self.ranks_per_node,
            "configs": [s.label for s in self.strategies],
            "pipeline": None if self.pipeline is None else self.pipeline.describe(),
        }


@dataclass(frozen=True)
class StrategyResult:
    """One configuration's simulated run.

    ``step_s``: every step's time, all epochs in order. ``total_s`` its sum; ``mean_step_s``
    its mean. ``idle_fraction``: ``1 - Σ_s mean_r compute / Σ_s max_r compute``, the share of
    rank-time spent waiting for the slowest rank. ``speedup``: torch's total time over this
    one's. ``padding``: padded tokens over real tokens when every local batch is padded to
    its longest sample (packed: the micro-batches' empty row space). ``moved_per_epoch``:
    samples nodes fetch per epoch (``chronica.core.accounting.movement``),
    ``moved_fraction`` that over N.
    ``load_ratio``: mean per-step max/mean rank load (predicted cost), ``load_ratio_worst``
    the worst step's. ``delay``: with outlier delay (``packed,outliers=true``), the steps
    documents waited (``chronica.core.plan.delay_quantiles`` over every epoch), else empty.
    """

    label: str
    steps: int
    step_s: np.ndarray
    total_s: float
    mean_step_s: float
    idle_fraction: float
    speedup: float
    padding: float
    moved_per_epoch: float
    moved_fraction: float
    load_ratio: float
    wall_s: float
    load_ratio_worst: float = 1.0
    delay: dict[str, float] = field(default_factory=dict)

    def to_dict(self, with_steps: bool = True) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "step_s"}
        if with_steps:
            out["step_s"] = self.step_s.tolist()
        return out


@dataclass(frozen=True)
class SimulationResult:
    """All configurations of one simulation; ``results[0]`` is torch's sampler."""

    options: SimOptions
    num_samples: int
    sizes_mean: float
    sizes_max: float
    allreduce_s: float
    results: tuple[StrategyResult, ...]
    wall_s: float

    def result(self, label: str) -> StrategyResult:
        """The result of the configuration ``label`` (its ``--config`` spec)."""
        for r in self.results:
            if r.label == label:
                return r
        raise KeyError(f"no configuration {label!r}; have {[r.label for r in self.results]}")

    def to_dict(self, with_steps: bool = True) -> dict[str, Any]:
        """JSON-ready: options, data summary, every configuration's metrics."""
        return {
            "options": self.options.describe(),
            "num_samples": self.num_samples,
            "sizes_mean": self.sizes_mean,
            "sizes_max": self.sizes_max,
            "allreduce_s": self.allreduce_s,
            "wall_s": self.wall_s,
            "results": [r.to_dict(with_steps) for r in self.results],
        }


@dataclass
class _Trained:
    """What ``chronica.core.accounting.movement`` reads: the samples every node trained on,
    epoch by epoch, and the nodes' fixed partitions (partitioned shuffles only)."""

    num_samples: int
    nodes: Owners
    base: list[np.ndarray] | None
    epochs: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def add(self, epoch: int, assignment: Assignment) -> None:
        bounds = assignment.bounds
        counts = np.diff(bounds, axis=1)  # (steps, W)
        ranks = np.broadcast_to(np.arange(counts.shape[1]), counts.shape)
        node_of = self.nodes.rank_owner[np.repeat(ranks.ravel(), counts.ravel())]
        order = np.argsort(node_of, kind="stable")
        per_node = np.bincount(node_of, minlength=self.nodes.count)
        self.epochs[epoch] = np.split(assignment.indices[order], np.cumsum(per_node)[:-1])

    def node_samples(self, epoch: int) -> list[np.ndarray]:
        return self.epochs[epoch]

    def base_partitions(self) -> list[np.ndarray] | None:
        return self.base


class _Run:
    """One strategy's simulation: its scheduler, per-epoch evaluations and movement."""

    def __init__(self, strategy: Strategy, sizes: np.ndarray, options: SimOptions) -> None:
        self.strategy = strategy
        self.options = options
        config = strategy.schedule_config(
            options.world, options.global_batch, options.seed, options.cost, options.groups
        )
        self.scheduler = Scheduler(sizes, config)
        self.trained = _Trained(
            self.scheduler.num_samples, self.scheduler.nodes, self.scheduler.base_partitions()
        )
        self.evaluations: list[StepEvaluation] = []
        self.delay_counts = np.zeros(0, np.int64)  # documents per delay, every epoch


def _noise_and_speeds(
    options: SimOptions, profile: Any, epoch: int, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    noise = options.compute.noise_factors(options.seed, epoch, steps, options.world)
    return slowdown_matrix(profile, epoch * steps, steps), noise


def _static_epoch(run: _Run, epoch: int, profile: Any, allreduce_s: float, bar: tqdm) -> None:
    options = run.options
    assignment = run.strategy.assignment(run.scheduler, options.global_batch, epoch)
    steps = assignment.bounds.shape[0]
    slow, noise = _noise_and_speeds(options, profile, epoch, steps)
    sched = run.scheduler
    if assignment.pieces is None:
        units, costs, sizes = assignment.indices, sched.costs, sched.sizes
    else:
        assert sched.pieces is not None
        units, costs = assignment.pieces, sched.piece_costs
        sizes = sched.pieces.length.astype(np.float64)
    micro = sched.plan_epoch(epoch).micro if assignment.pieces is not None else None
    if micro is not None and micro.delays is not None:
        run.delay_counts = add_counts(run.delay_counts, sched.stats(epoch).delay_counts)
    loads = None
    if options.pipeline is not None:
        loads = (
            options.pipeline.sample_loads(units, assignment.bounds, costs)
            if micro is None
            else options.pipeline.packed_loads(micro, costs[units], options.world)
        )
    evaluation = evaluate_steps(
        units, assignment.bounds, costs, sizes, slow, noise, options.compute, allreduce_s,
        loads=loads,
    )  # fmt: skip
    if micro is not None:
        # Packed rows, not local batches padded to their longest sample, are what is padded.
        room = float(micro.weights.shape[0]) * micro.capacity
        evaluation = dataclasses.replace(evaluation, padded_tokens=room)
    run.evaluations.append(evaluation)
    run.trained.add(epoch, assignment)
    bar.update(steps)


def _dynamic_epoch(
    run: _Run,
    planner: DynamicPlanner,
    epoch: int,
    profile: Any,
    allreduce_s: float,
    bar: tqdm,
) -> None:
    options = run.options
    sched = run.scheduler
    steps, window = sched.num_steps(), planner.window
    slow, noise = _noise_and_speeds(options, profile, epoch, steps)
    windows: list[WindowPlan] = []
    evaluations = []
    world = options.world
    for first in range(0, steps, window):
        plan = planner.plan_window(epoch, first)  # already planned ahead, or planned now
        stop = first + plan.num_steps
        evaluation = evaluate_steps(
            plan.indices,
            plan.bounds,
            sched.costs,
            sched.sizes,
            slow[first:stop],
            noise[first:stop],
            options.compute,
            allreduce_s,
            host_work=options.compute.coordinator_s,
            loads=None
            if options.pipeline is None
            else options.pipeline.sample_loads(plan.indices, plan.bounds, sched.costs),
        )
        loads, seconds = plan.loads.tolist(), evaluation.compute.tolist()
        for i, step in enumerate(range(first, stop)):
            if step - first == window // 2:
                _plan_ahead(planner, epoch, stop, steps, options.epochs)
            for rank in range(world):
                planner.observe(rank, step, loads[i][rank], seconds[i][rank])
            bar.update(1)
        windows.append(plan)
        evaluations.append(evaluation)
    run.evaluations.append(_joined(evaluations))
    run.trained.add(epoch, _window_assignment(windows))


def _plan_ahead(planner: DynamicPlanner, epoch: int, stop: int, steps: int, epochs: int) -> None:
    """What the coordinator does at mid-window: plan the next window (of this epoch or the
    next one) from the reports received so far."""
    if stop < steps:
        planner.plan_window(epoch, stop)
    elif epoch + 1 < epochs:
        planner.plan_window(epoch + 1, 0)


def _joined(parts: list[StepEvaluation]) -> StepEvaluation:
    return StepEvaluation(
        loads=np.concatenate([p.loads for p in parts]),
        compute=np.concatenate([p.compute for p in parts]),
        step_s=np.concatenate([p.step_s for p in parts]),
        real_tokens=sum(p.real_tokens for p in parts),
        padded_tokens=sum(p.padded_tokens for p in parts),
    )


def _window_assignment(windows: list[WindowPlan]) -> Assignment:
    offsets = np.cumsum([0] + [int(w.indices.shape[0]) for w in windows[:-1]])
    bounds = [w.bounds[:, :-1] + off for w, off in zip(windows, offsets, strict=True)]
    ends = np.concatenate(bounds)
    last = int(offsets[-1] + windows[-1].indices.shape[0])
    full = np.concatenate([ends, np.append(ends[1:, 0], last)[:, None]], axis=1)
    return Assignment(np.concatenate([w.indices for w in windows]), full)


def _summary(run: _Run, torch_total: float | None, wall_s: float) -> StrategyResult:
    evaluation = _joined(run.evaluations)
    step_s = evaluation.step_s
    total = float(step_s.sum())
    busiest = float(evaluation.compute.max(axis=1).sum())
    idle = 0.0 if busiest == 0 else 1.0 - float(evaluation.compute.mean(axis=1).sum()) / busiest
    loads = evaluation.loads
    mean = loads.mean(axis=1)
    ratio = np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    moved = [movement(run.trained, e).total_samples for e in sorted(run.trained.epochs)]
    real = evaluation.real_tokens
    n = run.scheduler.num_samples
    return StrategyResult(
        label=run.strategy.label,
        steps=int(step_s.shape[0]),
        step_s=step_s,
        total_s=total,
        mean_step_s=float(step_s.mean()) if step_s.size else 0.0,
        idle_fraction=idle,
        speedup=1.0 if torch_total is None or total == 0 else torch_total / total,
        padding=0.0 if real == 0 else (evaluation.padded_tokens - real) / real,
        moved_per_epoch=float(np.mean(moved)),
        moved_fraction=float(np.mean(moved)) / n,
        load_ratio=float(ratio.mean()) if ratio.size else 1.0,
        wall_s=wall_s,
        load_ratio_worst=float(ratio.max()) if ratio.size else 1.0,
        delay=delay_quantiles(run.delay_counts),
    )


def simulate(sizes: Any, options: SimOptions, *, progress: bool | None = None) -> SimulationResult:
    """Simulate every configuration of ``options`` on ``sizes``.

    Guarantees: every configuration sees the same speed profile and the same noise at every
    (epoch, step, rank), has the same number of steps, and trains on the same samples per
    epoch as chronica's plans (torch's padding); chronica's configurations run the real
    ``Scheduler`` (and ``DynamicPlanner``), so their per-step assignments are the plans a
    real job would use. ``progress``: a tqdm bar on stderr (default: when stderr is a TTY).
    """
    started = time.perf_counter()
    sizes = validate_sizes(sizes, name="sizes")
    if sizes.shape[0] == 0:
        raise ValueError("sizes is empty; give at least one sample")
    check_simulated(sizes.shape[0], options.epochs)
    runs = [_Run(s, sizes, options) for s in options.strategies]
    world, batch = options.world, options.global_batch
    steps = len(step_counts(per_replica(sizes.shape[0], world, False), batch, world))
    profile = parse_speeds(options.speeds, options.world, steps * options.epochs)
    allreduce_s = options.allreduce.seconds(options.world)
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(
        total=steps * options.epochs * len(runs),
        unit="step",
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    results: list[StrategyResult] = []
    torch_total: float | None = None
    with bar:
        for run in runs:
            begun = time.perf_counter()
            bar.set_description_str(run.strategy.label[:24])
            planner = DynamicPlanner(run.scheduler) if run.strategy.is_dynamic else None
            for epoch in range(options.epochs):
                if planner is None:
                    _static_epoch(run, epoch, profile, allreduce_s, bar)
                else:
                    _dynamic_epoch(run, planner, epoch, profile, allreduce_s, bar)
            result = _summary(run, torch_total, time.perf_counter() - begun)
            if run.strategy.name == "torch":
                torch_total = result.total_s
            results.append(result)
            logger.info(
                "simulated %s: %d steps, %.4g s in all, %.1f s of wall time",
                result.label,
                result.steps,
                result.total_s,
                result.wall_s,
            )
    return SimulationResult(
        options=options,
        num_samples=int(sizes.shape[0]),
        sizes_mean=float(sizes.mean()),
        sizes_max=float(sizes.max()),
        allreduce_s=allreduce_s,
        results=tuple(results),
        wall_s=time.perf_counter() - started,
    )
