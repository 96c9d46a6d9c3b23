"""Validate ``chronica simulate gradients`` against step times measured on a shaped link,
then predict the gain of priority scheduling on larger clusters (simulated).

Measured part: two PyTorch ranks (gloo, one compute thread each) in two network namespaces
of this script's own (``chr-gsim-0/1``, 10.78.0.1-2, veth MTU 9000, both ends shaped with a
``tc`` token bucket), on the models and variants of ``benchmarks/gradsched.py`` (``no
overlap``, ``DDP``, ``FIFO``, ``priority``, ``priority+partition+credit``). In every
repeat, in one process pair: all-reduce times at four sizes and all gradients as one
all-reduce or as ``QUEUED_PARTS`` issued back to back (the link's bandwidth, latency and
queued latency, see ``link_fit``); compute alone and beside back-to-back all-reduces (the
CPU slowdown communication causes here, and the all-reduces' own slowdown beside
compute); then each variant's steps, with hooks timing every layer's forward (after any
wait for its parameters) and backward in those same steps, between compute-only runs.
Both ranks' layer times are gathered and the slower taken per layer and step.

The simulator predicts each variant's step time from the fitted link and (``in-run``) the
layer times of the variant's own steps, with the link's slowdown beside compute, or
(``alone``) those of the compute-only runs around it, with or without both measured
slowdowns. No input is fitted to the step times; ratios simulated / measured are taken
per repeat, then the median.

Simulated part: the gain of priority over FIFO and over DDP's buckets for VGG-16, BERT and
GPT-2 layer profiles at 8-64 ranks on 10-100 Gbit/s links (assumptions in
``chronica.sim.grad_profiles``).

Needs root for the namespaces; without it the measured part runs on loopback and says so.
Run alone: ``sudo python -m benchmarks.grad_sim_validation [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from chronica.runtime.gradients import PLAN_STEPS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAMESPACES = ("chr-gsim-0", "chr-gsim-1")
ADDRS = ("10.78.0.1", "10.78.0.2")
VETH = ("vgsim0", "vgsim1")
PORT = 29470
# Variants of benchmarks/gradsched.py that the simulator models (auto-tuned searches online).
VALIDATED = ("no overlap", "DDP", "FIFO", "priority", "priority+partition+credit")
POLICY = {
    "no overlap": "none",
    "DDP": "ddp",
    "FIFO": "fifo",
    "priority": "priority",
    "priority+partition+credit": "priority",
}
LINKS = ("1gbit", "400mbit", "100mbit")
ALLREDUCE_SIZES = (1, 64 << 10, 256 << 10)  # elements (fp32); plus all gradients at once
QUEUED_PARTS = 16  # all gradients as this many collectives issued back to back
# Steps a scheduled run needs before it is steady: the torch shim's first step discovers the
# priority and its scheduled engine re-plans after its 1st scheduled step and from the medians
# of its first PLAN_STEPS, waiting for everything in flight each time (a drained link, which
# the next steps do not have).
SCHEDULED_WARM = 1 + PLAN_STEPS
PREDICTION_RANKS = (8, 16, 32, 64)
PREDICTION_LINKS = ("10gbit", "25gbit", "100gbit")
PREDICTION_PROFILES = ("vgg16", "bert-base", "bert-large", "gpt2", "gpt2-medium")

__all__ = ["SCHEDULED_WARM", "format_table", "probe_steps", "render_markdown", "run"]


# -- worker side (runs inside a namespace) -------------------------------------------------


class _Probe:
    """Times each layer of a ``gradsched`` model: its forward from when it starts
    computing (its ``forward`` wrapped, so after every forward pre-hook: the shim's wait
    for the parameters and its updates, whenever the shim registered them) to its end
    (the loss counts as the last layer's), its backward from the previous layer's
    gradients (or the call to ``backward``) to its own."""

    def __init__(self, model) -> None:
        groups: list[list] = []  # each parameter-holding module with the free ones after it
        for child in model.children():
            if any(True for _ in child.parameters()) or not groups:
                groups.append([])
            groups[-1].append(child)
        self.params = [[p for m in group for p in m.parameters()] for group in groups]
        self.names = [type(group[0]).__name__ + str(i) for i, group in enumerate(groups)]
        n = len(groups)
        self.start, self.end, self.ready = np.zeros(n), np.zeros(n), np.zeros(n)
        self.forward: list[np.ndarray] = []
        self.backward: list[np.ndarray] = []
        for i, group in enumerate(groups):
            self._wrap(group[0], self.start, i, before=True)
            self._wrap(group[-1], self.end, i, before=False)
            for p in self.params[i]:
                p.register_post_accumulate_grad_hook(lambda _, i=i: self._stamp(self.ready, i))

    @staticmethod
    def _stamp(times: np.ndarray, i: int) -> None:
        times[i] = time.perf_counter()

    def _wrap(self, module, times: np.ndarray, i: int, before: bool) -> None:
        """Stamp ``times[i]`` as ``module.forward`` starts (``before``) or returns."""
        inner = module.forward

        def forward(*args, **kwargs):
            if before:
                self._stamp(times, i)
            out = inner(*args, **kwargs)
            if not before:
                self._stamp(times, i)
            return out

        module.forward = forward

    def step(self, loss_end: float) -> None:
        """Record the step whose loss was computed at ``loss_end``, backward since done."""
        self.end[-1] = loss_end
        self.forward.append(self.end - self.start)
        ends = np.concatenate([[loss_end], self.ready[::-1]])
        self.backward.append(np.diff(ends)[::-1])

    def layout(self) -> dict:
        """The layers' names and tensor bytes."""
        return {
            "names": self.names,
            "tensor_bytes": [[4 * p.numel() for p in ps] for ps in self.params],
        }


def _setup(name: str, variant: str | None, batch: int | None = None):
    """Model ``name`` with its probe, data, loss and optimizer, wrapped for ``variant`` of
    gradsched (``None``: no communication), ``batch`` samples (default gradsched's)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks.grad_models import MODELS, knobs_for
    from benchmarks.grad_models import model as _model
    from chronica.torch.distributed import ScheduledOptimizer

    torch.manual_seed(0)
    model = _model(name)
    batch = batch or MODELS[name]
    shape = (batch, 3, 32, 32) if name == "vgg" else (batch, 512)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(*shape, generator=g), torch.randint(0, 10, (batch,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    knobs = knobs_for(variant, model) if variant else {}
    probe = _Probe(model)
    if variant == "DDP":
        model = DistributedDataParallel(model)
    elif knobs:
        opt = ScheduledOptimizer(model, opt, **knobs)
    return model, probe, x, y, torch.nn.CrossEntropyLoss(), opt


def probe_steps(steps: int) -> int:
    """Steps of a probed run of a variant (``_run_steps`` measures its second half) of at least
    ``steps`` measured ones, whose measured half follows ``SCHEDULED_WARM`` steps: steady
    steps, as the benchmark's rounds run, not the ones just after a re-plan drained the link.

    Args:
        steps: the measured steps wanted.

    Example::

        >>> probe_steps(3), probe_steps(12)
        (18, 24)
    """
    return 2 * max(int(steps), SCHEDULED_WARM)


def _run_steps(
    name: str,
    variant: str | None,
    count: int,
    running: Callable[[], bool] | None = None,
    batch: int | None = None,
) -> dict:
    """``count`` steps (more while ``running()``) of ``variant`` (``None``: compute only):
    step-to-step seconds (median after the first half), the probe's per-layer times and,
    without communication, the optimizer's seconds."""
    import torch
    import torch.distributed as dist

    from chronica.torch.distributed import ScheduledOptimizer

    model, probe, x, y, loss_fn, opt = _setup(name, variant, batch)
    params = list(model.parameters())
    stamps: list[float] = [time.perf_counter()]
    update: list[float] = []
    reduce: list[float] = []
    while len(update) < count or (running is not None and running()):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss_end = time.perf_counter()
        loss.backward()
        probe.step(loss_end)
        packing = 0.0  # no overlap's flatten and copy back: its compute, beside opt.step()
        if variant == "no overlap":
            before = time.perf_counter()
            flat = torch.cat([p.grad.view(-1) for p in params])
            sent = time.perf_counter()
            dist.all_reduce(flat)
            received = time.perf_counter()
            flat.div_(2)
            for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
                p.grad.view(-1).copy_(part)
            packing = sent - before + time.perf_counter() - received
            reduce.append(received - sent)
        before = time.perf_counter()
        opt.step()
        stamps.append(time.perf_counter())
        update.append(stamps[-1] - before + packing)
    if isinstance(opt, ScheduledOptimizer):
        opt.close()
    if variant is not None:
        dist.barrier()
    half = len(update) // 2  # the first half warms up
    mine = {
        "forward": np.asarray(probe.forward[half:]),
        "backward": np.asarray(probe.backward[half:]),
        "update": np.asarray(update[half:]),
        "reduce": np.asarray(reduce[half:]),
        "step_s": float(np.median(np.diff(stamps)[half:])),
    }
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {**probe.layout(), **_slowest(ranks)}


def _slowest(ranks: list[dict]) -> dict:
    """The ranks' steps as those of one rank as slow, at every layer of every step, as the
    slowest (a collective waits for the last rank's gradients; the maximum of two noisy
    ranks per step, not of their medians), then the median over steps, scaled so that the
    layers add up to the median over steps of the slower rank's forward and backward
    (``spread``: that factor; on a busy machine a step holds a delay in some layer or
    other, which the layers' medians each leave out); ``step_s`` is rank 0's and
    ``overhead_s`` the step's time outside the probed layers and the optimizer. With no
    overlap's all-reduces, ``reduce_s``: the faster rank's (the one that did not wait for
    the other), median over steps."""
    n = min(len(r["update"]) for r in ranks)
    out: dict = {"step_s": ranks[0]["step_s"]}
    slowest = {key: np.max([r[key][:n] for r in ranks], axis=0) for key in ("forward", "backward")}
    layers = sum(float(np.median(slowest[key], axis=0).sum()) for key in slowest)
    per_rank = [r["forward"][:n].sum(1) + r["backward"][:n].sum(1) for r in ranks]
    steps = float(np.median(np.max(per_rank, axis=0)))
    out["spread"] = steps / layers
    for key in ("forward", "backward"):
        out[f"{key}_s"] = (out["spread"] * np.median(slowest[key], axis=0)).tolist()
    out["update_s"] = float(np.median(np.max([r["update"][:n] for r in ranks], axis=0)))
    if len(ranks[0]["reduce"]):
        out["reduce_s"] = float(np.median(np.min([r["reduce"][:n] for r in ranks], axis=0)))
    compute = sum(out["forward_s"]) + sum(out["backward_s"]) + out["update_s"]
    out["overhead_s"] = max(0.0, out["step_s"] - compute)
    out["rank_compute_s"] = [
        float(np.median(r["forward"].sum(1) + r["backward"].sum(1) + r["update"])) for r in ranks
    ]
    return out


def _allreduce_times(numels: list[int], count: int) -> list[float]:
    import torch
    import torch.distributed as dist

    out = []
    for n in numels:
        flat = torch.zeros(n)
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - t0)
        out.append(float(np.median(times[count // 2 :])))
    return out


def _queued_times(numel: int, count: int) -> list[float]:
    """Seconds of all-reducing ``numel`` elements as one collective and as
    ``QUEUED_PARTS`` collectives issued back to back without waiting (as DDP and the shim
    issue them), alternately ``count`` times; the medians of the second half."""
    import torch
    import torch.distributed as dist

    whole = torch.zeros(numel)
    parts = list(torch.zeros(numel).chunk(QUEUED_PARTS))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(count):
        t0 = time.perf_counter()
        dist.all_reduce(whole)
        t1 = time.perf_counter()
        for work in [dist.all_reduce(part, async_op=True) for part in parts]:
            work.wait()
        times[0].append(t1 - t0)
        times[1].append(time.perf_counter() - t1)
    return [float(np.median(t[count // 2 :])) for t in times]


def _with_allreduces(name: str, count: int, numel: int, comm_s: float) -> dict:
    """Profiles of compute steps alone, then while a thread all-reduces all gradient bytes
    back to back (as many times on both ranks: rank 0's count), covering ``count`` steps;
    ``allreduce_s``: those all-reduces' median (the link beside compute)."""
    import torch
    import torch.distributed as dist

    alone = _run_steps(name, None, count)
    rounds = torch.tensor(
        [
            max(
                4,
                int(np.ceil(count * (sum(alone["forward_s"]) + sum(alone["backward_s"])) / comm_s)),
            )
        ]
    )
    dist.broadcast(rounds, src=0)
    beside: list[float] = []
    thread = threading.Thread(target=lambda: beside.extend(_allreduce_times([numel], int(rounds))))
    thread.start()
    shared = _run_steps(name, None, 2, running=thread.is_alive)
    thread.join()
    return {"alone": alone, "shared": shared, "allreduce_s": beside[0]}


def _worker(spec: dict) -> None:
    """One rank: ``spec`` holds rank, addr, port, out, steps, repeats and models."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    address = f"tcp://{spec['addr']}:{PORT}"
    dist.init_process_group("gloo", init_method=address, rank=spec["rank"], world_size=2)
    steps = spec["steps"]
    out: dict = {}
    for name in spec["models"]:
        repeats = []
        for _ in range(spec["repeats"]):  # interleaved: a drift of the machine hits all alike
            # A profile before and after every variant: the machine's load drifts, and a
            # variant is compared with the compute measured around it.
            profiles = [_run_steps(name, None, steps)]
            numel = sum(sum(b) for b in profiles[0]["tensor_bytes"]) // 4
            sizes = [*ALLREDUCE_SIZES, numel]
            dist.barrier()
            link = {"numel": sizes, "seconds": _allreduce_times(sizes, 2 * steps)}
            link["queued"] = _queued_times(numel, steps)
            shared = _with_allreduces(name, steps, numel, link["seconds"][-1])
            runs = {}
            for variant in VALIDATED:
                runs[variant] = _run_steps(name, variant, probe_steps(steps))
                profiles.append(_run_steps(name, None, steps))
            repeats.append(
                {"profiles": profiles, "allreduce": link, "shared": shared, "measured": runs}
            )
        out[name] = repeats
    dist.destroy_process_group()
    if spec["rank"] == 0:
        Path(spec["out"]).write_text(json.dumps(out))


# -- driver side ---------------------------------------------------------------------------


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _down() -> None:
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _up(rate: str) -> None:
    """Two namespaces joined by a veth pair, both ends shaped to ``rate`` (tbf)."""
    _down()
    for ns in NAMESPACES:
        _sh("ip", "netns", "add", ns)
    _sh(
        "ip", "link", "add", VETH[0], "netns", NAMESPACES[0], "type", "veth",
        "peer", "name", VETH[1], "netns", NAMESPACES[1],
    )  # fmt: skip
    for ns, dev, addr in zip(NAMESPACES, VETH, ADDRS, strict=True):
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "link", "set", dev, "mtu", "9000", "up")
        _sh(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
            "tbf", "rate", rate, "burst", "64kb", "latency", "50ms",
        )  # fmt: skip


def _pair(rate: str | None, steps: int, repeats: int, models: tuple[str, ...]) -> dict:
    """Both ranks (in the namespaces when ``rate`` is set); rank 0's measurements."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = []
        for rank in range(2):
            spec = {"rank": rank, "addr": ADDRS[0] if rate else "127.0.0.1", "out": str(out)}
            spec |= {"steps": steps, "repeats": repeats, "models": list(models)}
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.grad_sim_validation",
                "--worker",
                json.dumps(spec),
            ]
            rank_env = env
            if rate:
                cmd = ["ip", "netns", "exec", NAMESPACES[rank], *cmd]
                # gloo would listen on the host name's address, unreachable from the peer.
                rank_env = {**env, "GLOO_SOCKET_IFNAME": VETH[rank]}
            procs.append(subprocess.Popen(cmd, env=rank_env))
        try:
            codes = [p.wait(timeout=1800) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"grad_sim_validation workers failed with exit codes {codes}")
        return json.loads(out.read_text())


def measure(quick: bool, links: list[str] | None = None) -> dict:
    """The measured part on every shaped link (loopback when not root)."""
    names = links or (["400mbit"] if quick else list(LINKS))
    # 6 steps of each variant after 6 of warm-up (the shim re-plans after its 1st and 3rd):
    # every case, 3 repeats, in one run of under 15 minutes on the 2 shared cores (a step
    # at 100 Mbit/s takes half a second)
    steps, repeats = (6, 1) if quick else (6, 3)
    models = ("vgg",) if quick else ("vgg", "mlp")
    use_netns = os.geteuid() == 0
    measured = []
    for rate in names if use_netns else [None]:
        if rate:
            _up(rate)
        try:
            models_out = _pair(rate, steps, repeats, models)
        finally:
            _down()
        measured.append({"link": rate or "loopback (not root)", "models": models_out})
    return {"steps": steps, "repeats": repeats, "links": measured}


# -- the simulator's side ------------------------------------------------------------------


def sim_layers(
    profiles: list[dict], update_s: float | None = None, overhead_s: float | None = None
) -> list:
    """Layers from the mean of ``profiles``; the optimizer's seconds (``update_s``, default
    the profiles' own) spread over layers by bytes; the per-step time outside the layers
    (``overhead_s``, default the profiles' own: ``zero_grad``, the Python loop) added to
    the first layer's forward, where it falls."""
    from chronica.sim.gradients import Layer

    def mean(key: str) -> np.ndarray:
        return np.mean([p[key] for p in profiles], axis=0)

    first = profiles[0]
    forward, backward = mean("forward_s"), mean("backward_s")
    forward[0] += float(mean("overhead_s")) if overhead_s is None else overhead_s
    update = float(mean("update_s")) if update_s is None else update_s
    sizes = [sum(b) for b in first["tensor_bytes"]]
    return [
        Layer(name, tuple(tb), float(fwd), float(bwd), update * size / sum(sizes))
        for name, tb, fwd, bwd, size in zip(
            first["names"], first["tensor_bytes"], forward, backward, sizes, strict=True
        )
    ]


def link_fit(allreduce: dict) -> tuple[float, float, float]:
    """Bandwidth, latency and queued latency from all-reduce times, at W = 2 where
    ``t = bytes / B + 2α``: the bandwidth from the two largest sizes (their difference
    cancels the latency), the latency from the smallest (one element on an idle link: all
    latency), the queued latency from all gradients as ``QUEUED_PARTS`` collectives issued
    back to back against one (``QUEUED_PARTS - 1`` more collectives, 2 hops each; 0 when
    noise makes the split faster)."""
    nbytes = 4 * np.asarray(allreduce["numel"], dtype=float)
    seconds = np.asarray(allreduce["seconds"], dtype=float)
    bandwidth = (nbytes[-1] - nbytes[-2]) / (seconds[-1] - seconds[-2])
    whole, split = allreduce["queued"]
    queued = max(0.0, (split - whole) / (2 * (QUEUED_PARTS - 1)))
    return float(bandwidth), float(seconds[0] / 2), queued


def _policy(variant: str, largest: int):
    """The simulator's policy for one of gradsched's variants (the same knobs)."""
    from benchmarks.grad_models import VARIANTS, WHOLE
    from chronica.sim.gradients import Policy

    knobs = VARIANTS[variant]
    if not knobs:
        return Policy(POLICY[variant], label=variant)
    part = largest if knobs["partition_bytes"] == WHOLE else knobs["partition_bytes"]
    return Policy(POLICY[variant], part, min(knobs["credit_bytes"], 1 << 62), label=variant)


def validate(measured: dict) -> list[dict]:
    """Simulated against measured step time per link, model and variant, per repeat, then
    the medians. Predictions: ``in_run``, from the layer times measured in the variant's
    own steps (hooks; the CPU contention of this machine included) on the fitted link,
    slowed by the contention measured beside compute while the rank computes;
    ``link_alone``, the same without the queued latency and the link's contention (the
    link as all-reduces alone measure it); ``alone``, from compute measured without
    communication just before and after the variant, no contention; ``contended``,
    ``alone`` with both slowdowns measured side by side."""
    from chronica.sim.gradients import Link, simulate_step

    rows = []
    for link in measured["links"]:
        for model, repeats in link["models"].items():
            per: dict[str, dict[str, list[float]]] = {}
            inputs = []
            for repeat in repeats:
                bandwidth, latency, queued = link_fit(repeat["allreduce"])
                shared = repeat["shared"]
                alone, beside = (sim_layers([shared[k]]) for k in ("alone", "shared"))
                slowdown = max(_total(beside) / _total(alone) - 1.0, 0.0)
                whole = repeat["allreduce"]["seconds"][-1]
                link_slowdown = max(shared["allreduce_s"] / whole - 1.0, 0.0)
                reduce = repeat["measured"]["no overlap"]["reduce_s"] / whole
                inputs.append((bandwidth, latency, queued, slowdown, link_slowdown, reduce))
                fitted = Link(bandwidth, latency, 2, queued)
                plain = Link(bandwidth, latency, 2)
                for k, (variant, run) in enumerate(repeat["measured"].items()):
                    bracket = repeat["profiles"][k : k + 2]
                    around = sim_layers(bracket)
                    # none and DDP update in step() (in-run, no overlap's packing with it);
                    # the shim updates on its own thread, so its update is measured alone.
                    own = POLICY[variant] in ("none", "ddp")
                    update = None if own else float(np.mean([p["update_s"] for p in bracket]))
                    overhead = float(np.mean([p["overhead_s"] for p in bracket]))
                    in_run = sim_layers([run], update, overhead)
                    largest = max(max(layer.tensor_bytes) for layer in around)
                    policy = _policy(variant, largest)
                    row = per.setdefault(variant, {})
                    row.setdefault("measured", []).append(run["step_s"])
                    for key, layers, sim_link, factor, link_factor in (
                        ("in_run", in_run, fitted, 0.0, link_slowdown),
                        ("link_alone", in_run, plain, 0.0, 0.0),
                        ("alone", around, fitted, 0.0, 0.0),
                        ("contended", around, fitted, slowdown, link_slowdown),
                    ):
                        step = simulate_step(
                            layers, sim_link, policy, factor, link_slowdown=link_factor
                        ).step_s
                        row.setdefault(key, []).append(step)
                        row.setdefault(f"{key}_ratio", []).append(step / run["step_s"])
                        row.setdefault(f"{key}_compute", []).append(_total(layers))
            fit = dict(
                zip(
                    ("bandwidth", "latency_s", "queued_latency_s", "slowdown", "link_slowdown",
                     "reduce_in_run"),
                    np.median(np.asarray(inputs), axis=0).tolist(),
                    strict=True,
                )
            )  # fmt: skip
            for variant, row in per.items():
                rows.append(
                    {
                        "link": link["link"],
                        "model": model,
                        "variant": variant,
                        **{
                            (k if k.endswith("_ratio") else f"{k}_s"): float(np.median(v))
                            for k, v in row.items()
                        },
                        "repeats": row,
                        **fit,
                    }
                )
    return rows


def _total(layers: list) -> float:
    return sum(layer.forward_s + layer.backward_s + layer.update_s for layer in layers)


TUNING_GRID = [(part << 20, mult * part << 20) for part in (1, 4, 16, 64, 256) for mult in (1, 4)]


def predict() -> list[dict]:
    """Simulated step times of DDP, FIFO, priority (the shim's defaults) and priority with
    the best partition and credit of ``TUNING_GRID``, per profile, ranks and link."""
    from chronica.sim.grad_cli import parse_rate
    from chronica.sim.grad_profiles import profile_layers
    from chronica.sim.gradients import Link, Policy, simulate_step

    rows = []
    for name in PREDICTION_PROFILES:
        layers = profile_layers(name)
        compute = sum(layer.forward_s + layer.backward_s + layer.update_s for layer in layers)
        total = sum(sum(layer.tensor_bytes) for layer in layers)
        for world in PREDICTION_RANKS:
            for text in PREDICTION_LINKS:
                link = Link(parse_rate("link", text), 5e-6, world)
                step = {
                    k: simulate_step(layers, link, k).step_s for k in ("ddp", "fifo", "priority")
                }
                tuned = {
                    knobs: simulate_step(layers, link, Policy("priority", *knobs)).step_s
                    for knobs in TUNING_GRID
                }
                best = min(tuned, key=tuned.__getitem__)
                rows.append(
                    {
                        "profile": name,
                        "ranks": world,
                        "link": text,
                        "compute_s": compute,
                        "comm_s": link.seconds(total),
                        **{f"{k}_s": v for k, v in step.items()},
                        "tuned_s": tuned[best],
                        "tuned_partition": best[0],
                        "tuned_credit": best[1],
                    }
                )
    return rows


def run(quick: bool, links: list[str] | None = None) -> dict:
    """Measure, validate and predict; JSON-serialisable."""
    from benchmarks.common import machine_info

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    measured = measure(quick, links)
    measured_s = time.perf_counter() - started
    started = time.perf_counter()
    validation = validate(measured)
    predictions = predict()
    return {
        "machine": machine_info(),
        "quick": quick,
        "steps": measured["steps"],
        "repeats": measured["repeats"],
        "command": "sudo python -m benchmarks.grad_sim_validation"
        + (" --quick" * quick)
        + (f" --links {' '.join(links)}" if links else ""),
        "measured": measured,
        "measured_seconds": measured_s,
        "load_average": [load_before, os.getloadavg()[0]],
        "validation": validation,
        "predictions": predictions,
        "simulated_seconds": time.perf_counter() - started,
    }


def format_table(result: dict) -> str:
    """The validation (simulated vs measured) and the simulated predictions."""
    lines = [
        f"{'link':<10}{'model':<6}{'variant':<28}{'measured':>10}{'in-run':>9}{'ratio':>7}"
        f"{'link alone':>11}{'alone':>9}{'ratio':>7}"
    ]
    for r in result["validation"]:
        lines.append(
            f"{r['link']:<10}{r['model']:<6}{r['variant']:<28}{1e3 * r['measured_s']:>9.1f}m"
            f"{1e3 * r['in_run_s']:>8.1f}m{r['in_run_ratio']:>7.2f}{r['link_alone_ratio']:>11.2f}"
            f"{1e3 * r['alone_s']:>8.1f}m{r['alone_ratio']:>7.2f}"
        )
    lines.append("SIMULATED: priority's gain (step time of the other / priority's)")
    lines.append(
        f"{'profile':<12}{'ranks':>6}{'link':>9}{'comm/comp':>10}{'vs fifo':>9}{'vs ddp':>8}"
        f"{'tuned vs ddp':>13}"
    )
    for r in result["predictions"]:
        lines.append(
            f"{r['profile']:<12}{r['ranks']:>6}{r['link']:>9}{r['comm_s'] / r['compute_s']:>10.2f}"
            f"{r['fifo_s'] / r['priority_s']:>8.2f}x{r['ddp_s'] / r['priority_s']:>7.2f}x"
            f"{r['ddp_s'] / r['tuned_s']:>12.2f}x"
        )
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = result["validation"]
    for model, marker in (("vgg", "o"), ("mlp", "s")):
        mine = [r for r in rows if r["model"] == model]
        left.scatter(
            [1e3 * r["measured_s"] for r in mine],
            [1e3 * r["in_run_s"] for r in mine],
            marker=marker,
            label=model,
        )
    top = 1.1e3 * max([r["measured_s"] for r in rows] + [r["in_run_s"] for r in rows])
    line = np.array([0.0, top])
    left.plot(line, line, color="black", lw=0.8)
    left.fill_between(line, 0.9 * line, 1.1 * line, color="gray", alpha=0.2, label="±10%")
    left.set_xlabel("measured step (ms)")
    left.set_ylabel("simulated step from in-run layer times (ms)")
    left.set_title("validation: 2 ranks, shaped veth", fontsize=9)
    left.legend(fontsize=7)
    for link, style in zip(PREDICTION_LINKS, ("-", "--", ":"), strict=True):
        for name in PREDICTION_PROFILES:
            mine = [r for r in result["predictions"] if r["profile"] == name and r["link"] == link]
            right.plot(
                [r["ranks"] for r in mine],
                [r["ddp_s"] / r["tuned_s"] for r in mine],
                ls=style,
                color=f"C{PREDICTION_PROFILES.index(name)}",
                label=name if link == PREDICTION_LINKS[0] else None,
            )
    right.set_xscale("log", base=2)
    right.set_xticks(PREDICTION_RANKS, [str(w) for w in PREDICTION_RANKS])
    right.axhline(1.0, color="black", lw=0.8)
    right.set_xlabel("ranks (- 10, -- 25, : 100 Gbit/s)")
    right.set_ylabel("DDP step / tuned priority step")
    right.set_title("SIMULATED: tuned priority over DDP", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _validation_reading(rows: list[dict]) -> list[str]:
    """What the validation table says, from its figures."""
    median = float(np.median([r["in_run_ratio"] for r in rows]))
    plain = float(np.median([r["link_alone_ratio"] for r in rows]))
    chronica = [r for r in rows if POLICY[r["variant"]] in ("fifo", "priority")]
    torch_side = [r for r in rows if r not in chronica]
    swing = max(abs(r["alone_compute_s"] / r["in_run_compute_s"] - 1) for r in rows)
    links = list({(r["link"], r["model"]): r for r in rows}.values())

    def span(key: str, scale: float = 1.0, add: float = 0.0, digits: int = 2) -> str:
        values = [scale * r[key] + add for r in links]
        return f"{min(values):.{digits}f}–{max(values):.{digits}f}"

    def share(group: list[dict], key: str = "in_run_ratio") -> str:
        good = sum(abs(r[key] - 1) <= 0.1 for r in group)
        return f"{good} of {len(group)}"

    low = [r for r in rows if r["in_run_ratio"] < 0.9]
    high = [r for r in rows if r["in_run_ratio"] > 1.1]
    misses = "; ".join(
        f"{label}: "
        + (", ".join(f"{r['link']} {r['model']} {r['variant']}" for r in group) or "none")
        for label, group in (("more than 10% low", low), ("more than 10% high", high))
    )
    return [
        f"The median ratio simulated / measured is {median:.2f} ({plain:.2f} with the link "
        f"as all-reduces alone measure it). Within 10%: {share(torch_side)} for `no "
        f"overlap` and `DDP`, {share(chronica)} for chronica's variants; "
        f"{share(rows, 'link_alone_ratio')} without the two link terms. Those terms are "
        "measured, not fitted: beside compute the all-reduces took "
        f"{span('link_slowdown', add=1.0)}× as long as alone (gloo's thread waits for "
        "cores the ranks' compute holds), and a collective issued behind another paid "
        f"{span('queued_latency_s', 1e6, digits=0)} µs per hop against "
        f"{span('latency_s', 1e6, digits=0)} µs for a lone one on an idle link. In its own "
        "steps, `no overlap`'s all-reduce on the rank that did not wait took "
        f"{span('reduce_in_run')}× the all-reduce measured alone. Misses: {misses}. What "
        "the model leaves out: the shim's per-partition thread hand-offs (a Python thread "
        "issues each partition, another completes it; each wake-up can wait for a core), "
        "which a credit of one byte (`priority`: one partition in flight, the next issued "
        "once the previous one's completion has passed through those threads) puts on the "
        "critical path, where the model issues the next partition at once; the two ranks' "
        "drift (a collective also waits for the other rank's earlier delays); and the load "
        "of the other jobs on this machine, which changes between the link's measurement "
        "and the steps.",
        "",
        "The *alone* columns are why the in-run layer times are the main figure here: "
        "compute measured seconds before and after a variant, without communication, "
        f"differs from the compute inside its steps by up to {100 * swing:.0f}% on this "
        "shared machine, so a prediction from compute alone mostly measures the load of "
        "the moment. On a dedicated machine the two compute figures should agree.",
    ]


def _prediction_reading(rows: list[dict]) -> list[str]:
    """What the simulated predictions say, from their figures."""
    default = [r["ddp_s"] / r["priority_s"] for r in rows]
    tuned = [r["ddp_s"] / r["tuned_s"] for r in rows]
    best = max(rows, key=lambda r: r["ddp_s"] / r["tuned_s"])
    slow = [r["ddp_s"] / r["tuned_s"] for r in rows if r["link"] == PREDICTION_LINKS[0]]
    ratio = [r["comm_s"] / r["compute_s"] for r in rows if r["link"] == PREDICTION_LINKS[0]]
    return [
        "Reading the simulated figures: with the shim's default 1 MiB partitions, "
        f"priority is {min(default):.2f}–{max(default):.2f}× DDP's speed: a ring "
        "all-reduce pays `2(W−1)·α` per collective, and hundreds of 1 MiB partitions pay "
        "it hundreds of times (0.6 ms each at 64 ranks). Tuned (the grid's best: larger "
        f"partitions), priority is {min(tuned):.2f}–{max(tuned):.2f}× DDP, at "
        f"best {max(tuned):.2f}× ({best['profile']}, {best['ranks']} ranks, "
        f"{best['link']}). Gains need communication comparable to compute: at "
        f"{PREDICTION_LINKS[0]} these models' all-reduce is {min(ratio):.0f}–"
        f"{max(ratio):.0f}× their compute and no order hides it ({min(slow):.2f}–"
        f"{max(slow):.2f}× DDP). Over FIFO (one "
        "all-reduce per tensor, no fusion) the tuned gain is larger, because FIFO also "
        "pays the per-collective latency. These are simulations of an idealised cluster "
        "(one flat ring, no stragglers, no CPU cost of scheduling); the validation above "
        "shows how far such a model is from one real, busy machine.",
    ]


def render_markdown(result: dict, img_dir: Path) -> str:
    """The ``## Gradient-communication simulator`` section of docs/benchmarks.md."""
    img_dir.mkdir(parents=True, exist_ok=True)
    _plot(result, img_dir / "grad_sim.png")
    rows = result["validation"]
    table = [
        f"| {r['link']} | {r['model']} | {r['variant']} | {1e3 * r['measured_s']:.1f} | "
        f"{1e3 * r['in_run_s']:.1f} | {100 * (r['in_run_ratio'] - 1):+.1f}% | "
        f"{'yes' if abs(r['in_run_ratio'] - 1) <= 0.1 else '**no**'} | "
        f"{100 * (r['link_alone_ratio'] - 1):+.1f}% | {1e3 * r['in_run_compute_s']:.1f} | "
        f"{1e3 * r['alone_compute_s']:.1f} | "
        f"{100 * (r['alone_ratio'] - 1):+.0f}% | {100 * (r['contended_ratio'] - 1):+.0f}% |"
        for r in rows
    ]
    links = {
        (r["link"], r["model"]): f"| {r['link']} | {r['model']} | "
        f"{8 * r['bandwidth'] / 1e6:.0f} Mbit/s | {1e6 * r['latency_s']:.0f} µs | "
        f"{1e6 * r['queued_latency_s']:.0f} µs | {r['slowdown']:.2f} | "
        f"{r['link_slowdown']:.2f} | {r['reduce_in_run']:.2f} |"
        for r in rows
    }
    within = sum(abs(r["in_run_ratio"] - 1) <= 0.1 for r in rows)
    worst = max(rows, key=lambda r: abs(r["in_run_ratio"] - 1))
    cells: dict[tuple[str, str], dict[int, dict]] = {}
    for r in result["predictions"]:
        cells.setdefault((r["profile"], r["link"]), {})[r["ranks"]] = r

    def gain_table(key: str) -> list[str]:
        lines = [
            "| profile | link | comm / compute | "
            + " | ".join(f"W={w}: vs fifo / vs ddp" for w in PREDICTION_RANKS)
            + " |",
            "|---|---|---:|" + "---:|" * len(PREDICTION_RANKS),
        ]
        for (profile, link), by_w in cells.items():
            first = by_w[PREDICTION_RANKS[0]]
            row = [
                f"{by_w[w]['fifo_s'] / by_w[w][key]:.2f}× / {by_w[w]['ddp_s'] / by_w[w][key]:.2f}×"
                for w in PREDICTION_RANKS
            ]
            ratio = first["comm_s"] / first["compute_s"]
            lines.append(f"| {profile} | {link} | {ratio:.1f} | " + " | ".join(row) + " |")
        return lines

    tuned = sorted(
        {f"{r['tuned_partition'] >> 20}/{r['tuned_credit'] >> 20}" for r in result["predictions"]}
    )
    machine = result["machine"]
    load = result.get("load_average", [float("nan")] * 2)
    return "\n".join(
        [
            "## Gradient-communication simulator",
            "",
            "`chronica simulate gradients` ([docs/simulate.md](simulate.md)) against step "
            "times measured here, then its predictions for larger clusters. Validation: two "
            "torch ranks (gloo, one compute thread each) in two network namespaces joined by "
            "a `tc`-shaped veth pair (MTU 9000), on `benchmarks/gradsched.py`'s models and "
            "variants. In every repeat, in one process pair: all-reduce times at four sizes "
            "(the link's bandwidth from the two largest, its latency on an idle link from one "
            f"element), all gradients as one all-reduce against {QUEUED_PARTS} issued back "
            "to back without waiting (the latency a queued collective pays), compute alone "
            "and beside back-to-back all-reduces (compute's slowdown beside communication, "
            "and the all-reduces' own slowdown beside compute: the link's contention), "
            f"then each variant's steps (median of the last {result['steps']} of "
            f"{2 * result['steps']}) with hooks timing every layer's forward (after any wait "
            "for its parameters) and backward in those same steps, between compute-only "
            "runs; both ranks' layer times are gathered and the slower kept per layer and "
            "step, the layers' medians scaled to the slower rank's median step (a loaded "
            "machine puts a delay in some layer of most steps, which per-layer medians "
            "drop). `no overlap`'s flatten and copy back are timed in its steps with its "
            "optimizer. The simulator predicts each step from **in-run** layer times (the "
            "main figure) on the fitted link, whose collectives pay the queued latency when "
            "issued behind another and advance at the speed measured beside compute while "
            "the rank computes (`link_slowdown`); *link as measured alone* drops those two "
            "link terms; *alone* uses the compute-only runs around the variant, with and "
            "without both measured slowdowns. Nothing is fitted to the step times; each "
            "ratio is the median over "
            f"{result['repeats']} repeats of the per-repeat ratio.",
            "",
            "| link | model | fitted bandwidth | latency, idle link (per hop) | latency, "
            "queued (per hop) | compute's slowdown beside all-reduces | link's slowdown "
            "beside compute | no overlap's all-reduce in its steps / alone |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *links.values(),
            "",
            "| link | model | variant | measured (ms) | simulated, in-run (ms) | error (median "
            "per repeat) | within 10% | error, link as measured alone | in-run compute (ms) | "
            "alone compute (ms) | error, alone | error, alone + both slowdowns |",
            "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
            *table,
            "",
            f"{within} of {len(rows)} within 10% from in-run layer times; the largest error "
            f"{100 * (worst['in_run_ratio'] - 1):+.1f}% ({worst['link']}, {worst['model']}, "
            f"{worst['variant']}).",
            "",
            *_validation_reading(rows),
            "",
            "![validation and predictions](img/grad_sim.png)",
            "",
            "**Simulated predictions** (no measurement): VGG-16, BERT and GPT-2 layer "
            "profiles (`chronica.sim.grad_profiles`: the real parameter tensors, fp32 "
            "gradients; compute from FLOPs at 100 TFLOP/s sustained, backward twice the "
            "forward, Adam's update memory-bound at 2 TB/s), ring all-reduce with 5 µs per "
            "hop, no CPU contention. `priority` is the torch shim's defaults (1 MiB "
            "partitions, 4 MiB credit); `tuned` the best partition / credit of "
            f"{len(TUNING_GRID)} (partitions of {TUNING_GRID[0][0] >> 20}–"
            f"{TUNING_GRID[-1][0] >> 20} MiB, credit one or four partitions): the "
            "best an online search over that grid (such as the shim's auto-tuner) could "
            "find; `fifo` "
            "one all-reduce per tensor; `ddp` 25 MiB buckets after a 1 MiB first one. "
            "Gains are the other policy's step time over priority's (above 1: priority "
            "is faster).",
            "",
            "**priority with the shim's defaults** (speed-up of priority over fifo / over "
            "ddp; comm / compute: one all-reduce of all gradients at W=8 over forward + "
            "backward + update):",
            "",
            *gain_table("priority_s"),
            "",
            "**priority, tuned** (the best partition / credit of the grid per case; chosen: "
            f"{', '.join(tuned)} MiB):",
            "",
            *gain_table("tuned_s"),
            "",
            *_prediction_reading(result["predictions"]),
            "",
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} cores shared "
            f"with other work (load average {load[0]:.1f} when the measurement started, "
            f"{load[1]:.1f} when it ended), torch {machine.get('torch')}, "
            f"{machine.get('date_utc')}. Reproduce: `{result['command']}`.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", nargs="+", choices=LINKS, help="shaped links to measure")
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the raw result here")
    args = parser.parse_args()
    if args.worker:
        _worker(json.loads(args.worker))
        return
    result = run(args.quick, args.links)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(format_table(result))


if __name__ == "__main__":
    main()
