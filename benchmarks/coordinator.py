"""The coordinator's own cost: CPU per training step at W=4, publish → rank latency at 64.

1. **CPU per step (W=4).** A real ``Coordinator`` in this process (a thread, as on rank 0,
   its sockets in the gate process) and 4 real ``PlanClient`` s in one further process,
   driven as ``DynamicSession`` drives them (``plan()`` at each window start, ``prefetch()``
   at mid-window, one ``report()`` per step, ranks in lock-step, steps of ``STEP_SECONDS``).
   Per step: the processor time of the coordinator's thread (``stats.cpu_seconds``, what it
   takes from rank 0), of which planning (``DynamicPlanner.plan_window``), and of the gate
   process (``/proc/PID/stat``); medians over repeats.
2. **Publish → rank (W=64).** The same coordinator publishing windows of a 64-rank job to
   64 ZeroMQ SUB sockets, one per rank's topic, in ``SUB_PROCESSES`` further processes that
   only receive and decode, while rank 0's client drives it as ``DynamicSession`` does
   (and, interleaved, a fetch-only driver). Latency: from the coordinator starting to
   publish a window (after planning it) to each rank's SUB socket holding it (one clock,
   ``CLOCK_MONOTONIC``, for every process); p50/p99 over all (window, rank) pairs, medians
   over runs; per window, time on a core and waiting for one of the path's parts
   (``/proc/.../schedstat``).
3. **A rank's vote.** What checking a window costs a rank besides its plan: hashing its
   part's and its static part's (step, sample) pairs (``chronica.runtime.window.imbalance``)
   at 64 ranks and a global batch of 16,384, 16 steps per window; median over fresh keys.
   (The two all-reduces of 8 and 40 int64 go over the framework's channel.)

    python -m benchmarks --only coordinator
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.gate_process import readable
from chronica.comm.protocol import decode, topic
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.multiset import KEY_WORDS
from chronica.core.plan import WindowPlan
from chronica.runtime import window

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "python -m benchmarks --only coordinator"

CPU_WORLD, CPU_PER_RANK, CPU_WINDOW, CPU_SAMPLES = 4, 32, 16, 16_384
STEP_SECONDS = 0.02
LAT_WORLD, LAT_PER_RANK, LAT_WINDOW, LAT_SAMPLES = 64, 32, 8, 65_536
SUB_PROCESSES = 2
VOTE_WORLD, VOTE_BATCH, VOTE_WINDOW, VOTE_SAMPLES = 64, 16_384, 16, 1 << 20
WINDOW_GAP_SECONDS = 0.05  # between two windows of the latency run


def _sizes(n: int) -> np.ndarray:
    return np.random.default_rng(7).lognormal(5, 1, n)


def _scheduler(world: int, per_rank: int, window: int, samples: int) -> Scheduler:
    config = ScheduleConfig(
        num_replicas=world,
        batch_size=world * per_rank,
        kind="dynamic",
        variable_batch=True,
        window=window,
    )
    return Scheduler(_sizes(samples), config)


def _sched(pid: int, tid: int | None = None) -> tuple[float, float]:
    """Seconds that process ``pid`` (all its threads; thread ``tid`` alone if given) ran on
    a core and waited in the run queue for one (``/proc/.../schedstat``, nanoseconds)."""
    tasks = Path(f"/proc/{pid}/task")
    paths = [tasks / str(tid)] if tid is not None else list(tasks.iterdir())
    run = wait = 0
    for path in paths:
        try:
            fields = (path / "schedstat").read_text().split()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


class _Timed(Coordinator):
    """The real coordinator, timing its planning and when each window's publishing began."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.planning = 0.0
        self.publishing = 0.0  # processor time encoding windows and handing them to the gate
        self.published: dict[tuple[int, int], float] = {}
        self.handed: dict[tuple[int, int], float] = {}  # the window's messages to the gate
        plan_window = self.planner.plan_window

        def timed(epoch: int, first_step: int) -> WindowPlan:
            started = time.thread_time()
            try:
                return plan_window(epoch, first_step)
            finally:
                self.planning += time.thread_time() - started

        self.planner.plan_window = timed  # type: ignore[method-assign]

    def _publish(self, plan: Any, seq: int) -> None:
        key = (plan.epoch, plan.first_step)
        self.published[key] = time.monotonic()
        started = time.thread_time()
        super()._publish(plan, seq)
        self.publishing += time.thread_time() - started
        self.handed[key] = time.monotonic()


# -- 1. CPU per step ---------------------------------------------------------------------


def _drive(clients: list[PlanClient], epochs: int, steps: int, window: int, step: float) -> int:
    """Run ``clients`` in lock-step through ``epochs`` of ``steps`` steps of ``step``
    seconds as ``DynamicSession`` drives its client: ``plan()`` at each window start,
    ``prefetch()`` of the next window at mid-window (of the next epoch's first after the
    epoch's last window), one ``report()`` after each step; returns the steps run."""
    done = 0
    for epoch in range(epochs):
        for at in range(steps):
            first = at - at % window
            stop = min(first + window, steps)
            for client in clients:
                if at == first:
                    client.plan(epoch, first)
                if at == first + window // 2 and stop < steps:
                    client.prefetch(epoch, stop)
            time.sleep(step)
            for client in clients:
                client.report(epoch, at, 1.0, step)
                if at == steps - 1:
                    client.prefetch(epoch + 1, 0)
            done += 1
    return done


def _ranks(endpoint: tuple[str, int, int], digest: str, epochs: int, steps: int, out: Any) -> None:
    """W clients in lock-step, as DynamicSession drives them; puts the steps run."""
    host, port, pub = endpoint
    clients = [
        PlanClient(r, CPU_WORLD, digest, host, port, pub_port=pub, timeout=10.0)
        for r in range(CPU_WORLD)
    ]
    for client in clients:
        client.connect()
    done = _drive(clients, epochs, steps, CPU_WINDOW, STEP_SECONDS)
    out.put((done, sum(c.stats.fallbacks for c in clients)))
    for client in clients:
        client.close()


def _warm(scheduler: Scheduler) -> None:
    """Compile the kernels (numba, once per process) on a twin scheduler, so the run
    measures the steady state of a long job."""
    planner = DynamicPlanner(Scheduler(scheduler.sizes, scheduler.config))
    for rank in range(scheduler.config.num_replicas):
        planner.observe(rank, 0, 1.0, 0.01)
    planner.plan_window(0, 0)


def _cpu_once(epochs: int) -> dict[str, float]:
    scheduler = _scheduler(CPU_WORLD, CPU_PER_RANK, CPU_WINDOW, CPU_SAMPLES)
    _warm(scheduler)
    steps = scheduler.num_steps()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    coordinator = _Timed(scheduler, "127.0.0.1", 0)
    with coordinator:
        assert coordinator.endpoint is not None and coordinator._gate is not None
        gate = coordinator._gate.pid()
        assert gate is not None
        gate_before = _sched(gate)[0]
        thread_before = coordinator.stats.cpu_seconds
        ranks = ctx.Process(
            target=_ranks, args=(coordinator.endpoint, scheduler.digest, epochs, steps, out)
        )
        ranks.start()
        done, fallbacks = out.get(timeout=600)
        ranks.join(60)
        time.sleep(0.2)  # the last reports
        thread = coordinator.stats.cpu_seconds - thread_before
        gate_cpu = _sched(gate)[0] - gate_before
        planning = coordinator.planning
    return {
        "steps": done,
        "fallbacks": fallbacks,
        "thread_ms": 1e3 * thread / done,
        "planning_ms": 1e3 * planning / done,
        "gate_ms": 1e3 * gate_cpu / done,
    }


# -- 2. publish -> rank ------------------------------------------------------------------


def _subscribers(endpoint: tuple[str, int, int], ranks: list[int], ready: Any, out: Any) -> None:
    """SUB sockets for ``ranks``, each on its rank's topic (a rank's plan is all it
    receives): timed on arrival and once decoded (by the rank's own decoding time); puts
    the process's time on a core and waiting for one, and them."""
    host, _, pub = endpoint
    context = zmq.Context()
    poller = zmq.Poller()
    sockets = []
    for rank in ranks:
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, topic(rank))
        sock.connect(f"tcp://{host}:{pub}")
        poller.register(sock, zmq.POLLIN)
        sockets.append(sock)
    ready.put(len(ranks))
    before = after = _sched(os.getpid())
    got: list[tuple[int, int, int, float, float]] = []
    taken: list[tuple[int, bytes, float]] = []
    index = {sock: i for i, sock in enumerate(sockets)}
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 3.0:
        # One process stands for 32 ranks, each on its own core: what has arrived is taken
        # first, and a rank's plan counts as decoded its own decoding time after it arrived
        # (one decode at a time between polls, so no rank waits for others' decoding).
        ready_now = poller.poll(0 if taken else 100)
        for sock, _ in ready_now:
            while readable(sock):
                taken.append((index[sock], sock.recv_multipart()[1], time.monotonic()))
        if taken and not ready_now:
            i, payload, received = taken.pop(0)
            started = time.monotonic()
            message = decode(payload, 1 << 30)
            decoded = received + time.monotonic() - started
            got.append((i, message["epoch"], message["first"], received, decoded))
            idle_since = time.monotonic()
            if not taken:  # what receiving cost, up to the last plan (not the idle end)
                after = _sched(os.getpid())
    cpu = np.subtract(after, before).tolist()
    out.put((cpu, [(ranks[i], e, f, t, d) for i, e, f, t, d in got]))
    for sock in sockets:
        sock.close(0)
    context.term()


def _latency(epochs: int, pattern: str) -> dict[str, Any]:
    """Windows of a ``LAT_WORLD``-rank job published to its ranks' SUB sockets while rank
    0's client drives the coordinator: ``pattern="session"`` as ``DynamicSession`` does
    (steps of ``WINDOW_GAP_SECONDS / LAT_WINDOW``), ``"fetch"`` by fetching one window
    every ``WINDOW_GAP_SECONDS`` and nothing else."""
    load = os.getloadavg()[0]
    scheduler = _scheduler(LAT_WORLD, LAT_PER_RANK, LAT_WINDOW, LAT_SAMPLES)
    _warm(scheduler)
    steps = scheduler.num_steps()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    coordinator = _Timed(scheduler, "127.0.0.1", 0)
    with coordinator:
        assert coordinator.endpoint is not None and coordinator._gate is not None
        gate = coordinator._gate.pid()
        assert gate is not None
        groups = np.array_split(np.arange(LAT_WORLD), SUB_PROCESSES)
        subs = [
            ctx.Process(target=_subscribers, args=(coordinator.endpoint, g.tolist(), ready, out))
            for g in groups
        ]
        for process in subs:
            process.start()
        for _ in subs:
            ready.get(timeout=120)
        idle_before, idle_started = _sched(gate)[0], time.monotonic()
        time.sleep(1.0)  # subscriptions reach the PUB socket; the gate's idle cost meanwhile
        gate_idle = (_sched(gate)[0] - idle_before) / (time.monotonic() - idle_started)
        host, port, pub = coordinator.endpoint
        driver = PlanClient(0, LAT_WORLD, scheduler.digest, host, port, pub_port=pub, timeout=10.0)
        driver.connect()
        assert coordinator._thread is not None and coordinator._thread.native_id is not None
        thread = coordinator._thread.native_id
        gate_before, thread_before = _sched(gate), _sched(os.getpid(), thread)
        started = time.monotonic()
        if pattern == "session":
            _drive([driver], epochs, steps, LAT_WINDOW, WINDOW_GAP_SECONDS / LAT_WINDOW)
        else:
            for epoch in range(epochs):
                for start in range(0, steps, LAT_WINDOW):
                    driver.plan(epoch, start)
                    time.sleep(WINDOW_GAP_SECONDS)
        time.sleep(0.2)  # the last window's relay
        gate_cpu, gate_wait = np.subtract(_sched(gate), gate_before)
        gate_cpu -= gate_idle * (time.monotonic() - started)  # its ticking, shown apart
        thread_wait = _sched(os.getpid(), thread)[1] - thread_before[1]
        results = [out.get(timeout=120) for _ in subs]
        for process in subs:
            process.join(30)
        driver.close()
        published, handed = dict(coordinator.published), dict(coordinator.handed)
        windows = coordinator.stats.windows
        message_bytes = coordinator.stats.published_bytes / max(windows * LAT_WORLD, 1)
        publishing = coordinator.publishing
    received = [r for _, got in results for r in got]
    delays = np.array([t - published[(e, f)] for _, e, f, t, _ in received])
    decoded = np.array([d - published[(e, f)] for _, e, f, _, d in received])
    slowest: dict[tuple[int, int], float] = {}
    first: dict[tuple[int, int], float] = {}
    for _, e, f, t, _ in received:
        slowest[(e, f)] = max(slowest.get((e, f), 0.0), t - published[(e, f)])
        first[(e, f)] = min(first.get((e, f), np.inf), t - published[(e, f)])
    # Where a window's time goes: encoding its messages and handing them to the gate, the
    # gate's relay to the first rank holding its plan, and the spread to the last one.
    encode = [handed[k] - published[k] for k in first]
    relay = [first[k] - (handed[k] - published[k]) for k in first]
    spread = [slowest[k] - first[k] for k in first]
    return {
        "pattern": pattern,
        "load_average": load,
        "slowest_rank_per_window_ms": [round(1e3 * v, 2) for _, v in sorted(slowest.items())],
        "encode_p50_ms": float(1e3 * np.median(encode)),
        "relay_to_first_p50_ms": float(1e3 * np.median(relay)),
        "first_to_last_p50_ms": float(1e3 * np.median(spread)),
        "decoded_p50_ms": float(1e3 * np.percentile(decoded, 50)),
        "decoded_p99_ms": float(1e3 * np.percentile(decoded, 99)),
        # Per window, time on a core of the path's parts (encoding: the coordinator's
        # thread in _publish; the gate, less its idle ticking, and the receivers: their
        # whole processes) and time waiting in the run queue for one; and the idle gate's.
        "cpu_encode_ms": 1e3 * publishing / windows,
        "cpu_gate_ms": 1e3 * gate_cpu / windows,
        "cpu_receive_ms": 1e3 * sum(cpu for (cpu, _), _ in results) / windows,
        "wait_coordinator_ms": 1e3 * thread_wait / windows,
        "wait_gate_ms": 1e3 * gate_wait / windows,
        "wait_receive_ms": 1e3 * sum(wait for (_, wait), _ in results) / windows,
        "gate_idle_ms_per_s": 1e3 * gate_idle,
        "windows": windows,
        "deliveries": int(delays.shape[0]),
        "expected": windows * LAT_WORLD,
        "p50_ms": float(1e3 * np.percentile(delays, 50)),
        "p99_ms": float(1e3 * np.percentile(delays, 99)),
        "max_ms": float(1e3 * delays.max()),
        "message_bytes": float(message_bytes),
    }


def _vote_hashing(repeats: int) -> dict[str, Any]:
    """What the ranks' check of a window costs one rank (``window.imbalance``: its part's
    and its static part's keyed multiset hashes) at ``VOTE_WORLD`` ranks, a global batch of
    ``VOTE_BATCH`` and ``VOTE_WINDOW`` steps: median over ``repeats`` fresh keys."""
    scheduler = _scheduler(VOTE_WORLD, VOTE_BATCH // VOTE_WORLD, VOTE_WINDOW, VOTE_SAMPLES)
    coordinator = Coordinator(scheduler, "127.0.0.1", 0)  # never started: no socket
    planned = coordinator.planner.plan_window(0, 0)
    plan = decode(coordinator._part(planned, 0, 0), 1 << 24)["plan"]
    static = scheduler.plan_epoch(0)
    seconds = []
    for _ in range(repeats + 1):  # the first compiles (or loads) the kernel
        key = np.frombuffer(os.urandom(8 * KEY_WORDS), np.int64)
        started = time.perf_counter()
        window.imbalance(plan, static, 0, 0, VOTE_WINDOW, key)
        seconds.append(time.perf_counter() - started)
    median = float(np.median(seconds[1:]))
    return {
        "world": VOTE_WORLD,
        "global_batch": VOTE_BATCH,
        "window": VOTE_WINDOW,
        "pairs": int(plan.indices.shape[0] + static.counts[:VOTE_WINDOW, 0].sum()),
        "window_ms": 1e3 * median,
        "step_us": 1e6 * median / VOTE_WINDOW,
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each scalar figure's median over ``runs``."""
    scalars = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: float(np.median([run[k] for run in runs])) for k in scalars}


def run(quick: bool) -> dict[str, Any]:
    """CPU per step (median of 3 runs, 1 in quick mode), the latency runs (medians of 3,
    the session's and the fetch-only driver's interleaved), and a rank's hashing for its
    vote on a window."""
    repeats = 1 if quick else 3
    load_before = os.getloadavg()[0]
    cpu = [_cpu_once(1 if quick else 2) for _ in range(repeats)]
    runs = [
        _latency(2 if quick else 5, pattern)
        for _ in range(repeats)
        for pattern in ("session", "fetch")
    ]
    vote = _vote_hashing(5 if quick else 21)
    keys = ("thread_ms", "planning_ms", "gate_ms")
    job = {
        "world": LAT_WORLD,
        "global_batch": LAT_WORLD * LAT_PER_RANK,
        "window": LAT_WINDOW,
        "samples": LAT_SAMPLES,
        "sub_processes": SUB_PROCESSES,
    }
    latency, fetch_only = (
        [r for r in runs if r["pattern"] == pattern] for pattern in ("session", "fetch")
    )
    return {
        "load_average": [load_before, os.getloadavg()[0]],
        "cpu": {
            "world": CPU_WORLD,
            "global_batch": CPU_WORLD * CPU_PER_RANK,
            "window": CPU_WINDOW,
            "samples": CPU_SAMPLES,
            "step_seconds": STEP_SECONDS,
            "runs": cpu,
            **{k: float(np.median([c[k] for c in cpu])) for k in keys},
        },
        "latency": {**job, "runs": latency, **_medians(latency)},
        "fetch_only": {**job, "runs": fetch_only, **_medians(fetch_only)},
        "vote": vote,
    }


def _listed(runs: list[dict[str, Any]], key: str, digits: int) -> str:
    return ", ".join(f"{run[key]:.{digits}f}" for run in runs)


def _latency_line(name: str, lat: dict[str, Any]) -> str:
    return (
        f"publish -> rank at W={lat['world']}, {name}: p50 {lat['p50_ms']:.2f} ms, p99 "
        f"{lat['p99_ms']:.2f} ms (runs: {_listed(lat['runs'], 'p99_ms', 2)}), "
        f"max {lat['max_ms']:.2f} ms; per window on a core: encoding {lat['cpu_encode_ms']:.2f}, "
        f"gate {lat['cpu_gate_ms']:.2f}, receivers {lat['cpu_receive_ms']:.2f} ms; waiting "
        f"for one: coordinator {lat['wait_coordinator_ms']:.2f}, gate {lat['wait_gate_ms']:.2f}, "
        f"receivers {lat['wait_receive_ms']:.2f} ms; load average {lat['load_average']:.1f}"
    )


def format_table(result: dict[str, Any]) -> str:
    """The figures as text."""
    cpu, vote = result["cpu"], result["vote"]
    return "\n".join(
        [
            f"coordinator CPU per step at W={cpu['world']}: thread {cpu['thread_ms']:.3f} ms "
            f"(planning {cpu['planning_ms']:.3f} ms), gate {cpu['gate_ms']:.3f} ms "
            f"(median of {len(cpu['runs'])})",
            _latency_line("as DynamicSession drives it", result["latency"]),
            _latency_line("fetch-only driver", result["fetch_only"]),
            f"a rank's vote hashing at W={vote['world']}, B={vote['global_batch']}: "
            f"{vote['window_ms']:.2f} ms per window of {vote['window']} steps; load average "
            f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}",
        ]
    )


def _figures(lat: dict[str, Any]) -> str:
    """p50 / p99 / max of a latency run's deliveries, medians over runs (ms)."""
    return f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} / {lat['max_ms']:.2f}"


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The page's section."""
    del img_dir
    cpu, lat, fetch, vote = (result[k] for k in ("cpu", "latency", "fetch_only", "vote"))
    runs = lat["runs"]
    path_cpu = lat["cpu_encode_ms"] + lat["cpu_gate_ms"] + lat["cpu_receive_ms"]
    waits = lat["wait_coordinator_ms"] + lat["wait_gate_ms"] + lat["wait_receive_ms"]
    step_ms = 1e3 * WINDOW_GAP_SECONDS / lat["window"]
    return "\n".join(
        [
            "## The coordinator's cost: CPU per step and publish → rank",
            "",
            f"**CPU per step.** A real `Coordinator` (a thread of the benchmark's process, "
            f"as on rank 0, its sockets in the gate process) and {cpu['world']} real "
            f"`PlanClient`s in one further process, driven as `DynamicSession` drives them "
            f"(`plan()` per window, `prefetch()` at mid-window, one `report()` per step, in "
            f"lock-step, steps of {1e3 * cpu['step_seconds']:.0f} ms), {cpu['samples']} "
            f"lognormal sizes, global batch {cpu['global_batch']}, `variable_batch=True`, "
            f"{cpu['window']} steps per window. Processor time per step of the coordinator's "
            f"thread (`Coordinator.stats.cpu_seconds`: what it takes from rank 0), of which "
            f"planning (`DynamicPlanner.plan_window`), and of the gate process "
            f"(`/proc/PID/task/*/schedstat`); medians of {len(cpu['runs'])} runs.",
            "",
            f"**Publish → rank.** The same coordinator plans and publishes the windows of a "
            f"{lat['world']}-rank job (global batch {lat['global_batch']}, {lat['window']} "
            f"steps per window, {lat['samples']} sizes) to {lat['world']} ZeroMQ SUB sockets "
            f"(one per rank's topic: a rank's own plan is all it receives) in "
            f"{lat['sub_processes']} further processes that only receive and decode, while "
            f"rank 0's `PlanClient` drives it as `DynamicSession` does: `plan()` at each "
            f"window start, `prefetch()` of the next window at mid-window, one `report()` "
            f"after each step of {step_ms:.2f} ms (a window every "
            f"{1e3 * WINDOW_GAP_SECONDS:.0f} ms). So a window is planned and published at "
            f"the middle of the one two before it, as in training; the other "
            f"{lat['world'] - 1} ranks' reports and prefetches are not sent (what reports "
            f"cost the coordinator is the CPU figure above). Latency: from the coordinator "
            f"starting to publish a window, after planning it, to each SUB socket holding its "
            f"plan (`CLOCK_MONOTONIC` in every process). A receiving process stands for "
            f"{lat['world'] // lat['sub_processes']} ranks on their own cores: it takes "
            f"whatever has arrived before decoding anything, and a rank's plan counts as "
            f"*decoded* its own decoding time after it arrived. The *fetch-only* row is the "
            f"earlier driver: one `plan()` every {1e3 * WINDOW_GAP_SECONDS:.0f} ms and "
            f"nothing else, so every other window is published in answer to a fetch and the "
            f"coordinator plans the window after it at once, beside the first one's relay. "
            f"The two drivers ran interleaved, {len(runs)} runs each, over "
            f"{lat['deliveries']:.0f} of {lat['expected']:.0f} (window, rank) pairs each run; "
            f"figures are medians over the runs. Time on a core and waiting in the run queue "
            f"for one come from `/proc/.../schedstat` (the coordinator's thread, the gate "
            f"process, the receiving processes) and `time.thread_time` around "
            f"`Coordinator._publish` (encoding).",
            "",
            f"**A rank's vote.** Besides its plan, checking a window costs a rank the hashing "
            f"of its part's and its static part's (step, sample) pairs under the window's "
            f"key (`chronica.runtime.window.imbalance`, SipHash-2-4 in numba) and two "
            f"all-reduces of 8 and 40 int64 over the framework's channel (not measured "
            f"here); timed at {vote['world']} ranks, a global batch of "
            f"{vote['global_batch']:,} and {vote['window']} steps per window, median over "
            f"fresh keys.",
            "",
            "| figure | value | target (issue 20) |",
            "|---|---:|---:|",
            f"| coordinator thread CPU per step, W={cpu['world']} (ms) | "
            f"{cpu['thread_ms']:.3f} | ≤ 0.5 |",
            f"| of which planning (ms) | {cpu['planning_ms']:.3f} | |",
            f"| gate process CPU per step (ms) | {cpu['gate_ms']:.3f} | |",
            f"| publish → rank p50 / p99 / max, W={lat['world']}, driven as `DynamicSession` "
            f"(ms) | {_figures(lat)} | p99 ≤ 2 |",
            f"| p99 of each run (ms); load average (1 min) at each run's start | "
            f"{_listed(runs, 'p99_ms', 2)}; "
            f"{_listed(runs, 'load_average', 1)} | |",
            f"| decoded p50 / p99 (ms) | {lat['decoded_p50_ms']:.2f} / "
            f"{lat['decoded_p99_ms']:.2f} | |",
            f"| fetch-only driver: p50 / p99 / max (ms) | {_figures(fetch)} | |",
            f"| per window, medians: encoding and handing to the gate / gate to the first "
            f"rank / first to last rank (ms) | {lat['encode_p50_ms']:.2f} / "
            f"{lat['relay_to_first_p50_ms']:.2f} / {lat['first_to_last_p50_ms']:.2f} | |",
            f"| per window on a core: encoding (coordinator thread) / gate process, less its "
            f"idle ticking / "
            f"{lat['sub_processes']} receiving processes (ms) | {lat['cpu_encode_ms']:.2f} / "
            f"{lat['cpu_gate_ms']:.2f} / {lat['cpu_receive_ms']:.2f} | |",
            f"| per window waiting for a core: coordinator thread / gate / receivers (ms) | "
            f"{lat['wait_coordinator_ms']:.2f} / {lat['wait_gate_ms']:.2f} / "
            f"{lat['wait_receive_ms']:.2f} | |",
            f"| the idle gate on a core (ms per second) | {lat['gate_idle_ms_per_s']:.1f} | |",
            f"| slowest rank per window, first run (ms) | "
            f"{', '.join(f'{v:.0f}' for v in runs[0]['slowest_rank_per_window_ms'])} | |",
            f"| bytes per plan message, W={lat['world']} | {lat['message_bytes']:.0f} | |",
            f"| a rank's hashing for its vote, W={vote['world']}, B={vote['global_batch']:,}, "
            f"{vote['window']} steps: per window / per step | {vote['window_ms']:.2f} ms / "
            f"{vote['step_us']:.0f} µs ({vote['pairs']:,} pairs) | |",
            "",
            "The CPU target is about what rank 0 gives the coordinator, its thread; the gate "
            "process adds its own share (relaying every request and plan between the network "
            "and the coordinator, and watching its memory), on whichever core is free.",
            "",
            f"The latency target is {'met' if lat['p99_ms'] <= 2.0 else 'not reached'} in "
            f"this run. Where a window's time goes (medians per window): the coordinator "
            f"encodes its {lat['world']} messages and hands them to the gate in "
            f"{lat['encode_p50_ms']:.2f} ms ({lat['cpu_encode_ms']:.2f} ms on a core), the "
            f"first rank holds its plan {lat['relay_to_first_p50_ms']:.2f} ms later, the last "
            f"{lat['first_to_last_p50_ms']:.2f} ms after the first. That spread is the 2 "
            f"receiving processes taking and decoding {lat['world']} messages: "
            f"{lat['cpu_receive_ms']:.2f} ms on a core per window "
            f"({1e3 * lat['cpu_receive_ms'] / lat['world']:.0f} µs a message, ZeroMQ's "
            f"reading thread included), at least {lat['cpu_receive_ms'] / 2:.2f} ms of "
            f"the machine's 2 cores even if nothing else ran; with the gate's relay "
            f"({fetch['cpu_gate_ms']:.2f} ms with the fetch-only driver, "
            f"{lat['cpu_gate_ms']:.2f} ms when it also relays the driving rank's reports) and "
            f"the encoding, a window costs the path {path_cpu:.2f} ms on a core, "
            f"{path_cpu / 2:.2f} ms of both cores, and its processes waited {waits:.2f} ms in "
            f"all for a core (the machine's load average was "
            f"{result['load_average'][0]:.1f} before the benchmark, "
            f"{result['load_average'][1]:.1f} after). So on this machine the bound is the "
            f"receiving side's share of 2 cores, not the coordinator's code: a rank of a real "
            f"job takes and decodes its one message on its own core. The two drivers now "
            f"measure alike (p99 {lat['p99_ms']:.2f} and {fetch['p99_ms']:.2f} ms): planning "
            f"and encoding the next window beside a relay no longer makes every other window "
            f"slow. The idle gate wakes every 5 ms to watch its memory "
            f"({lat['gate_idle_ms_per_s']:.0f} ms on a core per second here).",
            "",
            f"Reproduce: `{REPRODUCE}`.",
            "",
        ]
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["cpu"]:
        print(_cpu_once(1))
    elif sys.argv[1:2] == ["latency"]:
        print(_latency(3, sys.argv[2] if sys.argv[2:] else "session"))
    else:
        print(format_table(run(quick=True)))
