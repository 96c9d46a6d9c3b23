"""Gradient averaging in PyTorch: chronica's ScheduledOptimizer against DDP, on real links.

Two PyTorch ranks (gloo, one compute thread each) on 127.0.0.1 (``loopback``) or in two
network namespaces joined by a veth pair (``benchmarks/netns.sh``, MTU 9000), unshaped
(``fast``) or shaped with ``tc``: 1 Gbit/s, 400 Mbit/s, 100 Mbit/s. Models: ``mlp670k``
(784-512-512-10) and ``vgg`` (small convolutions first, fully connected layers holding 96% of
the parameters last) on loopback and the unshaped link, where scheduling must cost no more
than DDP; ``vgg`` and ``mlp`` (six equal 512x512 layers) on the shaped links. Variants:

- ``no overlap``: backward, one all-reduce of all gradients, optimizer step;
- ``DDP`` with its defaults, ``DDP static_graph`` and ``DDP bucket_cap_mb=2`` / ``=0.5``
  (the best of the three bucket sizes is reported as *DDP tuned*);
- ``chronica auto`` (``ScheduledOptimizer`` with its defaults) and ``chronica bucketed``;
- priority scheduling forced (``mode="scheduled"``): ``FIFO`` (backward order, whole
  tensors, unlimited credit, crossing the iteration barrier), ``priority`` (whole tensors,
  one partition in flight), ``priority+partition+credit`` (256 KiB, 1 MiB) and
  ``auto-tuned`` (the online search of partition and credit).

"Whole tensors" means partitions as large as the largest gradient, so no tensor is cut and
small adjacent ones are fused up to that size. Every variant keeps its own model for the run;
each round runs a block of steps of every variant, in an order rotated every round, first to
warm up (through chronica auto's decision and auto-tuned's search), then measured. Ratios
are taken per round against DDP's block, then the median. Beside them: ``compute`` (no
communication), ``comm`` (one all-reduce of all gradient bytes) and their side-by-side run.
Needs root for the namespaces; without it, runs on loopback only and says so.

Run alone: ``sudo PYTHONPATH=. python benchmarks/gradsched.py [--quick] [--links loopback
fast] [--model mlp670k vgg]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NETNS = HERE / "netns.sh"
ADDRS = ("10.77.0.1", "10.77.0.2")

__all__ = ["format_table", "render_markdown", "run"]

WHOLE = "whole"  # partition_bytes = the largest gradient's bytes: no tensor is cut

# Each variant: None (no chronica: plain training, see DDP_ARGS) or ScheduledOptimizer's knobs.
VARIANTS: dict[str, dict | None] = {
    "no overlap": None,
    "DDP": None,
    "DDP static_graph": None,
    "DDP bucket_cap_mb=2": None,
    "DDP bucket_cap_mb=0.5": None,
    "chronica auto": {"mode": "auto"},
    "chronica bucketed": {"mode": "bucketed"},
    "FIFO": {
        "mode": "scheduled",
        "order": "fifo",
        "partition_bytes": WHOLE,
        "credit_bytes": 1 << 40,
    },
    "priority": {
        "mode": "scheduled",
        "order": "priority",
        "partition_bytes": WHOLE,
        "credit_bytes": 1,
    },
    "priority+partition+credit": {
        "mode": "scheduled",
        "order": "priority",
        "partition_bytes": 256 << 10,
        "credit_bytes": 1 << 20,
    },
    "auto-tuned": {"mode": "scheduled", "order": "priority", "auto_tune": True},
}
DDP_ARGS = {
    "DDP": {},
    "DDP static_graph": {"static_graph": True},
    "DDP bucket_cap_mb=2": {"bucket_cap_mb": 2},
    "DDP bucket_cap_mb=0.5": {"bucket_cap_mb": 0.5},
}
AUTO_WARM = 19  # chronica auto: first step, 5 bucketed, a trial of 3 + 5 scheduled, 5 bucketed
MODELS = {"vgg": 32, "mlp": 1024, "mlp670k": 128}  # name -> per-rank batch


def input_shape(name: str, batch: int) -> tuple[int, ...]:
    """The input of ``_model(name)`` for ``batch`` samples."""
    return {"vgg": (batch, 3, 32, 32), "mlp670k": (batch, 784)}.get(name, (batch, 512))


# -- worker side (runs inside a namespace) -------------------------------------------------


def _model(name: str):
    from torch import nn

    if name == "vgg":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )
    if name == "mlp670k":  # 784-512-512-10: 669,706 parameters, an MNIST-sized classifier
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    layers = [m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from chronica.runtime.dispatcher import AutoTuner
    from chronica.torch.distributed import ScheduledOptimizer

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.addr}:{args.port}",
        rank=args.rank,
        world_size=2,
    )
    steps, warm, repeats = args.steps, 4, args.repeats  # steps per block, measured rounds
    out: dict = {}
    for name in args.models.split(","):
        batch = MODELS[name]
        g = torch.Generator().manual_seed(args.rank)
        x = torch.randn(*input_shape(name, batch), generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        loss_fn = torch.nn.CrossEntropyLoss()

        def make(variant: str, x=x, y=y, loss_fn=loss_fn, name=name):
            """A ``block(count) -> (seconds, cpu_seconds)`` stepping ``variant``'s own model,
            and the optimizer (a ScheduledOptimizer is synchronized after each block: no
            variant may have collectives in flight while another one steps)."""
            torch.manual_seed(0)
            model = _model(name)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            knobs = dict(VARIANTS[variant] or {})
            if knobs.get("partition_bytes") == WHOLE:
                knobs["partition_bytes"] = max(4 * p.numel() for p in model.parameters())
            if variant in DDP_ARGS:
                model = DistributedDataParallel(model, **DDP_ARGS[variant])
            elif knobs:
                opt = ScheduledOptimizer(model, opt, **knobs)
            params = list(model.parameters())

            def block(count: int) -> tuple[list[float], list[float]]:
                """Step-to-step wall and CPU (this process, all its threads) seconds."""
                times: list[float] = []
                cpu: list[float] = []
                prev = prev_cpu = None
                for _ in range(count):
                    opt.zero_grad()
                    loss_fn(model(x), y).backward()
                    if variant == "no overlap":
                        flat = torch.cat([p.grad.view(-1) for p in params])
                        dist.all_reduce(flat)
                        flat.div_(2)
                        sizes = [p.numel() for p in params]
                        for p, part in zip(params, flat.split(sizes), strict=True):
                            p.grad.view(-1).copy_(part)
                    opt.step()
                    now, now_cpu = time.perf_counter(), time.process_time()
                    if prev is not None and prev_cpu is not None:
                        times.append(now - prev)
                        cpu.append(now_cpu - prev_cpu)
                    prev, prev_cpu = now, now_cpu
                if isinstance(opt, ScheduledOptimizer):
                    opt.synchronize()
                return times, cpu

            return block, opt

        def warm_steps(variant: str, name=name) -> int:
            """Steps before ``variant`` is measured: chronica auto's decision, auto-tuned's
            whole search and as many steps again."""
            if variant == "auto-tuned":
                grid = AutoTuner.default_grid(sum(4 * p.numel() for p in _model(name).parameters()))
                return (len(grid.candidates) + grid.finalists) * grid.steps_per_trial + 2 * warm
            return warm + (AUTO_WARM if (VARIANTS[variant] or {}).get("mode") == "auto" else 0)

        def compute_steps(count: int, running=None, x=x, y=y, loss_fn=loss_fn, name=name):
            """Seconds per step of forward+backward+update without communication: ``count``
            steps, or as long as ``running()`` says so."""
            torch.manual_seed(0)
            model = _model(name)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            times: list[float] = []
            while running() if running is not None else len(times) < count:
                t0 = time.perf_counter()
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                times.append(time.perf_counter() - t0)
            return times

        def comm_steps(count: int, name=name) -> list[float]:
            """Seconds per all-reduce of all gradient bytes, ``count`` times."""
            flat = torch.zeros(sum(p.numel() for p in _model(name).parameters()))
            times = []
            for _ in range(count):
                t0 = time.perf_counter()
                dist.all_reduce(flat)
                times.append(time.perf_counter() - t0)
            return times

        def side_by_side(compute: float, comm: float) -> tuple[float, float]:
            """Computation and all-reduces at once with no dependency between them: the
            overlap this machine allows when both compete for its cores."""
            # Both ranks must issue as many all-reduces: rank 0's count, enough to cover
            # warm + steps compute steps.
            count = torch.tensor([max(warm + steps, int(np.ceil((warm + steps) * compute / comm)))])
            dist.broadcast(count, src=0)
            comm_times: list[float] = []
            thread = threading.Thread(target=lambda: comm_times.extend(comm_steps(int(count))))
            thread.start()
            compute_times = compute_steps(0, running=thread.is_alive)
            thread.join()
            dist.barrier()
            measured = compute_times[warm:] or compute_times
            return float(np.median(measured)), float(np.median(comm_times[warm:]))

        chosen = args.variants.split(",") if args.variants else list(VARIANTS)
        result: dict = {"variants": {v: [] for v in chosen}, "cpu": {v: [] for v in chosen}}
        result["stats"] = {}
        result |= {"compute": [], "comm": [], "shared_compute": [], "shared_comm": []}

        def bounds(result: dict = result) -> None:
            compute = float(np.median(compute_steps(warm + steps)[warm:]))
            dist.barrier()
            comm = float(np.median(comm_steps(warm + steps)[warm:]))
            result["compute"].append(compute)
            result["comm"].append(comm)
            shared = side_by_side(compute, comm)
            result["shared_compute"].append(shared[0])
            result["shared_comm"].append(shared[1])

        bounds()
        runners = {v: make(v) for v in chosen}
        warm_rounds = -(-max(warm_steps(v) for v in chosen) // steps) + 1
        for r in range(warm_rounds + repeats):
            # Rounds of one block per variant, the order rotated every round: a slow drift
            # of the shared machine hits every variant alike and neighbouring blocks compare.
            order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
            for variant in order:
                times, cpu = runners[variant][0](steps + 1)
                if r >= warm_rounds:
                    result["variants"][variant].append(float(np.median(times)))
                    result["cpu"][variant].append(float(np.median(cpu)))
            if r == warm_rounds + repeats // 2:
                bounds()
        for variant, (_, opt) in runners.items():
            if isinstance(opt, ScheduledOptimizer):
                exposure = opt.stats()
                result["stats"][variant] = {
                    "mode": exposure.mode,
                    "decision": exposure.decision,
                    "verdict": exposure.verdict,
                    "saving_bound": exposure.saving_bound,
                }
                opt.close()
        bounds()
        dist.barrier()
        n = sum(p.numel() for p in _model(name).parameters())
        result["param_bytes"] = 4 * n
        out[name] = result
    dist.destroy_process_group()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(out))


# -- driver side ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _netns(*args: str) -> bool:
    try:
        return subprocess.run(["bash", str(NETNS), *args], capture_output=True).returncode == 0
    except OSError:
        return False


def _pair(
    rate: str | None,
    steps: int,
    repeats: int,
    use_netns: bool,
    models: tuple[str, ...],
    variants: tuple[str, ...] = (),
) -> dict:
    """Run both ranks (in the namespaces if ``use_netns``) and return rank 0's report."""
    port = 29400 if use_netns else _free_port()
    addr = ADDRS[0] if use_netns else "127.0.0.1"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = []
        for rank in range(2):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", f"--rank={rank}"]
            cmd += [f"--addr={addr}", f"--port={port}", f"--out={out}"]
            cmd += [f"--steps={steps}", f"--repeats={repeats}", f"--models={','.join(models)}"]
            cmd += [f"--variants={','.join(variants)}"]
            rank_env = env
            if use_netns:
                cmd = ["bash", str(NETNS), "exec", str(rank), *cmd]
                # gloo listens on the address the host name resolves to (loopback here),
                # which the other namespace cannot reach: name the veth end instead.
                rank_env = {**env, "GLOO_SOCKET_IFNAME": f"veth-chr{rank}"}
            procs.append(subprocess.Popen(cmd, env=rank_env))
        try:
            codes = [p.wait(timeout=900) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"gradsched workers failed with exit codes {codes}")
        return json.loads(out.read_text())


LINKS = ("loopback", "fast", "1gbit", "400mbit", "100mbit")
FAST_MODELS = ("mlp670k", "vgg")  # where scheduling must cost no more than DDP
SHAPED_MODELS = ("vgg", "mlp")  # where communication matters


def run(quick: bool, links: list[str] | None = None, models: list[str] | None = None) -> dict:
    """Measure every variant on every link (``links``: a subset of ``LINKS``; ``loopback``
    is 127.0.0.1 without namespaces, ``fast`` the unshaped veth) for ``models`` (default:
    ``FAST_MODELS`` on loopback and the unshaped veth, ``SHAPED_MODELS`` on shaped links);
    JSON-serialisable."""
    from common import machine_info

    # 400 Mbit/s puts vgg's communication near its computation on this class of machine.
    # Quick mode (part of `chronica bench --quick`, under 5 minutes for every benchmark on 2
    # cores) runs one link (the shaped 400 Mbit/s one with namespaces, else loopback) and
    # the vgg model only.
    names = links or (["400mbit"] if quick else list(LINKS))
    unknown = sorted(set(names) - set(LINKS) | set(models or ()) - set(MODELS))
    if unknown:
        raise ValueError(f"{unknown} are not among the links {LINKS} or models {list(MODELS)}")
    steps, repeats = (4, 2) if quick else (6, 10)  # steps per block, measured rounds
    load_before = os.getloadavg()
    use_netns = os.geteuid() == 0 and _netns("down")
    if quick and not use_netns:
        names = ["loopback"]
    measured_links = []
    for name in names:
        netns = name != "loopback"
        if netns and not use_netns:
            continue
        rate = None if name in ("loopback", "fast") else name
        chosen = ("vgg",) if quick else tuple(models or ())
        chosen = chosen or (FAST_MODELS if rate is None else SHAPED_MODELS)
        if netns and not _netns("up", rate or "100gbit"):
            raise RuntimeError(f"benchmarks/netns.sh up {rate} failed")
        try:
            measured = _pair(rate, steps, repeats, netns, chosen)
        finally:
            if netns:
                _netns("down")
        label = {"loopback": "loopback", "fast": "unshaped veth"}.get(name, name)
        measured_links.append({"link": label, "rate": rate, "models": measured})
    return {
        "machine": machine_info(),
        "load_average": [load_before, os.getloadavg()],
        "quick": quick,
        "steps": steps,
        "repeats": repeats,
        "command": "sudo PYTHONPATH=. python benchmarks/gradsched.py"
        + (" --quick" * quick)
        + (f" --links {' '.join(links)}" if links else "")
        + (f" --model {' '.join(models)}" if models else ""),
        "links": measured_links,
    }


DDP_CAPS = ("DDP", "DDP bucket_cap_mb=2", "DDP bucket_cap_mb=0.5")


def _summary(model: dict) -> dict:
    """Medians over repeats: times, and per-repeat ratios (over DDP, to the bound); "DDP
    tuned" is the DDP bucket size with the lowest median, compared repeat by repeat."""
    times = {v: np.asarray(t) for v, t in model["variants"].items()}
    cpu = {v: np.asarray(t) for v, t in model.get("cpu", {}).items()}
    caps = [v for v in DDP_CAPS if v in times]
    tuned = min(caps, key=lambda v: float(np.median(times[v])))
    compute, comm = np.asarray(model["compute"]), np.asarray(model["comm"])
    # measured a few times (before, amid, after the rounds): their medians
    bound = np.median(np.maximum(compute, comm))
    shared = np.median(np.maximum(model["shared_compute"], model["shared_comm"]))
    base = times["DDP"]
    static = times.get("DDP static_graph")

    def ratio(t: np.ndarray, ref: np.ndarray) -> float:
        return float(np.median(t / ref))

    return {
        "median": {v: float(np.median(t)) for v, t in times.items()},
        "cpu": {v: float(np.median(t)) for v, t in cpu.items()},
        "vs_ddp": {v: ratio(t, base) for v, t in times.items()},
        "cpu_vs_ddp": {v: ratio(t, cpu["DDP"]) for v, t in cpu.items()},
        "vs_static": {v: ratio(t, static) for v, t in times.items()} if static is not None else {},
        "vs_tuned": {v: ratio(t, times[tuned]) for v, t in times.items()},
        "tuned": tuned,
        "speedup": {v: ratio(base, t) for v, t in times.items()},
        "to_bound": {v: float(np.median(t) / bound) for v, t in times.items()},
        "to_shared": {v: float(np.median(t) / shared) for v, t in times.items()},
        "compute": float(np.median(compute)),
        "comm": float(np.median(comm)),
        "bound": float(np.median(bound)),
        "shared": float(np.median(shared)),
        "shared_compute": float(np.median(model["shared_compute"])),
        "shared_comm": float(np.median(model["shared_comm"])),
    }


def format_table(result: dict) -> str:
    """Median iteration times (ms), time over DDP's, CPU time over DDP's, and to the bound."""
    head = f"{'link':<14}{'model':<8}{'variant':<28}{'ms':>8}{'/DDP':>7}{'cpu/DDP':>8}{'/bound':>8}"
    lines = [head]
    for link in result["links"]:
        for name, model in link["models"].items():
            s = _summary(model)
            for variant, t in s["median"].items():
                lines.append(
                    f"{link['link']:<14}{name:<8}{variant:<28}{1e3 * t:>8.1f}"
                    f"{s['vs_ddp'][variant]:>7.3f}{s['cpu_vs_ddp'].get(variant, np.nan):>8.3f}"
                    f"{s['to_bound'][variant]:>8.2f}"
                )
            lines.append(
                f"{link['link']:<14}{name:<8}{'bound max(compute, comm)':<28}"
                f"{1e3 * s['bound']:>8.1f}   (compute {1e3 * s['compute']:.1f}, "
                f"comm {1e3 * s['comm']:.1f})"
            )
            for variant, st in model.get("stats", {}).items():
                lines.append(f"{'':<14}{name:<8}{variant}: {st['decision'] or st['verdict']}")
    return "\n".join(lines)


def render_markdown(result: dict, img_dir: Path) -> str:
    """A ``## `` section for docs/benchmarks.md with tables and ``img/gradsched.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (link, name, model) for link in result["links"] for name, model in link["models"].items()
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.8), squeeze=False)
    rows, targets = [], []
    for ax, (link, name, model) in zip(axes[0], panels, strict=True):
        s = _summary(model)
        names = list(s["median"])
        ax.bar(range(len(names)), [s["vs_ddp"][v] for v in names], color="tab:blue")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.03, color="tab:red", ls="--", lw=0.8, label="DDP + 3%")
        ax.set_xticks(range(len(names)), names, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"{name}, {link['link']}", fontsize=9)
        ax.set_ylabel("step time / DDP's (same repeat)")
        for v in names:
            cpu = s["cpu_vs_ddp"].get(v)
            rows.append(
                f"| {link['link']} | {name} | {v} | {1e3 * s['median'][v]:.1f} | "
                f"{s['vs_ddp'][v]:.3f} | {'' if cpu is None else f'{cpu:.3f}'} | "
                f"{s['to_bound'][v]:.2f} |"
            )
        rows.append(
            f"| {link['link']} | {name} | *bound* max({1e3 * s['compute']:.1f}, "
            f"{1e3 * s['comm']:.1f}) | {1e3 * s['bound']:.1f} | | | 1.00 |"
        )
        if "chronica auto" in s["median"]:
            st = model.get("stats", {}).get("chronica auto", {})
            targets.append(
                f"| {link['link']} | {name} | {s['vs_ddp']['chronica auto']:.3f} | "
                f"{s['vs_static'].get('chronica auto', float('nan')):.3f} | "
                f"{s['vs_tuned']['chronica auto']:.3f} ({s['tuned']}) | "
                f"{s['cpu_vs_ddp'].get('chronica auto', float('nan')):.3f} | "
                f"{st.get('decision', '')} |"
            )
    floor, cpu_bucketed = [], []
    for link, name, model in panels:
        s = _summary(model)
        floor += [abs(s["vs_ddp"][v] - 1) for v in DDP_ARGS if v in s["vs_ddp"] and v != "DDP"]
        if "chronica bucketed" in s["cpu_vs_ddp"]:
            cpu_bucketed.append(
                f"{s['cpu_vs_ddp']['chronica bucketed']:.3f} ({name}, {link['link']})"
            )
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(img_dir / "gradsched.png", dpi=110)
    plt.close(fig)
    machine = result["machine"]
    before, after = result.get("load_average", [[np.nan] * 3] * 2)
    return "\n".join(
        [
            "## Gradient-priority scheduling (ByteScheduler)",
            "",
            "Two torch ranks (gloo, one compute thread each) on 127.0.0.1 (`loopback`) or in "
            "two network namespaces joined by a veth pair with MTU 9000 "
            "(`benchmarks/netns.sh`), unshaped or shaped with `tc`. Variants, interleaved "
            "in every round: `no overlap` (one all-reduce after backward); DDP with its "
            "defaults, with `static_graph=True` and with `bucket_cap_mb` 2 and 0.5 (*DDP "
            "tuned* is the one of the three sizes with the lowest median); `chronica auto` "
            "(`ScheduledOptimizer` with its defaults: bucketed, trying priority scheduling "
            "only where its measurements say it can help, and keeping it only if it beat "
            "bucketed steps measured before and after its trial), `chronica bucketed` "
            "(`mode='bucketed'`: DDP's buckets, the same assignment as DDP's reducer "
            "rebuilds), and priority scheduling forced (`mode='scheduled'`): FIFO "
            "and priority with whole tensors, 256 KiB partitions with 1 MiB credit, "
            "auto-tuned. Every variant keeps its own model and optimizer for the whole run; "
            f"a round runs a block of {result['steps'] + 1} steps of each variant, the "
            "order rotated every round, so that a slow drift of the shared machine hits all "
            "alike. Rounds first warm up every variant (chronica auto through its decision, "
            "auto-tuned through its search), then "
            f"{result['repeats']} rounds are measured. A block's step time is the median of "
            "its step-to-step times; ratios are taken per round against DDP's block of that "
            "round, then the median over rounds. A block of a `ScheduledOptimizer` ends with "
            "`synchronize()` (no collective may stay in flight while another variant steps), "
            "which costs it nothing measured: its step-to-step times inside the block keep "
            "the overlap with the next forward. CPU: the process's CPU seconds per step (all "
            "its threads, gloo's included) on rank 0, which the other processes on the "
            "machine disturb less than the wall clock. The bound `max(compute, comm)` is "
            "measured before, amid and after the rounds. Models: `mlp670k` (784-512-512-10, "
            "669,706 parameters, batch 128 per rank), `vgg` (a small conv net: 96% of its "
            "1.1 M parameters in the last layers, batch 32), `mlp` (six 512x512 layers, "
            "batch 1024).",
            "",
            "The target: `chronica auto` within 3% of DDP (step time / DDP's ≤ 1.03) on "
            "loopback and on the unshaped veth, for `mlp670k` and `vgg`:",
            "",
            "| link | model | chronica auto / DDP | / DDP static_graph | / DDP tuned | "
            "CPU / DDP's | what `chronica auto` decided (rank 0) |",
            "|---|---|---:|---:|---:|---:|---|",
            *targets,
            "",
            "The noise floor of this run: DDP's own variants (the same collectives with other "
            "buckets, or a static graph) differ from default DDP by up to "
            f"{max(floor, default=float('nan')):.1%} in step time (median over rounds), and "
            "ratios inside that band cannot be told apart here. The CPU seconds per step, "
            "which the machine's other work disturbs less, of `chronica bucketed` over "
            f"DDP's: {', '.join(cpu_bucketed) or 'not measured'}.",
            "",
            "| link | model | variant | ms | / DDP | CPU / DDP's | / bound |",
            "|---|---|---|---:|---:|---:|---:|",
            *rows,
            "",
            "![step time over DDP's per variant](img/gradsched.png)",
            "",
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} cores shared with "
            f"other work (load average {before[0]:.1f} when the run started, {after[0]:.1f} "
            f"when it ended), torch {machine.get('torch')}, {machine.get('date_utc')}. "
            f"Reproduce: `{result['command']}`.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", nargs="+", choices=LINKS, help="links to measure")
    parser.add_argument("--model", nargs="+", choices=list(MODELS), help="models to measure")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--addr", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--variants", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the raw result here")
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    sys.path.insert(0, str(HERE))
    result = run(args.quick, args.links, args.model)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(format_table(result))


if __name__ == "__main__":
    main()
