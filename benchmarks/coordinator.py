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
   only receive and decode; one rank's client fetches one window after another. Latency:
   from the coordinator starting to publish a window (after planning it) to each rank's
   SUB socket holding it decoded (one clock, ``CLOCK_MONOTONIC``, for every process);
   p50/p99 over all (window, rank) pairs.
3. **A rank's vote.** What checking a window costs a rank besides its plan: hashing its
   part's and its static part's (step, sample) pairs (``chronica.runtime.window.imbalance``)
   at 64 ranks and a global batch of 16,384, 16 steps per window; median over fresh keys.
   (The two all-reduces of 8 and 40 int64 go over the framework's channel.)

    PYTHONPATH=. python benchmarks/run_all.py --only coordinator
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
from chronica.comm.protocol import decode, topic
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.multiset import KEY_WORDS
from chronica.runtime import window

__all__ = ["format_table", "render_markdown", "run"]

REPRODUCE = "PYTHONPATH=. python benchmarks/run_all.py --only coordinator"

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


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Timed(Coordinator):
    """The real coordinator, timing its planning and when each window's publishing began."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.planning = 0.0
        self.published: dict[tuple[int, int], float] = {}
        self.handed: dict[tuple[int, int], float] = {}  # the window's messages to the gate
        plan_window = self.planner.plan_window

        def timed(epoch: int, first: int) -> Any:
            started = time.thread_time()
            try:
                return plan_window(epoch, first)
            finally:
                self.planning += time.thread_time() - started

        self.planner.plan_window = timed  # type: ignore[method-assign]

    def _publish(self, plan: Any, seq: int) -> None:
        key = (plan.epoch, plan.first_step)
        self.published[key] = time.monotonic()
        super()._publish(plan, seq)
        self.handed[key] = time.monotonic()


# -- 1. CPU per step ---------------------------------------------------------------------


def _ranks(endpoint: tuple[str, int, int], digest: str, epochs: int, steps: int, out: Any) -> None:
    """W clients in lock-step, as DynamicSession drives them; puts the steps run."""
    host, port, pub = endpoint
    clients = [
        PlanClient(r, CPU_WORLD, digest, host, port, pub_port=pub, timeout=10.0)
        for r in range(CPU_WORLD)
    ]
    for client in clients:
        client.connect()
    done = 0
    for epoch in range(epochs):
        for step in range(steps):
            first = step - step % CPU_WINDOW
            for client in clients:
                if step == first:
                    client.plan(epoch, first)
                if step == first + CPU_WINDOW // 2 and first + CPU_WINDOW < steps:
                    client.prefetch(epoch, first + CPU_WINDOW)
            time.sleep(STEP_SECONDS)
            for client in clients:
                client.report(epoch, step, 1.0, STEP_SECONDS)
            done += 1
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
    with _Timed(scheduler, "127.0.0.1", 0) as coordinator:
        assert coordinator.endpoint is not None and coordinator._gate is not None
        gate = coordinator._gate.pid()
        assert gate is not None
        gate_before = _process_cpu(gate)
        thread_before = coordinator.stats.cpu_seconds
        ranks = ctx.Process(
            target=_ranks, args=(coordinator.endpoint, scheduler.digest, epochs, steps, out)
        )
        ranks.start()
        done, fallbacks = out.get(timeout=600)
        ranks.join(60)
        time.sleep(0.2)  # the last reports
        thread = coordinator.stats.cpu_seconds - thread_before
        gate_cpu = _process_cpu(gate) - gate_before
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
    receives): timed on arrival and once decoded."""
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
    got: list[tuple[int, int, int, float, float]] = []
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 3.0:
        # Everything ready is taken first, then decoded: one process stands for 32 ranks,
        # which would each decode their own messages at the same time on their own cores.
        arrived = []
        for sock, _ in poller.poll(100):
            i = sockets.index(sock)
            while True:
                try:
                    arrived.append((i, sock.recv_multipart(zmq.NOBLOCK)[1], time.monotonic()))
                except zmq.Again:
                    break
        for i, payload, received in arrived:
            message = decode(payload, 1 << 30)
            got.append((i, message["epoch"], message["first"], received, time.monotonic()))
            idle_since = time.monotonic()
    out.put([(ranks[i], e, f, t, d) for i, e, f, t, d in got])
    for sock in sockets:
        sock.close(0)
    context.term()


def _latency(epochs: int) -> dict[str, Any]:
    scheduler = _scheduler(LAT_WORLD, LAT_PER_RANK, LAT_WINDOW, LAT_SAMPLES)
    _warm(scheduler)
    steps = scheduler.num_steps()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    with _Timed(scheduler, "127.0.0.1", 0) as coordinator:
        assert coordinator.endpoint is not None
        groups = np.array_split(np.arange(LAT_WORLD), SUB_PROCESSES)
        subs = [
            ctx.Process(target=_subscribers, args=(coordinator.endpoint, g.tolist(), ready, out))
            for g in groups
        ]
        for process in subs:
            process.start()
        for _ in subs:
            ready.get(timeout=120)
        time.sleep(1.0)  # subscriptions reach the PUB socket
        host, port, pub = coordinator.endpoint
        driver = PlanClient(0, LAT_WORLD, scheduler.digest, host, port, pub_port=pub, timeout=10.0)
        driver.connect()
        for epoch in range(epochs):
            for first in range(0, steps, LAT_WINDOW):
                driver.plan(epoch, first)
                time.sleep(WINDOW_GAP_SECONDS)
        received = [r for _ in subs for r in out.get(timeout=120)]
        for process in subs:
            process.join(30)
        driver.close()
        published, handed = dict(coordinator.published), dict(coordinator.handed)
        windows = coordinator.stats.windows
        message_bytes = coordinator.stats.published_bytes / max(windows * LAT_WORLD, 1)
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
        "slowest_rank_per_window_ms": [round(1e3 * v, 2) for _, v in sorted(slowest.items())],
        "encode_p50_ms": float(1e3 * np.median(encode)),
        "relay_to_first_p50_ms": float(1e3 * np.median(relay)),
        "first_to_last_p50_ms": float(1e3 * np.median(spread)),
        "decoded_p50_ms": float(1e3 * np.percentile(decoded, 50)),
        "decoded_p99_ms": float(1e3 * np.percentile(decoded, 99)),
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


def run(quick: bool) -> dict[str, Any]:
    """CPU per step (median of 3 runs, 1 in quick mode), the latency run, and a rank's
    hashing for its vote on a window."""
    repeats = 1 if quick else 3
    load_before = os.getloadavg()[0]
    cpu = [_cpu_once(1 if quick else 2) for _ in range(repeats)]
    latency = _latency(2 if quick else 5)
    vote = _vote_hashing(5 if quick else 21)
    keys = ("thread_ms", "planning_ms", "gate_ms")
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
        "latency": {
            "world": LAT_WORLD,
            "global_batch": LAT_WORLD * LAT_PER_RANK,
            "window": LAT_WINDOW,
            "samples": LAT_SAMPLES,
            "sub_processes": SUB_PROCESSES,
            **latency,
        },
        "vote": vote,
    }


def format_table(result: dict[str, Any]) -> str:
    """The figures as text."""
    cpu, lat, vote = result["cpu"], result["latency"], result["vote"]
    return "\n".join(
        [
            f"coordinator CPU per step at W={cpu['world']}: thread {cpu['thread_ms']:.3f} ms "
            f"(planning {cpu['planning_ms']:.3f} ms), gate {cpu['gate_ms']:.3f} ms "
            f"(median of {len(cpu['runs'])})",
            f"publish -> rank at W={lat['world']}: p50 {lat['p50_ms']:.2f} ms, p99 "
            f"{lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms over {lat['deliveries']} of "
            f"{lat['expected']} deliveries (decoded {lat['decoded_p50_ms']:.2f} / "
            f"{lat['decoded_p99_ms']:.2f} ms); {lat['message_bytes']:.0f} bytes per message; "
            f"load average {result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}",
            f"a rank's vote hashing at W={vote['world']}, B={vote['global_batch']}: "
            f"{vote['window_ms']:.2f} ms per window of {vote['window']} steps",
        ]
    )


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The page's section."""
    del img_dir
    cpu, lat, vote = result["cpu"], result["latency"], result["vote"]
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
            f"(`/proc/PID/stat`); medians of {len(cpu['runs'])} runs.",
            "",
            f"**Publish → rank.** The same coordinator plans and publishes the windows of a "
            f"{lat['world']}-rank job (global batch {lat['global_batch']}, {lat['window']} "
            f"steps per window, {lat['samples']} sizes), one window every "
            f"{1e3 * WINDOW_GAP_SECONDS:.0f} ms as one rank fetches them, to {lat['world']} "
            f"ZeroMQ SUB sockets (one per rank's topic) in {lat['sub_processes']} further "
            f"processes that only receive and decode. Each socket subscribes to its rank's "
            f"topic only: a rank's own plan is all it receives of a window (the ranks check "
            f"the parts together over their framework's channel, not here). Latency: from "
            f"the coordinator starting to publish a window, after planning it, to each SUB "
            f"socket holding its plan (`CLOCK_MONOTONIC` in every process; a process takes "
            f"whatever is ready before decoding, as 32 ranks on their own cores would); "
            f"*decoded*: decoded in the process, serially for its 32 ranks. Over "
            f"{lat['deliveries']} (window, rank) "
            f"pairs of {lat['expected']} published. The machine's load average (1 min) was "
            f"{result['load_average'][0]:.1f} before and {result['load_average'][1]:.1f} after "
            f"the run: the 2 cores are shared with other work, and every figure includes "
            f"waiting for one.",
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
            f"| publish → rank p50 / p99 / max, W={lat['world']} (ms) | "
            f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} / {lat['max_ms']:.2f} | p99 ≤ 2 |",
            f"| decoded p50 / p99 (ms) | {lat['decoded_p50_ms']:.2f} / "
            f"{lat['decoded_p99_ms']:.2f} | |",
            f"| per window, medians: encoding and handing to the gate / gate to the first "
            f"rank / first to last rank (ms) | {lat['encode_p50_ms']:.2f} / "
            f"{lat['relay_to_first_p50_ms']:.2f} / {lat['first_to_last_p50_ms']:.2f} | |",
            f"| slowest rank per window (ms) | "
            f"{', '.join(f'{v:.0f}' for v in lat['slowest_rank_per_window_ms'])} | |",
            f"| bytes per plan message, W={lat['world']} | {lat['message_bytes']:.0f} | |",
            f"| a rank's hashing for its vote, W={vote['world']}, B={vote['global_batch']:,}, "
            f"{vote['window']} steps: per window / per step | {vote['window_ms']:.2f} ms / "
            f"{vote['step_us']:.0f} µs ({vote['pairs']:,} pairs) | |",
            "",
            "The CPU target is about what rank 0 gives the coordinator, its thread; the gate "
            "process adds its own share (relaying every request and plan between the network "
            "and the coordinator, and watching its memory), on whichever core is free. "
            f"Each window reaches the {lat['world']} subscribers as {lat['world']} plan "
            f"messages of about {lat['message_bytes']:.0f} bytes (a rank's own part: the "
            f"ranks check the parts together over their framework's channel), relayed by the "
            f"gate process, on 2 cores shared with the {lat['sub_processes']} subscriber "
            f"processes and with other work. The latency target is "
            f"{'met' if lat['p99_ms'] <= 2.0 else 'not reached'} in this run. Where a "
            f"window's time goes (the medians in the table): the coordinator encoding its "
            f"{lat['world']} messages and handing them to the gate (in rank 0's process), the "
            f"gate relaying them to its PUB socket until the first rank holds its plan, and "
            f"the spread to the last rank. Four busy processes (the benchmark's, with the "
            f"coordinator and the fetching rank; the gate; two receivers of "
            f"{lat['world'] // lat['sub_processes']} ranks each) share the 2 cores, so most "
            f"of the relay and the spread is waiting for a core and for one receiving process "
            f"to get through its ranks one after another; a rank in its own process on its "
            f"own core waits for neither. The slowest ranks alternate between windows: the "
            f"fetching rank asks only for the windows its SUB socket does not already hold, "
            f"and the coordinator answers such a fetch by planning (and publishing) the "
            f"window after it at once, on the same 2 cores as the first one's relay; the "
            f"window planned ahead is relayed with no planning beside it.",
            "",
            f"Reproduce: `{REPRODUCE}`.",
            "",
        ]
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["cpu"]:
        print(_cpu_once(1))
    elif sys.argv[1:] == ["latency"]:
        print(_latency(3))
    else:
        print(format_table(run(quick=True)))
