"""Scaling: planning time and coordinator bytes as the data set (N) and the world (W) grow.

Two sweeps, both on lognormal(5, 1) integer sizes (seed 7):

* **N sweep** at W=64 ranks, global batch B=4,096 (64 per rank): N = 10^4 … 10^8
  (``--quick``: 10^4 … 10^6);
* **W sweep** at N=10^6 and a fixed global batch B=16,384: W = 8 … 4,096 (strong scaling:
  the ranks share the same batch, 2,048 … 4 samples each; ``--quick``: fewer W).

At every point:

* **planning time**: ``Scheduler(sizes, config).plan_epoch(e)`` with the default kind
  (``static``, ``exact=True``), on one scheduler, a new epoch per repeat (the plan cache never
  answers), median over repeats; construction (validation, costs, digest) is timed once
  apart. Beside it, chronica's cheapest plan, ``batch_size=None`` (torch's strided split of
  the seeded permutation, no balancing), and ``numpy.argsort(sizes)``, timed in the same run
  as the yardstick. The balancing kernel runs on up to ``min(cores, 8)`` threads once an
  epoch holds 2^18 samples; ``argsort`` runs on one;
* **coordinator bytes per step**: everything a rank receives from the coordinator for the
  first window (``window=16`` steps, ``kind="dynamic"``, the plan its ``DynamicPlanner``
  makes from the real scheduler): its own PUB message, the only one per window, encoded by
  the coordinator's own code path (``Coordinator._part``, i.e. ``protocol.plan_message``)
  plus the topic frame: per rank and step, and all ranks together per step (ZeroMQ and TCP
  framing not counted). One configuration is also run over real sockets on loopback,
  capturing every published frame with a SUB socket subscribed to every topic, to check the
  computed bytes against what went on the wire. Beside them, the ranks' vote on each
  window (``chronica.runtime.agreement``) puts two all-reduces of ``KEY_WORDS`` and
  ``VOTE_WORDS`` int64 per window into the framework's channel (``vote_bytes``);
* **memory**: the peak resident set size during the point (three schedulers, one after the
  other, and argsort) above the process's size at its start, when the float64 sizes array
  (8 bytes per sample) is already held, sampled every 10 ms.

Fitted exponents are least-squares slopes on log-log axes (time ∝ N^k).

    python -m benchmarks --only scaling [--quick]
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import lognormal_sizes, machine_info, median_seconds, rss_bytes
from chronica.comm.coordinator import Coordinator
from chronica.comm.protocol import decode, encode, tcp_url, topic
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.multiset import KEY_WORDS
from chronica.core.plan import WindowPlan
from chronica.runtime.agreement import VOTE_WORDS

__all__ = [
    "fit_exponent",
    "fit_linear",
    "format_table",
    "render_markdown",
    "run",
    "vote_bytes",
    "window_bytes",
]

logger = logging.getLogger("chronica")

REPRODUCE = "python -m benchmarks --only scaling"
DATA_SEED = 7
N_SWEEP_W = 64
N_SWEEP_B = 64 * N_SWEEP_W
W_SWEEP_N = 1_000_000
W_SWEEP_B = 16_384
WINDOW = 16  # ScheduleConfig's default window: steps per coordinator message
# Balancing threads: chronica.core.balance parallelises epochs of at least this many samples.
PARALLEL_MIN_SAMPLES = 1 << 18
RSS_POLL_SECONDS = 0.01


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "ns": [10**4, 10**5, 10**6],
            "ws": [8, 64, 512, 4096],
            "repeats": {10**6: 3},
            "w_repeats": 3,
        }
    return {
        "ns": [10**4, 10**5, 10**6, 10**7, 10**8],
        "ws": [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
        "repeats": {10**6: 9, 10**7: 7, 10**8: 5},
        "w_repeats": 7,
    }


def _repeats_for(n: int, table: dict[int, int]) -> int:
    """Repeats at ``n``: the entry of the smallest tabled N at or above it (the largest
    entry beyond the table)."""
    for limit in sorted(table):
        if n <= limit:
            return table[limit]
    return table[max(table)]


def fit_exponent(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = k log x + c``: returns ``(k, exp(c))``, so that
    ``y ≈ exp(c) · x^k``. Needs two or more distinct positive ``x`` and positive ``y``."""
    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if xs.ndim != 1 or xs.shape != ys.shape or np.unique(xs).shape[0] < 2:
        raise ValueError("fit_exponent needs two or more distinct x values, one y per x")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all() and (xs > 0).all() and (ys > 0).all()):
        raise ValueError("fit_exponent needs positive, finite x and y")
    lx, ly = np.log(xs), np.log(ys)
    k, c = np.polyfit(lx, ly, 1)
    return float(k), float(np.exp(c))


def fit_linear(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``y = a + b·x``: returns ``(a, b)``."""
    b, a = np.polyfit(np.asarray(x, np.float64), np.asarray(y, np.float64), 1)
    return float(a), float(b)


class _PeakRss:
    """The peak resident set size while the ``with`` block runs, above its size at entry,
    sampled every ``RSS_POLL_SECONDS`` by a thread (Linux ``/proc``; ``None`` elsewhere)."""

    def __init__(self) -> None:
        self.baseline = self.peak = 0
        self.available = os.path.exists("/proc/self/statm")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        while not self._stop.wait(RSS_POLL_SECONDS):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> _PeakRss:
        if self.available:
            gc.collect()
            self.baseline = self.peak = rss_bytes()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int | None:
        return self.peak - self.baseline if self.available else None


def window_bytes(coordinator: Coordinator, plan: WindowPlan, seq: int) -> list[int]:
    """Bytes of every rank's PUB message for ``plan``: the topic frame and the payload the
    coordinator publishes (``Coordinator._publish`` sends ``[topic(rank), _part(...)]``)."""
    return [
        len(topic(rank)) + len(coordinator._part(plan, rank, seq))
        for rank in range(plan.num_replicas)
    ]


def vote_bytes(steps: int) -> float:
    """Bytes per step a rank puts into the framework's all-reduces for the ranks' vote on a
    window of ``steps`` steps: the key's words, then the hash and token words."""
    return 8 * (KEY_WORDS + VOTE_WORDS) / steps


def _offline_coordinator(scheduler: Scheduler) -> Coordinator:
    """The real coordinator object, never started (no socket is opened)."""
    return Coordinator(scheduler, "127.0.0.1", 0)


def _coordinator_bytes(sizes: np.ndarray, world: int, batch: int) -> dict[str, Any]:
    """Wire bytes of the first window's messages at this (N, W, B), and what they took."""
    config = ScheduleConfig(num_replicas=world, batch_size=batch, kind="dynamic", window=WINDOW)
    scheduler = Scheduler(sizes, config)
    coordinator = _offline_coordinator(scheduler)
    started = time.perf_counter()
    scheduler.plan_epoch(0)  # the static plan the windows re-split (cached in the scheduler)
    epoch_s = time.perf_counter() - started
    started = time.perf_counter()
    plan = coordinator.planner.plan_window(0, 0)
    window_s = time.perf_counter() - started
    started = time.perf_counter()
    per_rank = window_bytes(coordinator, plan, seq=0)
    encode_s = time.perf_counter() - started
    steps = plan.num_steps
    total = int(sum(per_rank))
    indices = int(plan.indices.shape[0])
    report = encode("report", rank=world - 1, epoch=0, step=steps - 1, load=1234.5, seconds=0.1)
    return {
        "window_steps": steps,
        "epoch_steps": scheduler.num_steps(),
        "window_bytes_total": total,
        "bytes_per_step_per_rank": total / (world * steps),
        "bytes_per_step_total": total / steps,
        "bytes_per_step_rank_max": max(per_rank) / steps,
        "bytes_per_index": total / max(indices, 1),
        "report_bytes_per_rank_step": len(report),
        "static_plan_seconds": epoch_s,
        "window_plan_seconds": window_s,
        "encode_seconds": encode_s,
    }


def _point(sizes: np.ndarray, world: int, batch: int, repeats: int) -> dict[str, Any]:
    """Every measurement at one (N, W, B)."""
    n = int(sizes.shape[0])
    config = ScheduleConfig(num_replicas=world, batch_size=batch)
    with _PeakRss() as rss:
        started = time.perf_counter()
        scheduler = Scheduler(sizes, config)
        construct_s = time.perf_counter() - started
        plan_s, plan_all = median_seconds(scheduler.plan_epoch, repeats)
        steps = scheduler.num_steps()
        del scheduler
        plain = Scheduler(sizes, ScheduleConfig(num_replicas=world, batch_size=None))
        plain_s, plain_all = median_seconds(plain.plan_epoch, repeats)
        del plain
        argsort_s, argsort_all = median_seconds(lambda i: np.argsort(sizes), repeats)
        wire = _coordinator_bytes(sizes, world, batch)
    growth = rss.growth
    point = {
        "n": n,
        "world": world,
        "batch_size": batch,
        "steps": steps,
        "repeats": repeats,
        "balance_threads": min(os.cpu_count() or 1, 8) if n >= PARALLEL_MIN_SAMPLES else 1,
        "plan_seconds": plan_s,
        "plan_all": plan_all,
        "construct_seconds": construct_s,
        "plain_seconds": plain_s,
        "plain_all": plain_all,
        "argsort_seconds": argsort_s,
        "argsort_all": argsort_all,
        "ratio_to_argsort": plan_s / argsort_s,
        "peak_rss_growth_bytes": growth,
        "peak_rss_bytes_per_sample": None if growth is None else growth / n,
        **wire,
    }
    logger.info(
        "scaling: N=%d W=%d: plan %.3f s, argsort %.3f s (%.1fx), %.0f B/step",
        n,
        world,
        plan_s,
        argsort_s,
        plan_s / argsort_s,
        wire["bytes_per_step_total"],
    )
    return point


def _wire_check(world: int, n: int, batch: int) -> dict[str, Any]:
    """Run the real coordinator on loopback, make it publish the first window, capture every
    published frame with a SUB socket and compare their bytes with ``window_bytes``."""
    import zmq

    sizes = lognormal_sizes(n, DATA_SEED)
    config = ScheduleConfig(num_replicas=world, batch_size=batch, kind="dynamic", window=WINDOW)
    scheduler = Scheduler(sizes, config)
    context = zmq.Context()
    coordinator = Coordinator(scheduler, "127.0.0.1", 0, context=context)
    sub = context.socket(zmq.SUB)
    dealer = context.socket(zmq.DEALER)
    captured: dict[int, int] = {}
    result: dict[str, Any] = {"world": world, "n": n, "batch_size": batch}
    try:
        coordinator.start()
        assert coordinator.endpoint is not None
        host, port, pub_port = coordinator.endpoint
        for sock in (sub, dealer):
            sock.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(tcp_url(host, pub_port))
        dealer.connect(tcp_url(host, port))
        dealer.send(encode("hello", rank=0, world=world, digest=scheduler.digest))
        if not dealer.poll(10_000):
            raise RuntimeError("no answer to hello")
        dealer.recv()
        time.sleep(0.5)  # let the subscription reach the PUB socket (ZeroMQ's slow joiner)
        dealer.send(encode("fetch", rank=0, epoch=0, first=0))
        deadline = time.monotonic() + 10.0
        while len(captured) < world and time.monotonic() < deadline:
            if not sub.poll(200):
                continue
            frames = sub.recv_multipart()
            message = decode(frames[1], max_bytes=1 << 30)
            if message["epoch"] == 0 and message["first"] == 0:
                rank = int(frames[0].decode().split("/")[1])
                captured[rank] = sum(len(f) for f in frames)
        plan = coordinator.planner.planned(0, 0)
        if plan is None:
            raise RuntimeError("the coordinator did not plan window (0, 0)")
        computed = window_bytes(_offline_coordinator(scheduler), plan, coordinator._seq[(0, 0)])
        result.update(
            captured_messages=len(captured),
            captured_bytes=int(sum(captured.values())),
            computed_bytes=int(sum(computed)),
            ok=len(captured) == world and all(captured[r] == computed[r] for r in range(world)),
        )
    except Exception as exc:  # a socket problem must not sink the timing results
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    finally:
        sub.close(0)
        dealer.close(0)
        coordinator.close()
        context.term()
    if not result["ok"]:
        logger.warning("scaling: wire check failed: %s", result)
    return result


def _warm_up() -> float:
    """Load or compile the numba kernels (single- and multi-threaded paths, the dynamic
    planner's) outside every measurement; returns the seconds it took."""
    started = time.perf_counter()
    sizes = lognormal_sizes(PARALLEL_MIN_SAMPLES + 1000, DATA_SEED)
    for n in (10_000, sizes.shape[0]):
        Scheduler(sizes[:n], ScheduleConfig(num_replicas=8, batch_size=512)).plan_epoch(0)
    _coordinator_bytes(sizes[:10_000], 8, 512)
    return time.perf_counter() - started


def _fits(points: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    """Exponents of every measured series against ``key`` (all points; and, with five or
    more points, the upper three, where fixed per-call costs no longer count)."""
    x = [p[key] for p in points]
    out = {}
    for series in (
        "plan_seconds",
        "plain_seconds",
        "argsort_seconds",
        "bytes_per_step_total",
        "bytes_per_step_per_rank",
    ):
        y = [p[series] for p in points]
        k, c = fit_exponent(x, y)
        entry = {"exponent": k, "prefactor": c}
        if len(points) >= 5:
            entry["exponent_upper3"] = fit_exponent(x[-3:], y[-3:])[0]
        out[series] = entry
    return out


def run(quick: bool) -> dict[str, Any]:
    """Both sweeps (see the module docstring); returns the JSON-ready result."""
    started = time.perf_counter()
    settings = _settings(quick)
    warm_up_s = _warm_up()
    n_points = []
    for n in settings["ns"]:
        sizes = lognormal_sizes(n, DATA_SEED)
        n_points.append(_point(sizes, N_SWEEP_W, N_SWEEP_B, _repeats_for(n, settings["repeats"])))
        del sizes
        gc.collect()
    sizes = lognormal_sizes(W_SWEEP_N, DATA_SEED)
    w_points = [_point(sizes, w, W_SWEEP_B, settings["w_repeats"]) for w in settings["ws"]]
    del sizes
    wire_check = _wire_check(8, W_SWEEP_N // 10, 8 * 64)
    return {
        "name": "scaling",
        "mode": "quick" if quick else "full",
        "machine": machine_info(),
        "command": REPRODUCE + (" --quick" if quick else ""),
        "data_seed": DATA_SEED,
        "kind": "static, exact=True (default)",
        "window": WINDOW,
        "n_sweep": {
            "world": N_SWEEP_W,
            "batch_size": N_SWEEP_B,
            "points": n_points,
            "fits": _fits(n_points, "n"),
        },
        "w_sweep": {
            "n": W_SWEEP_N,
            "batch_size": W_SWEEP_B,
            "points": w_points,
            "fits": _fits(w_points, "world"),
            # Bytes per step, all ranks = a + b·W: a is the indices' share (8 bytes each, the
            # same for every W at a fixed global batch), b what each rank's message adds.
            "bytes_linear": dict(
                zip(
                    ("a", "b"),
                    fit_linear(
                        [p["world"] for p in w_points],
                        [p["bytes_per_step_total"] for p in w_points],
                    ),
                    strict=True,
                )
            ),
        },
        "wire_check": wire_check,
        "warm_up_seconds": warm_up_s,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": time.perf_counter() - started,
    }


# -- output ------------------------------------------------------------------------------------


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.0f}"


def _exp(fit: dict[str, float]) -> str:
    text = f"{fit['exponent']:.2f}"
    if "exponent_upper3" in fit:
        text += f" (upper 3: {fit['exponent_upper3']:.2f})"
    return text


SERIES = {
    "plan_seconds": "chronica plan_epoch (exact)",
    "plain_seconds": "chronica batch_size=None",
    "argsort_seconds": "numpy.argsort",
    "bytes_per_step_total": "coordinator bytes/step, all ranks",
    "bytes_per_step_per_rank": "coordinator bytes/step, per rank",
}


def format_table(result: dict[str, Any]) -> str:
    """Both sweeps as plain-text tables, with the fitted exponents."""
    header = (
        f"{'N':>12}{'W':>6}{'steps':>8}{'plan s':>10}{'argsort s':>11}{'ratio':>7}"
        f"{'no-bal s':>10}{'B/step/rank':>13}{'B/step total':>14}{'RSS +MiB':>10}"
    )
    lines = []
    for key, title in (("n_sweep", "N sweep"), ("w_sweep", "W sweep")):
        sweep = result[key]
        fixed = (
            f"W={sweep['world']}, B={sweep['batch_size']:,}"
            if key == "n_sweep"
            else f"N={sweep['n']:,}, B={sweep['batch_size']:,}"
        )
        lines += [f"{title} ({fixed}; medians)", header]
        for p in sweep["points"]:
            lines.append(
                f"{p['n']:>12,}{p['world']:>6}{p['steps']:>8}{p['plan_seconds']:>10.4f}"
                f"{p['argsort_seconds']:>11.4f}{p['ratio_to_argsort']:>7.2f}"
                f"{p['plain_seconds']:>10.4f}{p['bytes_per_step_per_rank']:>13.1f}"
                f"{p['bytes_per_step_total']:>14,.0f}{_mib(p['peak_rss_growth_bytes']):>10}"
            )
        var = "N" if key == "n_sweep" else "W"
        for series, label in SERIES.items():
            lines.append(f"  exponent vs {var}, {label}: {_exp(sweep['fits'][series])}")
        if "bytes_linear" in sweep:
            fit = sweep["bytes_linear"]
            lines.append(
                f"  linear fit: bytes/step, all ranks = {fit['a']:,.0f} + {fit['b']:.1f}·W "
                f"(indices of B: {8 * sweep['batch_size']:,})"
            )
    check = result["wire_check"]
    lines.append(
        f"wire check (W={check['world']}, real sockets): "
        + (
            f"{check['captured_messages']} messages, {check['captured_bytes']:,} bytes captured"
            f" = {check['computed_bytes']:,} computed"
            if check["ok"]
            else f"FAILED {check}"
        )
    )
    lines.append(f"({result['seconds']:.0f} s, warm-up {result['warm_up_seconds']:.1f} s)")
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    styles = {
        "plan_seconds": ("tab:blue", "o", "-"),
        "plain_seconds": ("tab:cyan", "s", "--"),
        "argsort_seconds": ("black", "^", ":"),
        "bytes_per_step_total": ("tab:red", "o", "-"),
        "bytes_per_step_per_rank": ("tab:orange", "s", "--"),
    }
    for col, (key, var, label) in enumerate(
        (("n_sweep", "n", "N (samples)"), ("w_sweep", "world", "W (ranks)"))
    ):
        sweep = result[key]
        x = np.asarray([p[var] for p in sweep["points"]], np.float64)
        for row, group in enumerate(
            (
                ("plan_seconds", "plain_seconds", "argsort_seconds"),
                ("bytes_per_step_total", "bytes_per_step_per_rank"),
            )
        ):
            ax = axes[row, col]
            for series in group:
                color, marker, style = styles[series]
                y = np.asarray([p[series] for p in sweep["points"]])
                fit = sweep["fits"][series]
                ax.plot(
                    x,
                    y,
                    style,
                    color=color,
                    marker=marker,
                    label=f"{SERIES[series]}: slope {_exp(fit)}",
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="best")
            if row == 1:
                low, high = ax.get_ylim()
                ax.set_ylim(low / 2, high * 4)  # room for the legend above flat lines
            ax.set_xlabel(label)
            ax.set_ylabel("seconds per epoch (median)" if row == 0 else "bytes per step")
        fixed = (
            f"W={sweep['world']}, B={sweep['batch_size']:,}"
            if key == "n_sweep"
            else f"N={sweep['n']:,}, B={sweep['batch_size']:,}"
        )
        axes[0, col].set_title(f"Planning one epoch, {fixed}", fontsize=10)
        axes[1, col].set_title(f"Coordinator PUB bytes per step, {fixed}", fontsize=10)
    fig.suptitle(
        f"Scaling ({result['mode']} mode; log-log, slope = least-squares exponent)", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(result: dict[str, Any], img_dir: Path) -> str:
    """The section of docs/benchmarks.md, with its plot written into ``img_dir``."""
    img_dir = Path(img_dir)
    _plot(result, img_dir / "scaling.png")
    ns = result["n_sweep"]
    biggest = ns["points"][-1]
    lines = [
        "## Scaling with N and W",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s). How long planning one epoch "
        f"takes and how many bytes the coordinator publishes per step as the data set and "
        f"the world grow. **Planning**: `Scheduler(sizes, config).plan_epoch(e)` with the "
        f"default kind (`static`, `exact=True`) on one scheduler, a new epoch per repeat, "
        f"median over the repeats in the table; *construct* (validation, costs, digest, "
        f"once per run) is timed apart; `batch_size=None` is chronica's cheapest plan "
        f"(torch's strided split of the seeded permutation, no balancing); "
        f"`numpy.argsort(sizes)` is the yardstick, timed in the same run. The balancing "
        f"kernel uses up to min(cores, 8) threads from 2^18 samples on "
        f"({biggest['balance_threads']} here), argsort one. **Bytes**: the real "
        f"`Coordinator`'s PUB messages for the first window of {result['window']} steps "
        f'(`kind="dynamic"`, the same sizes and world), encoded by its own code path '
        f"(`Coordinator._part`, `protocol.plan_message`: int64 indices, offsets, loss "
        f"weights and loads as msgpack `bin`) plus the topic frame; ZeroMQ and TCP framing "
        f"are not counted; this message is all a rank receives from the coordinator per "
        f"window. Each rank also sends one report of "
        f"{biggest['report_bytes_per_rank_step']} bytes per step, and puts "
        f"{vote_bytes(biggest['window_steps']):.0f} bytes per step into the framework's "
        f"all-reduces for the ranks' vote on each window. "
        f"**Memory**: peak resident set size above the process's size before the point "
        f"(the float64 sizes array, 8 bytes per sample, already held), sampled every "
        f"{1e3 * RSS_POLL_SECONDS:.0f} ms. "
        f"Sizes: lognormal(5, 1) integers, seed {result['data_seed']}, held as float64 "
        f"(chronica validates every size to float64, so narrower input would only add a "
        f"copy).",
        "",
        f"![scaling]({img_dir.name}/scaling.png)",
        "",
    ]
    for key, title in (("n_sweep", "N grows"), ("w_sweep", "W grows")):
        sweep = result[key]
        fixed = (
            f"W={sweep['world']}, global batch {sweep['batch_size']:,} "
            f"({sweep['batch_size'] // sweep['world']} per rank)"
            if key == "n_sweep"
            else f"N={sweep['n']:,}, global batch {sweep['batch_size']:,} (shared by the ranks)"
        )
        lines += [
            f"### {title} ({fixed})",
            "",
            "| N | W | steps | repeats | plan (s) | argsort (s) | plan / argsort | "
            "`batch_size=None` (s) | construct (s) | bytes/step per rank | bytes/step, all "
            "ranks | bytes per index | window planning (ms) | peak RSS growth (MiB) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in sweep["points"]:
            lines.append(
                f"| {p['n']:,} | {p['world']} | {p['steps']:,} | {p['repeats']} | "
                f"{p['plan_seconds']:.4f} | {p['argsort_seconds']:.4f} | "
                f"{p['ratio_to_argsort']:.2f} | {p['plain_seconds']:.4f} | "
                f"{p['construct_seconds']:.4f} | {p['bytes_per_step_per_rank']:,.1f} | "
                f"{p['bytes_per_step_total']:,.0f} | {p['bytes_per_index']:.2f} | "
                f"{1e3 * p['window_plan_seconds']:.1f} | {_mib(p['peak_rss_growth_bytes'])} |"
            )
        var = "N" if key == "n_sweep" else "W"
        lines += [
            "",
            f"Fitted exponents against {var} (least squares on log-log"
            + (f"; *upper 3*: the three largest {var} only" if len(sweep["points"]) >= 5 else "")
            + "): "
            + "; ".join(f"{label} **{_exp(sweep['fits'][s])}**" for s, label in SERIES.items())
            + ".",
            "",
        ]
        if "bytes_linear" in sweep:
            fit = sweep["bytes_linear"]
            lines += [
                f"The bytes per step of all ranks are not a power of W but a line: "
                f"{fit['a']:,.0f} + {fit['b']:.1f}·W (least squares). The constant is the "
                f"indices of the global batch ({sweep['batch_size']:,} × 8 = "
                f"{8 * sweep['batch_size']:,} bytes, whatever W); each rank adds its message's "
                f"fixed part per step (offset, loss weight and load, 8 bytes each, and its "
                f"share of the message header and topic frame over {result['window']} steps).",
                "",
            ]
    short = [p for p in ns["points"] if p["window_steps"] < result["window"]]
    notes = []
    if short:
        notes.append(
            f"At N={short[0]['n']:,} the epoch has only {short[0]['epoch_steps']} steps, so "
            f"the first window holds all of them and each message's fixed part (offsets, "
            f"weights, loads per step, header, topic) is shared by fewer steps."
        )
    growth = biggest["peak_rss_growth_bytes"]
    if growth is not None:
        notes.append(
            f"At N={biggest['n']:,} the peak memory growth is {growth / 2**30:.2f} GiB, "
            f"{biggest['peak_rss_bytes_per_sample']:.0f} bytes per sample on top of the "
            f"sizes (which double as the costs under the linear model). The largest phase "
            f"is the `batch_size=None` scheduler: one step per sample of a rank, so its "
            f"plans hold a load (float64) and a row of bounds per step besides the int64 "
            f"indices, and it builds a new one next to the cached one and the epoch's int32 "
            f"order. Exact planning alone (about 21 bytes per sample) is measured in a fresh "
            f"process in *Planning speed* above."
        )
    check = result["wire_check"]
    if check["ok"]:
        notes.append(
            f"Wire check: a real coordinator on loopback (W={check['world']}, "
            f"N={check['n']:,}) published {check['captured_messages']} messages for the "
            f"first window, {check['captured_bytes']:,} bytes as captured by a SUB socket, "
            f"equal to the computed {check['computed_bytes']:,}."
        )
    else:
        notes.append(f"Wire check **failed**: {check}.")
    lines += [" ".join(notes), "", f"Reproduce: `{result['command']}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    print(format_table(run(quick=True)))
