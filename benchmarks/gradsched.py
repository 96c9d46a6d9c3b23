"""Gradient-priority communication scheduling on a real bandwidth-limited link.

Two PyTorch ranks (gloo, one compute thread each) run in two network namespaces joined by a
veth pair shaped with ``tc`` (``benchmarks/netns.sh``): unshaped (fast), 1 Gbit/s, 400 Mbit/s
and 100 Mbit/s (quick mode: 400 Mbit/s and ``vgg`` only, fewer steps, one repeat). Two
models: ``vgg`` (small convolutions first, fully connected layers holding 96% of the
parameters last) and ``mlp`` (equal layers: a balanced control). For each, the median
iteration time (step to step on rank 0, over measured steps, then the median over repeats) of:

- ``no overlap``: backward, one all-reduce of all gradients, optimizer step;
- ``DDP``: ``torch.nn.parallel.DistributedDataParallel`` with its default buckets;
- ``FIFO``: chronica in backward order, whole tensors, unlimited credit, crossing the
  iteration barrier (each layer's forward waits only for its own parameters);
- ``priority``: chronica priority order, whole tensors, one partition in flight;
- ``priority+partition+credit``: 256 KiB partitions, 1 MiB credit;
- ``auto-tuned``: chronica's online search of partition and credit (measured after it).

"Whole tensors" means partitions as large as the largest gradient, so no tensor is cut and
small adjacent ones are fused up to that size (as DDP's buckets fuse them). Beside them, in
the same run: ``compute`` (forward+backward+update, no communication), ``comm`` (one
all-reduce of all gradient bytes, no compute) and the bound ``max(compute, comm)``. Ratios
(speed-up over DDP, distance to the bound) are taken per repeat between runs made minutes
apart, then the median over repeats, so a slow drift of the shared machine cancels. Needs
root for the namespaces (in both modes); without it, runs on unshaped loopback only and says
so. The veth MTU is 9000 (``benchmarks/netns.sh``).

Run alone: ``sudo PYTHONPATH=. python benchmarks/gradsched.py [--quick] [--links 400mbit]``.
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

VARIANTS = {
    "no overlap": None,
    "DDP": None,
    "FIFO": {"order": "fifo", "partition_bytes": WHOLE, "credit_bytes": 1 << 40},
    "priority": {"order": "priority", "partition_bytes": WHOLE, "credit_bytes": 1},
    "priority+partition+credit": {
        "order": "priority",
        "partition_bytes": 256 << 10,
        "credit_bytes": 1 << 20,
    },
    "auto-tuned": {"order": "priority", "auto_tune": True},
}
MODELS = {"vgg": 32, "mlp": 1024}  # name -> per-rank batch


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
    steps, warm, repeats = args.steps, 4, args.repeats
    out: dict = {}
    for name in args.models.split(","):
        batch = MODELS[name]
        g = torch.Generator().manual_seed(args.rank)
        shape = (batch, 3, 32, 32) if name == "vgg" else (batch, 512)
        x, y = torch.randn(*shape, generator=g), torch.randint(0, 10, (batch,), generator=g)
        loss_fn = torch.nn.CrossEntropyLoss()

        def run_variant(variant: str, x=x, y=y, loss_fn=loss_fn, name=name) -> float:
            torch.manual_seed(0)
            model = _model(name)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            knobs = dict(VARIANTS.get(variant) or {})
            if knobs.get("partition_bytes") == WHOLE:
                knobs["partition_bytes"] = max(4 * p.numel() for p in model.parameters())
            if variant == "DDP":
                model = DistributedDataParallel(model)
            elif knobs:
                opt = ScheduledOptimizer(model, opt, **knobs)
            extra = 0
            if variant == "auto-tuned":  # its whole search, then as many warm-up steps again
                grid = AutoTuner.default_grid(sum(4 * p.numel() for p in model.parameters()))
                extra = (len(grid.candidates) + grid.finalists) * grid.steps_per_trial + warm
            times, prev = [], None
            for i in range(warm + extra + steps):
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                if variant == "no overlap":
                    grads = [p.grad for p in model.parameters()]
                    flat = torch.cat([t.view(-1) for t in grads])
                    dist.all_reduce(flat)
                    flat.div_(2)
                    for t, part in zip(grads, flat.split([t.numel() for t in grads]), strict=True):
                        t.view(-1).copy_(part)
                opt.step()
                now = time.perf_counter()
                if i >= warm + extra and prev is not None:
                    times.append(now - prev)
                prev = now
            if isinstance(opt, ScheduledOptimizer):
                opt.close()
            dist.barrier()
            return float(np.median(times))

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

        result: dict = {"variants": {v: [] for v in VARIANTS}}
        result |= {"compute": [], "comm": [], "shared_compute": [], "shared_comm": []}
        for _ in range(repeats):  # interleaved, so slow drifts of the machine hit all alike
            compute = float(np.median(compute_steps(warm + steps)[warm:]))
            dist.barrier()
            comm = float(np.median(comm_steps(warm + steps)[warm:]))
            result["compute"].append(compute)
            result["comm"].append(comm)
            shared = side_by_side(compute, comm)
            result["shared_compute"].append(shared[0])
            result["shared_comm"].append(shared[1])
            for variant in VARIANTS:
                result["variants"][variant].append(run_variant(variant))
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
    rate: str | None, steps: int, repeats: int, use_netns: bool, models: tuple[str, ...]
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


LINKS = ("fast", "1gbit", "400mbit", "100mbit")


def run(quick: bool, links: list[str] | None = None) -> dict:
    """Measure every variant on every link (``links``: a subset of ``LINKS``; ``fast`` is the
    unshaped veth); JSON-serialisable."""
    from common import machine_info

    # 400 Mbit/s puts vgg's communication near its computation on this class of machine.
    # Quick mode (part of `chronica bench --quick`, under 5 minutes for every benchmark on 2
    # cores) runs one link (the shaped 400 Mbit/s one with namespaces, else loopback) and
    # the vgg model only (mlp is the balanced control).
    names = links or (["400mbit"] if quick else list(LINKS))
    unknown = sorted(set(names) - set(LINKS))
    if unknown:
        raise ValueError(f"links {unknown} are not among {LINKS}")
    rates: list[str | None] = [None if n == "fast" else n for n in names]
    steps, repeats = (8, 1) if quick else (12, 4)
    models = ("vgg",) if quick else tuple(MODELS)
    use_netns = os.geteuid() == 0 and _netns("down")
    if quick and not use_netns:
        rates = [None]
    measured_links = []
    for rate in rates:
        if rate is not None and not use_netns:
            continue
        if use_netns and not _netns("up", rate or "100gbit"):
            raise RuntimeError(f"benchmarks/netns.sh up {rate} failed")
        try:
            measured = _pair(rate, steps, repeats, use_netns, models)
        finally:
            if use_netns:
                _netns("down")
        label = rate or ("unshaped veth" if use_netns else "loopback (not root: no netns)")
        measured_links.append({"link": label, "rate": rate, "models": measured})
    return {
        "machine": machine_info(),
        "quick": quick,
        "steps": steps,
        "repeats": repeats,
        "models": list(models),
        "command": "sudo PYTHONPATH=. python benchmarks/gradsched.py"
        + (" --quick" * quick)
        + (f" --links {' '.join(links)}" if links else ""),
        "links": measured_links,
    }


def _summary(model: dict) -> dict:
    """Medians over repeats: times, and per-repeat ratios (over DDP, to the bound)."""
    times = {v: np.asarray(t) for v, t in model["variants"].items()}
    compute, comm = np.asarray(model["compute"]), np.asarray(model["comm"])
    bound = np.maximum(compute, comm)
    shared = np.maximum(model["shared_compute"], model["shared_comm"])
    return {
        "median": {v: float(np.median(t)) for v, t in times.items()},
        "speedup": {v: float(np.median(times["DDP"] / t)) for v, t in times.items()},
        "to_bound": {v: float(np.median(t / bound)) for v, t in times.items()},
        "to_shared": {v: float(np.median(t / shared)) for v, t in times.items()},
        "compute": float(np.median(compute)),
        "comm": float(np.median(comm)),
        "bound": float(np.median(bound)),
        "shared": float(np.median(shared)),
        "shared_compute": float(np.median(model["shared_compute"])),
        "shared_comm": float(np.median(model["shared_comm"])),
    }


def format_table(result: dict) -> str:
    """Median iteration times (ms), speed-up over DDP and ratio to the bound."""
    head = (
        f"{'link':<14}{'model':<6}{'variant':<28}{'ms':>9}{'vs DDP':>8}{'/bound':>8}{'/shared':>8}"
    )
    lines = [head]
    for link in result["links"]:
        for name, model in link["models"].items():
            s = _summary(model)
            for variant, t in s["median"].items():
                lines.append(
                    f"{link['link']:<14}{name:<6}{variant:<28}{1e3 * t:>9.1f}"
                    f"{s['speedup'][variant]:>7.2f}x{s['to_bound'][variant]:>8.2f}"
                    f"{s['to_shared'][variant]:>8.2f}"
                )
            lines.append(
                f"{link['link']:<14}{name:<6}{'bound max(compute, comm)':<28}"
                f"{1e3 * s['bound']:>9.1f}   (compute {1e3 * s['compute']:.1f}, "
                f"comm {1e3 * s['comm']:.1f})"
            )
            lines.append(
                f"{link['link']:<14}{name:<6}{'shared: side by side':<28}"
                f"{1e3 * s['shared']:>9.1f}   (compute {1e3 * s['shared_compute']:.1f}, "
                f"comm {1e3 * s['shared_comm']:.1f})"
            )
    return "\n".join(lines)


def render_markdown(result: dict, img_dir: Path) -> str:
    """A ``## `` section for docs/benchmarks.md with a table and ``img/gradsched.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (link, name, model) for link in result["links"] for name, model in link["models"].items()
    ]
    links = len(result["links"])
    models = len(panels) // links
    # One row per model, one column per link: a row reads as the link slowing down.
    fig, grid = plt.subplots(models, links, figsize=(3.2 * links, 3.6 * models), squeeze=False)
    axes = [[grid[m][k] for k in range(links) for m in range(models)]]
    rows = []
    for ax, (link, name, model) in zip(axes[0], panels, strict=True):
        s = _summary(model)
        names = list(s["median"])
        ax.bar(range(len(names)), [1e3 * s["median"][v] for v in names], color="tab:blue")
        ax.axhline(1e3 * s["bound"], color="tab:red", ls="--", label="max(compute, comm)")
        ax.axhline(1e3 * s["shared"], color="tab:orange", ls=":", label="side by side")
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{name}, {link['link']}", fontsize=9)
        ax.set_ylabel("iteration (ms)")
        for v in names:
            rows.append(
                f"| {link['link']} | {name} | {v} | {1e3 * s['median'][v]:.1f} | "
                f"{s['speedup'][v]:.2f}× | {s['to_bound'][v]:.2f} | {s['to_shared'][v]:.2f} |"
            )
        rows.append(
            f"| {link['link']} | {name} | *bound* max({1e3 * s['compute']:.1f}, "
            f"{1e3 * s['comm']:.1f}) | {1e3 * s['bound']:.1f} | | 1.00 | |"
        )
        rows.append(
            f"| {link['link']} | {name} | *side by side* max({1e3 * s['shared_compute']:.1f}, "
            f"{1e3 * s['shared_comm']:.1f}) | {1e3 * s['shared']:.1f} | | | 1.00 |"
        )
    axes[0][0].legend(fontsize=7)
    summary = []
    for link, name, model in panels:
        s = _summary(model)
        ours = {v: r for v, r in s["speedup"].items() if v not in ("no overlap", "DDP")}
        best = max(ours, key=ours.get)
        summary.append(
            f"| {link['link']} | {name} | {s['comm'] / s['compute']:.2f} | "
            f"{s['speedup']['auto-tuned']:.2f}× | {best}: {ours[best]:.2f}× | "
            f"{s['to_bound'][best]:.2f} | {s['to_shared'][best]:.2f} |"
        )
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(img_dir / "gradsched.png", dpi=110)
    plt.close(fig)
    machine = result["machine"]
    return "\n".join(
        [
            "## Gradient-priority scheduling (ByteScheduler)",
            "",
            "Two torch ranks (gloo, one compute thread each) in two network namespaces joined "
            "by a `tc`-shaped veth pair with MTU 9000 (`benchmarks/netns.sh`). Iteration "
            f"time: the median over {result['steps']} measured steps, then over "
            f"{result['repeats']} interleaved repeats; speed-ups and distances are taken per "
            "repeat against the baseline of that repeat, then the median. The bound "
            "`max(compute, comm)` is measured in the same run (compute alone; one all-reduce "
            "of all gradient bytes alone), and so is *side by side*: computation and "
            "all-reduces running at once with no dependency between them, the overlap this "
            "machine allows. `vgg`: 96% of the parameters in the last layers; `mlp`: equal "
            "layers (control). FIFO and priority send whole tensors (partitions as large "
            "as the largest gradient; smaller adjacent ones fused up to that size).",
            "",
            "| link | model | variant | ms | vs DDP | / bound | / side by side |",
            "|---|---|---|---:|---:|---:|---:|",
            *rows,
            "",
            "![iteration time per variant](img/gradsched.png)",
            "",
            "Against the targets (≥ 1.3× over DDP where communication ≈ computation, within "
            "15% of the bound, ≤ 3% overhead on the fast link), per link and model: the "
            "communication / computation ratio, the auto-tuned variant's speed-up over DDP, "
            "the best chronica variant and its distance to the bound and to side by side.",
            "",
            "| link | model | comm / compute | auto-tuned vs DDP | best chronica vs DDP | "
            "best / bound | best / side by side |",
            "|---|---|---:|---:|---|---:|---:|",
            *summary,
            "",
            "Both ranks share this machine's cores with one compute thread each. "
            "Communication is not free for the CPU (gloo's loop, copies, the kernel's veth "
            "and `tc` path), and with no spare core its CPU work is taken from computation, "
            "while computation delays the threads that keep the link busy. The bound "
            "`max(compute, comm)` assumes neither happens; *side by side* measures how far "
            "they happen here. A scheduler can at best reach side by side, and only a "
            "machine with spare cores (or an accelerator doing the compute) brings that "
            "close to the bound. On the unshaped link side by side is no bound: there "
            "back-to-back all-reduces finish in a few milliseconds and keep a core busy "
            "without pause, far more communication than any step needs.",
            "",
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} cores, torch "
            f"{machine.get('torch')}, {machine.get('date_utc')}. Reproduce: "
            f"`{result['command']}`.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", nargs="+", choices=LINKS, help="links to measure")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--addr", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the raw result here")
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    sys.path.insert(0, str(HERE))
    result = run(args.quick, args.links)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(format_table(result))


if __name__ == "__main__":
    main()
