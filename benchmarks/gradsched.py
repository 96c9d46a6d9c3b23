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
small adjacent ones are fused up to that size; ``DDP again`` is a second default DDP, the
run's own noise. Every variant keeps its own model for the run, and each rank is pinned to a
core of its own. Warm-up rounds run a block of every variant (through chronica auto's
decision and auto-tuned's search); each measured round then runs every variant's block next
to a default DDP block, in pairs of alternating order rotated every round. A ratio is the
median over rounds of a block over its neighbouring DDP block, with a 95% bootstrap
interval. Beside them: ``compute`` (no communication) and ``comm`` (one all-reduce of all
gradient bytes). Needs root for the namespaces; without it, runs on loopback only and says
so.

Run alone: ``sudo python -m benchmarks.gradsched [--quick] [--links loopback
fast] [--model mlp670k vgg]``. Without sudo, a user namespace of its own gives the same
namespaces and ``tc`` shaping (same kernel qdisc): ``unshare -rnm sh -c 'mount -t tmpfs none
/run && mkdir /run/netns && python -m benchmarks.gradsched --target auto'``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.grad_models import (
    AUTO_BATCH,
    AUTO_COMPUTE_MS,
    GRID,
    MODELS,
    OUTSIDE,
    VARIANTS,
    input_shape,
    knobs_for,
)
from benchmarks.grad_models import model as _model
from benchmarks.gradsched_paired import BOOTSTRAP, paired_to_best
from benchmarks.gradsched_paired import interval as _interval
from chronica.comm.ports import free_port
from chronica.runtime.auto import MEASURE_STEPS
from chronica.runtime.gradients import PLAN_STEPS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NETNS = HERE / "netns.sh"
ADDRS = ("10.77.0.1", "10.77.0.2")

__all__ = [
    "auto_rows",
    "auto_table",
    "format_table",
    "record_auto_target",
    "render_markdown",
    "run",
]

# The auto target (issue 33): chronica auto against DDP, DDP again (the noise) and every
# setting it searches, fixed, on shaped links, each variant's block once per round.
AUTO_TARGET = ("DDP again", "chronica auto", *GRID)
AUTO_LINKS = ("1gbit", "200mbit", "100mbit", "50mbit")
DDP_ARGS: dict[str, dict[str, Any]] = {
    "DDP": {},
    "DDP static_graph": {"static_graph": True},
    "DDP bucket_cap_mb=2": {"bucket_cap_mb": 2},
    "DDP bucket_cap_mb=0.5": {"bucket_cap_mb": 0.5},
    "DDP again": {},  # a second default DDP: the run's noise, measured like any variant
}
# chronica auto's shortest trial where it searches: the first step, then windows of
# MEASURE_STEPS + 1 steps: one bucketed, the search's 16 (3 settings twice, then the best 2
# twice, bucketed between) and its survivor's 2 beside 2 bucketed ones; plus the scheduled
# engine's re-plan from the medians of the setting's first PLAN_STEPS steps.
AUTO_WARM = 1 + (1 + 16 + 4) * (MEASURE_STEPS + 1) + PLAN_STEPS
# Steps per block as a multiple of the run's, so that every model's blocks last about as long
# (mlp670k's steps are about 5x shorter than vgg's): a block of a few short steps is mostly
# the machine's noise.
BLOCK_SCALE = {"mlp670k": 5}


def _warm_until_decided(runners: dict, chosen: list[str], steps: int, result: dict) -> None:
    """The auto target's warm-up: a block of every variant, then chronica auto's blocks
    until its trial settled (the ranks agree on it, so both run as many blocks), at most its
    ``budget_steps`` and two blocks more (how many in ``result["auto_warm_blocks"]``), then
    ``PLAN_STEPS`` steps of every scheduled variant, auto included."""
    for variant in chosen:
        runners[variant][0](steps + 1)
    if "chronica auto" not in runners:
        return
    block, opt = runners["chronica auto"]
    blocks = 1  # the trial exists once the first step ran
    most = 2 + -(-opt.trial.budget_steps // (steps + 1)) if opt.trial is not None else 2
    while opt.trial is not None and not opt.trial.settled and blocks < most:
        block(steps + 1)
        blocks += 1
    result["auto_warm_blocks"] = blocks
    # A scheduled engine re-plans its order from the medians of the setting's first
    # PLAN_STEPS steps (fixed: from its start; auto: within PLAN_STEPS steps of settling):
    # the rounds measure the order it then keeps.
    for _ in range(-(-PLAN_STEPS // (steps + 1))):
        for variant in chosen:
            if (VARIANTS[variant] or {}).get("mode") in ("scheduled", "auto"):
                runners[variant][0](steps + 1)


PROBE_ROUNDS = 4  # the simulator's probe: rounds of a DDP block and a best-setting block
SIM_DEFAULT = "scheduled 1 MiB"  # mode="scheduled" with the shim's default knobs


def simulated_setting(kept: str, net) -> str:
    """The fixed setting the simulator predicts: the one of ``GRID`` chronica auto kept
    (``kept``: its ``str(opt.setting)``), else (it kept bucketed) ``SIM_DEFAULT``. Neither
    choice looks at the rounds the prediction is compared with: the lowest of the rounds'
    noisy ratios is the luckiest of them, below its setting's true figure.

    Args:
        kept: the setting chronica auto kept, as ``str(Candidate)``.
        net: the model (the settings' partitions are capped at its gradients' bytes).

    Example::

        >>> simulated_setting("bucketed", net)   # doctest: +SKIP
        'scheduled 1 MiB'
    """
    from chronica.runtime.auto import Candidate

    for variant in GRID:
        knobs = knobs_for(variant, net)
        if str(Candidate("scheduled", knobs["partition_bytes"], knobs["credit_bytes"])) == kept:
            return variant
    return SIM_DEFAULT


def steady_steps(block: dict) -> dict:
    """One probed block's per-step records (``forward``, ``backward``: one row of layer
    times per step; ``update``: the optimizer's seconds) without its first step, which
    follows the previous block's ``synchronize()``: nothing in flight, so its forward
    waits for nothing, unlike the steps the rounds' step-to-step times hold.

    Args:
        block: lists of one entry per step of the block, by key.

    Example::

        >>> steady_steps({"forward": [[3.0], [1.0]], "update": [0.5, 0.1]})
        {'forward': [[1.0]], 'update': [0.1]}
    """
    return {key: list(rows)[1:] for key, rows in block.items()}


def probe_pairs(best: str, rounds: int) -> list[tuple[str, str]]:
    """The probe's blocks: ``rounds`` pairs of a DDP block and a ``best`` one, the pair's
    order alternating, as the rounds run them (each ratio over the DDP block beside it).

    Args:
        best: the setting probed beside DDP.
        rounds: pairs of blocks.

    Example::

        >>> probe_pairs("scheduled 1 MiB", 2)
        [('DDP', 'scheduled 1 MiB'), ('scheduled 1 MiB', 'DDP')]
    """
    return [("DDP", best) if r % 2 == 0 else (best, "DDP") for r in range(rounds)]


def _probe_rounds(runners: dict, best: str, steps: int) -> tuple[dict, float]:
    """Layer times of ``best`` and of DDP in blocks of the rounds' own runners (the models,
    optimizers and warm state the rounds measured), ``PROBE_ROUNDS`` interleaved pairs:
    per variant, both ranks' steady steps as ``_slowest`` keeps them, with the median of
    its blocks' step times; and the median over pairs of best's block over DDP's."""
    import torch.distributed as dist

    from benchmarks.grad_sim_validation import _slowest

    records: dict[str, list[dict]] = {"DDP": [], best: []}
    seconds: dict[str, list[float]] = {"DDP": [], best: []}
    for pair in probe_pairs(best, PROBE_ROUNDS):
        for variant in pair:
            series, record = runners[variant][0](steps + 1, probed=True)
            records[variant].append(record)
            seconds[variant].append(float(np.median(series[0])))
    runs = {}
    for variant, blocks in records.items():
        steady = [
            steady_steps({k: b[k] for k in ("forward", "backward", "update")}) for b in blocks
        ]
        mine: dict[str, Any] = {
            key: np.asarray([row for b in steady for row in b[key]])
            for key in ("forward", "backward", "update")
        }
        mine |= {"reduce": np.asarray([]), "step_s": float(np.median(seconds[variant]))}
        ranks: list = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        layout = {k: blocks[0][k] for k in ("names", "tensor_bytes")}
        runs[variant] = {**layout, **_slowest(ranks)}
    ratio = float(np.median(np.asarray(seconds[best]) / np.asarray(seconds["DDP"])))
    return runs, ratio


def _predict(name: str, result: dict, steps: int, batch: int, runners: dict) -> dict:
    """The simulator's scheduled/DDP step-time ratio for a setting of ``GRID`` chosen
    without the rounds (``simulated_setting``: the same on every rank, as auto's decision
    is), as ``benchmarks.grad_sim_validation`` predicts it:
    each variant's in-run layer times (probed in blocks of the rounds' own runners,
    interleaved: ``_probe_rounds``), compute alone for the time outside the layers and the
    shim's optimizer, on the link fitted from all-reduce times measured here and now."""
    import torch.distributed as dist

    from benchmarks.grad_sim_validation import (
        ALLREDUCE_SIZES,
        _allreduce_times,
        _queued_times,
        _run_steps,
        link_fit,
        probe_steps,
        sim_layers,
    )
    from chronica.sim.gradients import Link, Policy, simulate_step

    kept = result["stats"].get("chronica auto", {}).get("setting", "")
    best = simulated_setting(kept, _model(name))
    if best not in runners:  # a run of a few variants (--only)
        best = next(v for v in GRID if v in runners)
    runs, probed = _probe_rounds(runners, best, steps)
    alone = _run_steps(name, None, probe_steps(steps), batch=batch)
    numel = sum(sum(b) for b in alone["tensor_bytes"]) // 4
    sizes = [*ALLREDUCE_SIZES, numel]
    dist.barrier()
    link = {"numel": sizes, "seconds": _allreduce_times(sizes, steps)}
    link["queued"] = _queued_times(numel, steps)
    bandwidth, latency, queued = link_fit(link)
    fitted = Link(bandwidth, latency, 2, queued)
    part = min((VARIANTS[best] or {})["partition_bytes"], 4 * numel)
    ddp = simulate_step(sim_layers([runs["DDP"]], None, alone["overhead_s"]), fitted, Policy("ddp"))
    scheduled = simulate_step(
        sim_layers([runs[best]], alone["update_s"], alone["overhead_s"]),
        fitted,
        Policy("priority", part, 4 * part, label=best),
    )
    return {
        "variant": best,
        "predicted": scheduled.step_s / ddp.step_s,
        "sim_ddp_s": ddp.step_s,
        "sim_scheduled_s": scheduled.step_s,
        "probed": probed,
        "probe_blocks": PROBE_ROUNDS,
        "bandwidth": bandwidth,
        "latency_s": latency,
        "queued_latency_s": queued,
    }


# -- worker side (runs inside a namespace) -------------------------------------------------


# Measured per step on rank 0: wall seconds ("variants"), CPU seconds of the process (all its
# threads, gloo's included), CPU seconds of the training thread, minor page faults.
QUANTITIES = ("variants", "cpu", "thread", "faults")


def _clocks() -> tuple[float, float, float, float]:
    """Now, in each of ``QUANTITIES``."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return time.perf_counter(), time.process_time(), time.thread_time(), float(faults)


def _pin(rank: int) -> int | None:
    """Pin this process, and every thread it starts afterwards (gloo's included), to a core
    of its own, so that the ranks never share a core nor migrate between blocks; ``None``
    where fewer than two cores are available."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    return cpus[rank % len(cpus)]


def _worker(args: argparse.Namespace) -> None:
    core = _pin(args.rank)  # before torch starts any thread

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks.grad_sim_validation import _Probe
    from chronica.runtime.dispatcher import AutoTuner
    from chronica.torch.distributed import ScheduledOptimizer

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.addr}:{args.port}",
        rank=args.rank,
        world_size=2,
    )
    warm, repeats = 4, args.repeats  # measured rounds
    out: dict = {}
    for name in args.models.split(","):
        batch = (AUTO_BATCH if args.rounds_of_all else MODELS)[name]
        steps = args.steps * BLOCK_SCALE.get(name, 1)  # steps per block
        g = torch.Generator().manual_seed(args.rank)
        x = torch.randn(*input_shape(name, batch), generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        loss_fn = torch.nn.CrossEntropyLoss()

        def make(variant: str, x=x, y=y, loss_fn=loss_fn, name=name):
            """A ``block(count) -> (seconds, cpu_seconds)`` stepping ``variant``'s own model,
            and the optimizer (a ScheduledOptimizer is synchronized after each block: no
            variant may have collectives in flight while another one steps). ``block(count,
            probed=True)`` also times every layer of those steps (``_Probe``, attached to
            the model at its first probed block) and returns them beside the series."""
            torch.manual_seed(0)
            model = bare = _model(name)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            knobs = knobs_for(variant, model)
            if variant in DDP_ARGS:
                model = DistributedDataParallel(model, **DDP_ARGS[variant])
            elif knobs:
                opt = ScheduledOptimizer(model, opt, **knobs)
            params = list(model.parameters())
            probes: list[_Probe] = []

            def block(count: int, probed: bool = False):
                """Step to step, each of ``QUANTITIES`` (and, ``probed``, the layers' names,
                bytes and times and the optimizer's seconds, of every step)."""
                if probed and not probes:
                    probes.append(_Probe(bare))
                probe = probes[0] if probed else None
                series: list[list[float]] = [[] for _ in QUANTITIES]
                update: list[float] = []
                prev = None
                for _ in range(count):
                    opt.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss_end = time.perf_counter()
                    loss.backward()
                    if probe is not None:
                        probe.step(loss_end)
                    if variant == "no overlap":
                        flat = torch.cat([p.grad.view(-1) for p in params])
                        dist.all_reduce(flat)
                        flat.div_(2)
                        sizes = [p.numel() for p in params]
                        for p, part in zip(params, flat.split(sizes), strict=True):
                            p.grad.view(-1).copy_(part)
                    before = time.perf_counter()
                    opt.step()
                    now = _clocks()
                    update.append(now[0] - before)
                    if prev is not None:
                        for kept, a, b in zip(series, now, prev, strict=True):
                            kept.append(a - b)
                    prev = now
                if isinstance(opt, ScheduledOptimizer):
                    opt.synchronize()
                if probe is None:
                    return series
                layers = {"forward": probe.forward[-count:], "backward": probe.backward[-count:]}
                return series, {**probe.layout(), **layers, "update": update}

            return block, opt

        def warm_steps(variant: str, name=name) -> int:
            """Steps before ``variant`` is measured: chronica auto's decision, auto-tuned's
            whole search and as many steps again, a scheduled engine's plan from the
            medians of its first ``PLAN_STEPS`` steps."""
            if variant == "auto-tuned":
                grid = AutoTuner.default_grid(sum(4 * p.numel() for p in _model(name).parameters()))
                return (len(grid.candidates) + grid.finalists) * grid.steps_per_trial + 2 * warm
            mode = (VARIANTS[variant] or {}).get("mode")
            replans = PLAN_STEPS if mode in ("scheduled", "auto") else 0  # the order's
            return warm + replans + (AUTO_WARM if mode == "auto" else 0)

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

        chosen = (
            args.variants.split(",") if args.variants else [v for v in VARIANTS if v not in OUTSIDE]
        )
        chosen = ["DDP", *(v for v in chosen if v != "DDP")]  # every ratio's reference
        # Per measured round and variant: its block and the DDP block run next to it.
        result: dict = {q: {v: [] for v in chosen} for q in QUANTITIES}
        result["ddp"] = {q: {v: [] for v in chosen[1:]} for q in QUANTITIES}
        result["stats"] = {}
        result["core"] = core
        result |= {"compute": [], "comm": []}

        def bounds(result: dict = result, steps: int = steps) -> None:
            compute = float(np.median(compute_steps(warm + steps)[warm:]))
            dist.barrier()
            comm = float(np.median(comm_steps(warm + steps)[warm:]))
            result["compute"].append(compute)
            result["comm"].append(comm)

        bounds()
        runners = {v: make(v) for v in chosen}
        if args.rounds_of_all:
            _warm_until_decided(runners, chosen, steps, result)
        else:
            warm_rounds = -(-max(warm_steps(v) for v in chosen) // steps) + 1
            for r in range(warm_rounds):
                for variant in chosen[r % len(chosen) :] + chosen[: r % len(chosen)]:
                    runners[variant][0](steps + 1)
        others = chosen[1:]
        for r in range(repeats):
            if args.rounds_of_all:
                # Every variant's block once, DDP's among them, the order rotated every
                # round; each ratio is over the same round's DDP block.
                order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
                medians = {
                    v: [float(np.median(m)) for m in runners[v][0](steps + 1)] for v in order
                }
                for variant in others:
                    for q, mine, ddp in zip(
                        QUANTITIES, medians[variant], medians["DDP"], strict=True
                    ):
                        result[q][variant].append(mine)
                        result["ddp"][q][variant].append(ddp)
                for q, ddp in zip(QUANTITIES, medians["DDP"], strict=True):
                    result[q]["DDP"].append(ddp)
                continue
            # Each variant's block next to a DDP block of its own, in pairs whose order
            # alternates and whose sequence rotates every round: the machine's drift between
            # two neighbouring blocks is all a ratio sees, and it favours neither side.
            for k, variant in enumerate(others[r % len(others) :] + others[: r % len(others)]):
                pair = ("DDP", variant) if (r + k) % 2 == 0 else (variant, "DDP")
                medians = {v: [float(np.median(m)) for m in runners[v][0](steps + 1)] for v in pair}
                for q, mine, ddp in zip(QUANTITIES, medians[variant], medians["DDP"], strict=True):
                    result[q][variant].append(mine)
                    result["ddp"][q][variant].append(ddp)
                    result[q]["DDP"].append(ddp)
            if r == repeats // 2:
                bounds()
        for variant, (_, opt) in runners.items():
            if isinstance(opt, ScheduledOptimizer):
                exposure = opt.stats()
                result["stats"][variant] = {
                    "mode": exposure.mode,
                    "decision": exposure.decision,
                    "verdict": exposure.verdict,
                    "saving_bound": exposure.saving_bound,
                    "setting": str(opt.setting),
                }
        if args.rounds_of_all:  # probes the runners as the rounds left them
            result["sim"] = _predict(name, result, steps, batch, runners)
        for _, opt in runners.values():
            if isinstance(opt, ScheduledOptimizer):
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
    default_malloc: bool = False,
    rounds_of_all: bool = False,
) -> dict:
    """Run both ranks (in the namespaces if ``use_netns``) and return rank 0's report;
    ``rounds_of_all``: the auto target's rounds (every variant once per round)."""
    port = 29400 if use_netns else free_port()
    addr = ADDRS[0] if use_netns else "127.0.0.1"
    env = {**({} if default_malloc else FIXED_HEAP), **os.environ}
    env |= {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = []
        for rank in range(2):
            cmd = [sys.executable, "-m", "benchmarks.gradsched", "--worker", f"--rank={rank}"]
            cmd += [f"--addr={addr}", f"--port={port}", f"--out={out}"]
            cmd += [f"--steps={steps}", f"--repeats={repeats}", f"--models={','.join(models)}"]
            cmd += [f"--variants={','.join(variants)}"] + ["--rounds-of-all"] * rounds_of_all
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


LINKS = ("loopback", "fast", "1gbit", "400mbit", "200mbit", "100mbit", "50mbit")
# Every variant lives in the same process, so with glibc's defaults the pages a variant's
# step faults in depend on where the *other* variants' memory lies (the heap's top is given
# back to the kernel and faulted in again: 0 to 6,000 faults per vgg step, changing from run
# to run for the same code). A heap that is never trimmed gives every variant its own cost.
FIXED_HEAP = {"MALLOC_TRIM_THRESHOLD_": str(1 << 31), "MALLOC_MMAP_THRESHOLD_": str(1 << 30)}
FAST_MODELS = ("mlp670k", "vgg")  # where scheduling must cost no more than DDP
SHAPED_MODELS = ("vgg", "mlp")  # where communication matters


def run(
    quick: bool,
    links: list[str] | None = None,
    models: list[str] | None = None,
    only: list[str] | None = None,
    rounds: int | None = None,
    block: int | None = None,
    default_malloc: bool = False,
    target: str | None = None,
) -> dict:
    """Measure every variant (or ``only`` those, always beside DDP) on every link (``links``:
    a subset of ``LINKS``; ``loopback`` is 127.0.0.1 without namespaces, ``fast`` the
    unshaped veth) for ``models`` (default: ``FAST_MODELS`` on loopback and the unshaped
    veth, ``SHAPED_MODELS`` on shaped links), in ``rounds`` measured rounds of blocks of
    ``block`` steps (defaults by mode), with ``FIXED_HEAP`` unless ``default_malloc``;
    JSON-serialisable. ``target="auto"``: the auto target instead (``AUTO_TARGET`` on
    ``AUTO_LINKS`` for ``SHAPED_MODELS`` unless told otherwise, every variant's block once
    per round, the simulator's prediction per link and model)."""
    from benchmarks.common import machine_info

    auto = target == "auto"
    if auto:
        links = links or list(AUTO_LINKS)
        models = models or list(SHAPED_MODELS)
        only = only or list(AUTO_TARGET)
    # 400 Mbit/s puts vgg's communication near its computation on this class of machine.
    # Quick mode (part of `chronica bench --quick`, under 5 minutes for every benchmark on 2
    # cores) runs one link (the shaped 400 Mbit/s one with namespaces, else loopback) and
    # the vgg model only.
    names = links or (["400mbit"] if quick else list(LINKS))
    unknown = sorted(
        set(names) - set(LINKS) | set(models or ()) - set(MODELS) | set(only or ()) - set(VARIANTS)
    )
    if unknown:
        raise ValueError(
            f"{unknown} are not among the links {LINKS}, models {list(MODELS)} or variants "
            f"{list(VARIANTS)}"
        )
    steps, repeats = (4, 2) if quick else (3, 4) if auto else (6, 20)  # block steps, rounds
    steps, repeats = (block or steps + 1) - 1, rounds or repeats
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
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
            measured = _pair(
                rate, steps, repeats, netns, chosen, tuple(only or ()), default_malloc, auto
            )
        finally:
            if netns:
                _netns("down")
        label = {"loopback": "loopback", "fast": "unshaped veth"}.get(name, name)
        measured_links.append({"link": label, "rate": rate, "models": measured})
    return {
        "target": target,
        "machine": machine_info(),
        "load_average": [load_before, os.getloadavg()],
        "started_utc": started,
        "quick": quick,
        "steps": steps,
        "repeats": repeats,
        "command": "sudo python -m benchmarks.gradsched"
        + (f" --target {target}" if target else "")
        + (" --quick" * quick)
        + (f" --links {' '.join(links)}" if links and not auto else "")
        + (f" --model {' '.join(models)}" if models and not auto else "")
        + "".join(f" --only '{v}'" for v in (only or ()) if not auto)
        + (f" --rounds {rounds}" if rounds else "")
        + (f" --block {block}" if block else "")
        + (" --default-malloc" if default_malloc else ""),
        "heap": "glibc defaults" if default_malloc else FIXED_HEAP,
        "links": measured_links,
    }


DDP_CAPS = ("DDP", "DDP bucket_cap_mb=2", "DDP bucket_cap_mb=0.5")


def _summary(model: dict) -> dict:
    """Per variant: median block times, and the median over rounds of its block over the DDP
    block run next to it (step time, process CPU, training thread CPU) with a 95% bootstrap
    interval; ratios to DDP static_graph or *DDP tuned* (the DDP bucket size with the lowest
    median ratio) are those ratios' quotients, round by round."""
    paired = model["ddp"]

    def ratios(q: str, v: str) -> np.ndarray:
        if v == "DDP":
            return np.ones(len(next(iter(paired[q].values()))))
        return np.asarray(model[q][v]) / np.asarray(paired[q][v])

    names = list(model["variants"])
    step = {v: ratios("variants", v) for v in names}
    cpu = {v: ratios("cpu", v) for v in names}
    thread = {v: ratios("thread", v) for v in names}
    tuned = min((v for v in DDP_CAPS if v in step), key=lambda v: float(np.median(step[v])))
    compute, comm = np.asarray(model["compute"]), np.asarray(model["comm"])
    # measured a few times (before, amid, after the rounds): their medians
    bound = np.median(np.maximum(compute, comm))
    static = step.get("DDP static_graph")

    def against(ref: np.ndarray) -> dict[str, float]:
        return {v: float(np.median(r / ref)) for v, r in step.items()}

    return {
        "median": {v: float(np.median(model["variants"][v])) for v in names},
        "vs_ddp": {v: float(np.median(r)) for v, r in step.items()},
        "interval": {v: _interval(r) for v, r in step.items()},
        "cpu_vs_ddp": {v: float(np.median(r)) for v, r in cpu.items()},
        "cpu_interval": {v: _interval(r) for v, r in cpu.items()},
        "thread_vs_ddp": {v: float(np.median(r)) for v, r in thread.items()},
        "thread_interval": {v: _interval(r) for v, r in thread.items()},
        "faults": {v: float(np.median(model["faults"][v])) for v in names},
        "vs_static": against(static) if static is not None else {},
        "vs_tuned": against(step[tuned]),
        "tuned": tuned,
        "to_bound": {v: float(np.median(model["variants"][v]) / bound) for v in names},
        "compute": float(np.median(compute)),
        "comm": float(np.median(comm)),
        "bound": float(bound),
        "rounds": len(step["DDP"]),
    }


def _quotient_interval(auto: np.ndarray, best: np.ndarray | None) -> tuple[float, float]:
    """95% bootstrap interval of ``median(auto) / median(best)`` (per-round ratios to DDP;
    ``best`` ``None``: DDP itself, 1 every round), the rounds resampled together."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(auto), size=(BOOTSTRAP, len(auto)))
    top = np.median(auto[picks], axis=1)
    bottom = np.median(best[picks], axis=1) if best is not None else 1.0
    low, high = np.percentile(top / bottom, [2.5, 97.5])
    return float(low), float(high)


def _ci(s: dict, variant: str, key: str = "interval") -> str:
    low, high = s[key][variant]
    return f"[{low:.3f}, {high:.3f}]"


def format_table(result: dict) -> str:
    """Median iteration times (ms); time, CPU and training thread CPU over the neighbouring
    DDP block's, with 95% intervals; page faults per step; time to the bound."""
    head = (
        f"{'link':<14}{'model':<8}{'variant':<28}{'ms':>8}{'/DDP':>7}{'95% interval':>17}"
        f"{'cpu/DDP':>8}{'thr/DDP':>8}{'95% interval':>17}{'faults':>8}{'/bound':>8}"
    )
    lines = [head]
    for link in result["links"]:
        for name, model in link["models"].items():
            s = _summary(model)
            for variant, t in s["median"].items():
                lines.append(
                    f"{link['link']:<14}{name:<8}{variant:<28}{1e3 * t:>8.1f}"
                    f"{s['vs_ddp'][variant]:>7.3f}{_ci(s, variant):>17}"
                    f"{s['cpu_vs_ddp'][variant]:>8.3f}{s['thread_vs_ddp'][variant]:>8.3f}"
                    f"{_ci(s, variant, 'thread_interval'):>17}"
                    f"{s['faults'][variant]:>8.0f}{s['to_bound'][variant]:>8.2f}"
                )
            lines.append(
                f"{link['link']:<14}{name:<8}{'bound max(compute, comm)':<28}"
                f"{1e3 * s['bound']:>8.1f}   (compute {1e3 * s['compute']:.1f}, "
                f"comm {1e3 * s['comm']:.1f})"
            )
            for variant, st in model.get("stats", {}).items():
                lines.append(f"{'':<14}{name:<8}{variant}: {st['decision'] or st['verdict']}")
    return "\n".join(lines)


def _verdict(s: dict) -> str:
    """Whether ``chronica auto`` meets the 3% target, and whether the run can tell."""
    ratio, (low, high) = s["vs_ddp"]["chronica auto"], s["interval"]["chronica auto"]
    if high <= 1.03:
        return "met"
    if low > 1.03:
        return "missed"
    return ("met" if ratio <= 1.03 else "missed") + " (1.03 inside the interval)"


def _default_heap(result: dict) -> list[str]:
    """Why the heap is fixed, and the target table of a run with glibc's defaults if the
    result carries one (``default_heap``)."""
    if result.get("heap") == "glibc defaults":
        return ["The heap: glibc's defaults (`--default-malloc`).", ""]
    lines = [
        "The heap: every variant lives in the same process, so with glibc's defaults the "
        "pages a variant's step faults in depend on where the *other* variants' memory lies "
        "(glibc gives the heap's top back to the kernel and the next step faults it in "
        "again): between 0 and 6,000 page faults per vgg step, changing from run to run for "
        "the same code, worth up to 10% of a step's CPU. The runs above never trim the heap "
        f"(`{' '.join(f'{k}={v}' for k, v in FIXED_HEAP.items())}`, for every variant alike), "
        "so that each variant's cost is its own; [the gradient guide](gradients.md#pytorch) "
        "says what the torch shim does about it with glibc's defaults.",
        "",
    ]
    other = result.get("default_heap")
    if other:
        rows = [
            row
            for link in other["links"]
            for name, model in link["models"].items()
            for row in _target_rows(link, name, model)
        ]
        lines += [
            "The same target with glibc's defaults (`--default-malloc`), measured in the same "
            f"way just before (`{other['command']}`):",
            "",
            "| link | model | chronica auto / DDP | 95% interval | target | CPU / DDP's [95%] "
            "| / DDP static_graph | / DDP tuned | page faults per step, auto / DDP | what "
            "`chronica auto` decided (rank 0) |",
            "|---|---|---:|---|---|---:|---:|---:|---:|---|",
            *rows,
            "",
        ]
    return lines


def _target_rows(link: dict, name: str, model: dict) -> list[str]:
    """The target table's row for ``chronica auto`` on ``model`` (none if not measured)."""
    s = _summary(model)
    if "chronica auto" not in s["median"]:
        return []
    st = model.get("stats", {}).get("chronica auto", {})
    return [
        f"| {link['link']} | {name} | {s['vs_ddp']['chronica auto']:.3f} | "
        f"{_ci(s, 'chronica auto')} | {_verdict(s)} | "
        f"{s['cpu_vs_ddp']['chronica auto']:.3f} {_ci(s, 'chronica auto', 'cpu_interval')} | "
        f"{s['vs_static'].get('chronica auto', float('nan')):.3f} | "
        f"{s['vs_tuned']['chronica auto']:.3f} ({s['tuned']}) | "
        f"{s['faults']['chronica auto']:.0f} / {s['faults']['DDP']:.0f} | "
        f"{st.get('decision', '')} |"
    ]


def auto_rows(result: dict) -> list[dict]:
    """Per link and model of an auto-target run: chronica auto, DDP again (the noise) and
    the best fixed setting (DDP or one of ``GRID``) over DDP, auto over the best fixed one
    (round by round), the simulator's predicted ratio against the measured one, and
    whether each target is met."""
    rows = []
    for link in result["links"]:
        for name, model in link["models"].items():
            s = _summary(model)
            per_round = {
                v: np.asarray(model["variants"][v]) / np.asarray(model["ddp"]["variants"][v])
                for v in s["median"]
                if v != "DDP"
            }
            fixed = {"DDP": 1.0, **{v: s["vs_ddp"][v] for v in GRID if v in s["vs_ddp"]}}
            best = min(fixed, key=fixed.__getitem__)
            ratio = s["vs_ddp"]["chronica auto"]
            # auto over the best fixed setting: the quotient of their two figures (medians
            # over rounds against the same round's DDP block), with a 95% bootstrap interval
            # over the rounds (resampled together, so each round keeps its pairing)
            to_best = ratio / fixed[best]
            to_best_interval = _quotient_interval(
                per_round["chronica auto"], per_round.get(best) if best != "DDP" else None
            )
            # the page's figure: auto's block over the same round's block of the setting the
            # other rounds chose as best (benchmarks.gradsched_paired)
            blocks = {v: model["variants"][v] for v in fixed}
            paired = paired_to_best(
                model["variants"]["chronica auto"], blocks, model["variants"]["DDP"]
            )
            again, (low, high) = s["vs_ddp"]["DDP again"], s["interval"]["DDP again"]
            noise = max(abs(again - 1.0), high - 1.0, 1.0 - low)
            sim = model.get("sim") or {}
            measured_sim = s["vs_ddp"].get(sim.get("variant", ""), float("nan"))
            rows.append(
                {
                    "link": link["link"],
                    "model": name,
                    "ddp_ms": 1e3 * s["median"]["DDP"],
                    # the share of its core rank 0 got in DDP's steps: CPU over wall time
                    "core_share": float(np.median(model["cpu"]["DDP"]))
                    / float(np.median(model["variants"]["DDP"])),
                    "auto": ratio,
                    "auto_interval": s["interval"]["chronica auto"],
                    "again": again,
                    "again_interval": (low, high),
                    "noise": noise,
                    "best": best,
                    "best_ratio": fixed[best],
                    "fixed": fixed,
                    "to_best": to_best,
                    "to_best_interval": to_best_interval,
                    "speedup": 1.0 / ratio,
                    # the link's time for all the gradients (at the bandwidth fitted after
                    # the rounds) over DDP's step: every step sends them all, so no
                    # schedule's step can be shorter
                    "link_bound": model["param_bytes"] / sim["bandwidth"] / s["median"]["DDP"]
                    if sim.get("bandwidth") and model.get("param_bytes")
                    else float("nan"),
                    "paired": paired["ratio"],
                    "paired_interval": paired["interval"],
                    "paired_pick": paired["pick"],
                    "paired_picks": paired["picks"],
                    "within_3": paired["ratio"] <= 1.03,
                    "not_worse": ratio - 1.0 <= noise,
                    "sim_variant": sim.get("variant", ""),
                    "sim_predicted": sim.get("predicted", float("nan")),
                    "sim_measured": measured_sim,
                    "sim_interval": s["interval"].get(sim.get("variant", ""), (np.nan, np.nan)),
                    "sim_probed": sim.get("probed", float("nan")),
                    "sim_probe_steps": sim.get("probe_steps", 0),
                    "sim_probe_blocks": sim.get("probe_blocks", 0),
                    "sim_error": sim.get("predicted", float("nan")) / measured_sim - 1.0,
                    "decision": model.get("stats", {}).get("chronica auto", {}).get("decision", ""),
                    "setting": model.get("stats", {}).get("chronica auto", {}).get("setting", ""),
                    "warm_blocks": model.get("auto_warm_blocks", 0),
                    "rounds": s["rounds"],
                }
            )
    return rows


def auto_table(result: dict) -> str:
    """The auto target, one line per link and model."""
    head = (
        f"{'link':<9}{'model':<6}{'DDP ms':>8}{'auto':>7}{'again':>7}{'noise':>7}"
        f"{'best fixed':>20}{'paired':>8}{'auto/best':>10}{'x DDP':>7}{'sim':>7}{'meas':>7}"
        f"{'err':>7}"
        "  setting auto kept"
    )
    lines = [head]
    for r in auto_rows(result):
        lines.append(
            f"{r['link']:<9}{r['model']:<6}{r['ddp_ms']:>8.1f}{r['auto']:>7.3f}"
            f"{r['again']:>7.3f}{r['noise']:>7.3f}{r['best']:>14} {r['best_ratio']:.3f}"
            f"{r['paired']:>8.3f}{r['to_best']:>10.3f}{r['speedup']:>7.3f}{r['sim_predicted']:>7.3f}"
            f"{r['sim_measured']:>7.3f}{r['sim_error']:>+7.1%}  {r['setting']}"
        )
    return "\n".join(lines)


def _same_setting(row: dict) -> bool:
    """Whether chronica auto kept the best fixed setting itself (then auto / best fixed is the
    rounds' noise alone)."""
    best = row["best"]
    if best == "DDP":
        return row["setting"] == "bucketed"
    return row["setting"].startswith(best.replace("scheduled ", "scheduled (") + " partitions")


def _above_bound(rows: list[dict]) -> str:
    """Words for a measured speed-up above its link's bound: the bound rests on a fitted
    bandwidth, itself a measurement, so that reads as the fit's error, not the schedule's."""
    above = [r for r in rows if r["speedup"] > 1 / r["link_bound"]]
    if not above:
        return ""
    worst = max(r["speedup"] * r["link_bound"] for r in above)
    return (
        " (a measured speed-up above its bound: the bound rests on the bandwidth fitted from "
        f"all-reduces, which read the link up to {100 * (worst - 1):.1f}% slower than the "
        "rounds found it)"
    )


def _render_auto(result: dict) -> str:
    """The auto target's ``## `` section for docs/benchmarks.md."""
    rows = auto_rows(result)
    yes = {True: "yes", False: "**no**"}
    table = [
        "| link | model | DDP ms (rank 0's core share) | chronica auto / DDP [95%] | DDP again "
        "/ DDP [95%] | best fixed / DDP | auto / best fixed, paired [95%] (judged against) | "
        "within 3% | auto / best fixed, quotient of medians [95%] | faster than DDP | "
        "not worse than DDP beyond noise | setting auto kept |",
        "|---|---|---:|---|---|---|---:|---|---:|---:|---|---|",
    ]
    sim = [
        "| link | model | setting | predicted / DDP | measured / DDP [95%] | error | within 10% "
        "| the probed steps' own / DDP |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]
    fixed = [
        "| link | model | "
        + " | ".join(GRID)
        + " | the link's time for all gradients | most x DDP |",
        "|---|---|" + "---:|" * (len(GRID) + 2),
    ]
    for r in rows:
        lo, hi = r["auto_interval"]
        alo, ahi = r["again_interval"]
        blo, bhi = r["to_best_interval"]
        plo, phi = r["paired_interval"]
        judged = sorted(set(r["paired_picks"]), key=r["paired_picks"].index)
        slo, shi = r["sim_interval"]
        table.append(
            f"| {r['link']} | {r['model']} | {r['ddp_ms']:.1f} ({r['core_share']:.0%}) | "
            f"{r['auto']:.3f} [{lo:.3f}, "
            f"{hi:.3f}] | {r['again']:.3f} [{alo:.3f}, {ahi:.3f}] | {r['best_ratio']:.3f} "
            f"({r['best']}) | {r['paired']:.3f} [{plo:.3f}, {phi:.3f}] ({', '.join(judged)}) | "
            f"{yes[r['within_3']]}"
            f"{' (1.03 inside the interval)' if plo <= 1.03 <= phi else ''}"
            f"{' (auto kept that same setting)' if _same_setting(r) else ''} | "
            f"{r['to_best']:.3f} [{blo:.3f}, {bhi:.3f}] | "
            f"{r['speedup']:.2f}x | {yes[r['not_worse']]} (noise {r['noise']:.1%}) | "
            f"{r['setting']} |"
        )
        sim.append(
            f"| {r['link']} | {r['model']} | {r['sim_variant']} | {r['sim_predicted']:.3f} | "
            f"{r['sim_measured']:.3f} [{slo:.3f}, {shi:.3f}] | {r['sim_error']:+.1%} | "
            + yes[abs(r["sim_error"]) <= 0.10]
            + (" (the prediction inside the interval)" if slo <= r["sim_predicted"] <= shi else "")
            + f" | {r['sim_probed']:.3f} |"
        )
        fixed.append(
            f"| {r['link']} | {r['model']} | "
            + " | ".join(f"{r['fixed'].get(v, float('nan')):.3f}" for v in GRID)
            + f" | {r['link_bound']:.3f} | {1 / r['link_bound']:.3f}x |"
        )
    hundred = [r for r in rows if r["link"] == "100mbit"]
    shares = [r["core_share"] for r in rows]
    crowded = (
        [
            f"Rank 0 got {min(shares):.0%} to {max(shares):.0%} of its core in DDP's steps (its "
            "CPU time over its step time; the rest of the machine's load took the remainder). "
            "Where that share is small, a step's length depends on how the kernel shares the "
            "core as much as on the link: a setting whose threads wake more often can get more "
            "of the core and look faster than the link allows (a ratio far below what hiding "
            "the communication could give, e.g. on a link whose all-reduce is a small part of "
            "the step), and the search then sees the same noise; such ratios say little about "
            "scheduling.",
            "",
        ]
        if shares and min(shares) < 0.5 and not result.get("quiet")
        else []
    )
    machine = result["machine"]
    before, after = result.get("load_average", [[np.nan] * 3] * 2)
    decisions = [f"- {r['link']}, {r['model']}: {r['decision']}" for r in rows]
    return "\n".join(
        [
            '## Gradient scheduling: `mode="auto"` against the best fixed setting',
            "",
            "Two torch ranks (gloo, one compute thread each, each pinned to a core) in two "
            "network namespaces joined by a veth pair (MTU 9000) whose both ends are shaped "
            "with a `tc` token bucket (`benchmarks/netns.sh`) at 1 Gbit/s, 200, 100 and 50 "
            "Mbit/s; models `vgg` (a small conv net, 96% of its 1.1 M parameters in the "
            f"last layers, batch {AUTO_BATCH['vgg']}) and `mlp` (six 512x512 layers, batch "
            f"{AUTO_BATCH['mlp']}): per-rank batches whose compute (one core each) lasts "
            "about as long as the all-reduce of all their gradients at 100 Mbit/s, so that "
            "priority scheduling can hide most of one behind the other there (measured "
            "pinned to one core, one thread, the training thread's CPU time per forward, "
            "backward and SGD step, median of 10 steps: "
            f"vgg {AUTO_COMPUTE_MS['vgg']} ms against 372 ms for its 4,583,336 gradient bytes "
            f"at the 12.31 MB/s fitted at 100 Mbit/s, mlp {AUTO_COMPUTE_MS['mlp']} ms against "
            "514 ms for 6,324,264 bytes; `python -m benchmarks.grad_models` measures them); "
            "the link still bounds what any order can save (*most x DDP* below). Variants: "
            "default DDP; `DDP again` (a second default DDP: the run's noise); `chronica "
            "auto` (`ScheduledOptimizer` with its defaults: it searches the settings below "
            "against bucketed windows, then keeps one, deciding on step time with the extra "
            "CPU counted, as on any CPU-only run); and each setting it searches, fixed "
            '(`mode="scheduled"`, priority order, partitions of 256 KiB, 1 MiB, 4 MiB '
            "capped at all the gradients' bytes, credit four partitions). Warm-up: a block "
            "of every variant, then chronica auto's blocks until it decided (its whole "
            f"search is warm-up), then {PLAN_STEPS} more steps of every scheduled variant, "
            "auto included: each re-plans its order once from the medians of its setting's "
            f"first {PLAN_STEPS} steps and keeps it. Then {result['repeats']} rounds, each "
            "running every "
            f"variant's block of {result['steps'] + 1} steps once, in an order rotated every "
            "round; a block's time is the median of its step-to-step times, a ratio the "
            "median over rounds of a block over the same round's DDP block (95% bootstrap "
            "interval). *Best fixed* is the lowest of DDP and the fixed settings. *auto / "
            "best fixed, paired* (the figure the 3% target is judged on; chosen before the run "
            "that measured it): the median over rounds of chronica auto's block over the "
            "same round's block of the best fixed setting, with a 95% bootstrap interval "
            "(`benchmarks/gradsched_paired.py`). Paired, because two blocks of one round saw "
            "the same moment of the machine and their quotient cancels its drift, where a "
            "quotient of two medians against a noisy DDP block keeps it (one run read 1.089 "
            "so where auto kept the best setting itself, 1.003 paired). The best fixed "
            "setting a round is judged against is the one with the lowest median ratio to "
            "DDP over the *other* rounds (leave one round out; the settings it was are in "
            "brackets): the lowest of several noisy medians, chosen on the rounds it is then "
            "judged on, is the luckiest of them and lies below the best's true figure (the "
            "winner's curse), which makes 3% harder to meet than it is; choosing on half the "
            "rounds would judge on 3 or 4, and choosing on the warm-up on one block each, "
            "both noisier. The old figure, chronica auto's ratio over the best fixed "
            "setting's (a quotient of the two medians of the table, rounds resampled "
            "together), is kept beside it. *Noise*: how far DDP again lies from 1, or its "
            "interval's far end, whichever is larger.",
            "",
            *table,
            "",
            *crowded,
            "Every fixed setting over DDP, and the link's bound over DDP's step: all the "
            "gradients' bytes at the bandwidth fitted from all-reduces measured after the "
            "rounds (the simulator's link, below). Every step sends all of them, so no "
            "schedule's step can be shorter; *most x DDP* is the speed-up that leaves to any "
            "schedule:",
            "",
            *fixed,
            "",
            OUTSIDE_WORDS,
            "",
            "The targets: chronica auto within 3% of the best fixed setting on every link "
            f"({sum(r['within_3'] for r in rows)} of {len(rows)}); at least 1.15x faster than "
            "DDP at 100 Mbit/s ("
            + ", ".join(f"{r['model']} {r['speedup']:.2f}x" for r in hundred)
            + "; the link's bound allows at most "
            + ", ".join(f"{r['model']} {1 / r['link_bound']:.3f}x" for r in hundred)
            + _above_bound(hundred)
            + "); never worse than DDP by more than the noise "
            f"({sum(r['not_worse'] for r in rows)} of {len(rows)}).",
            "",
            "What chronica auto decided (its `stats().decision`, the line rank 0 printed):",
            "",
            *decisions,
            "",
            "The simulator (`chronica.sim.gradients`, as `benchmarks/grad_sim_validation.py` "
            "drives it) predicts a fixed setting's step time over DDP's: the setting chronica "
            "auto kept, or where it kept bucketed the shim's default (1 MiB partitions, 4 MiB "
            "credit), either chosen without the rounds the prediction is compared with (the "
            "lowest of the rounds' three noisy ratios, the setting an earlier version "
            "predicted, is the luckiest of them and lies below that setting's true figure: "
            "one run predicted 0.999 where it read 0.908, its two rivals 0.945 and 0.966). "
            "The prediction comes from that run's own probed steps (each variant's in-run "
            "layer times, compute alone for "
            "the time outside the layers and the shim's optimizer) on the link fitted from "
            "all-reduce times measured in the same process pair after the rounds. The last "
            "column is the probed steps' own step-time ratio: where it lies far from the "
            "measured one, the probed steps were not the steps the rounds ran. "
            + _probe_words(rows),
            "",
            *sim,
            "",
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} cores "
            + ("with nothing else running" if result.get("quiet") else "shared with other work")
            + f" (load average {before[0]:.1f} when the run started, {after[0]:.1f} when it "
            f"ended), torch {machine.get('torch')}, "
            + (f"{result['started_utc']} to " if result.get("started_utc") else "")
            + f"{machine.get('date_utc')}"
            + (f"; {result['machine_state']}" if result.get("machine_state") else "")
            + f". Reproduce: `{result['command']}`.",
            "",
        ]
    )


# Settings outside auto's search at 100 Mbit/s (benchmarks.grad_models.OUTSIDE), measured once
# beside the searched 256 KiB; a run of its own, so its words are kept here.
OUTSIDE_WORDS = (
    "Settings outside the search, at 100 Mbit/s with vgg at its earlier batch of 64 (compute "
    "about a third of the link's time), 10 rounds on the machine shared "
    "with other work (2026-11-27 09:49 UTC; `python -m benchmarks.gradsched --target auto "
    "--links 100mbit --model vgg --rounds 10 --only 'DDP again' --only 'scheduled 256 KiB' "
    "--only 'scheduled 128 KiB' --only 'scheduled 512 KiB' --only 'scheduled 256 KiB (credit "
    "2)' --only 'scheduled 256 KiB (credit 8)'`): partitions of 128 KiB 0.799 of DDP, 512 KiB "
    "0.797, 256 KiB with a credit of 2 or 8 partitions 0.839 and 0.809, against 0.811 for the "
    "searched 256 KiB with 4 (DDP again 1.007 [0.941, 1.162]): none told apart from it. Each "
    "ran 378-396 ms per step where the link needs 376 ms for all the gradients (its fitted "
    "bandwidth), the link busy 373-381 ms of each step (`stats()`): the scheduled step is the "
    "link's time for the gradients plus the few milliseconds from the last layer's reduced "
    "weights to its next gradient, and no partition size, credit or cheaper shim can take "
    "more than those few milliseconds off. What scheduling gains over DDP there is the "
    "compute DDP leaves exposed, so its speed-up is DDP's step over the link's time (*most x "
    "DDP*): DDP, slower on that loaded machine (472 ms), read 1.23x for the same 256 KiB."
)


def _probe_words(rows: list[dict]) -> str:
    """How the run's simulator probe measured its steps, for the page."""
    if rows[0].get("sim_probe_blocks"):
        return (
            f"The probe: {rows[0]['sim_probe_blocks']} pairs of blocks of the rounds' own "
            "models and optimizers (the same settings and warm state), a DDP block and one "
            "of the best setting, the pair's order alternating as in the rounds, with every "
            "layer timed; each block's first step (nothing in flight before it) left out; "
            "its own ratio the median over pairs:"
        )
    if any(not r["sim_probe_steps"] for r in rows):
        return (
            "This run probed 5 steps per variant, whose measured half followed the scheduled "
            "engine's re-plans (which drain the link); the probe now warms up past them "
            "(`probe_steps`):"
        )
    return (
        f"Each probed run: {rows[0]['sim_probe_steps']} steps of a fresh model, the first "
        "half warm-up (past the scheduled engine's re-plans):"
    )


def render_markdown(result: dict, img_dir: Path) -> str:
    """A ``## `` section for docs/benchmarks.md with tables and ``img/gradsched.png``; the
    auto target's section for a ``target="auto"`` run, or after it when the result holds one
    (``result["auto_target"]``)."""
    if result.get("target") == "auto":
        return _render_auto(result)
    if "auto_target" in result:
        main = {k: v for k, v in result.items() if k != "auto_target"}
        return render_markdown(main, img_dir) + "\n" + _render_auto(result["auto_target"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (link, name, model) for link in result["links"] for name, model in link["models"].items()
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.8), squeeze=False)
    rows, targets, floor = [], [], []
    for ax, (link, name, model) in zip(axes[0], panels, strict=True):
        s = _summary(model)
        names = list(s["median"])
        values = np.array([s["vs_ddp"][v] for v in names])
        spans = np.array([s["interval"][v] for v in names]).T
        ax.bar(range(len(names)), values, color="tab:blue")
        ax.errorbar(
            range(len(names)),
            values,
            yerr=np.abs(spans - values),
            fmt="none",
            ecolor="black",
            lw=0.8,
            capsize=2,
            label="95% interval",
        )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.03, color="tab:red", ls="--", lw=0.8, label="DDP + 3%")
        ax.set_xticks(range(len(names)), names, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"{name}, {link['link']}", fontsize=9)
        ax.set_ylabel("step time / neighbouring DDP block's")
        for v in names:
            rows.append(
                f"| {link['link']} | {name} | {v} | {1e3 * s['median'][v]:.1f} | "
                f"{s['vs_ddp'][v]:.3f} | {'' if v == 'DDP' else _ci(s, v)} | "
                f"{s['cpu_vs_ddp'][v]:.3f} | {s['thread_vs_ddp'][v]:.3f} | "
                f"{s['faults'][v]:.0f} | {s['to_bound'][v]:.2f} |"
            )
        rows.append(
            f"| {link['link']} | {name} | *bound* max({1e3 * s['compute']:.1f}, "
            f"{1e3 * s['comm']:.1f}) | {1e3 * s['bound']:.1f} | | | | | | 1.00 |"
        )
        if "DDP again" in names:
            floor.append(
                f"{s['vs_ddp']['DDP again']:.3f} {_ci(s, 'DDP again')} ({name}, {link['link']})"
            )
        targets += _target_rows(link, name, model)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(img_dir / "gradsched.png", dpi=110)
    plt.close(fig)
    machine = result["machine"]
    before, after = result.get("load_average", [[np.nan] * 3] * 2)
    rounds = _summary(panels[0][2])["rounds"] if panels else 0
    return "\n".join(
        [
            "## Gradient-priority scheduling (ByteScheduler)",
            "",
            "Two torch ranks (gloo, one compute thread each) on 127.0.0.1 (`loopback`) or in "
            "two network namespaces joined by a veth pair with MTU 9000 "
            "(`benchmarks/netns.sh`), unshaped or shaped with `tc`; each rank's process, with "
            "every thread it starts (gloo's included), is pinned to a core of its own. "
            "Variants: `no overlap` (one all-reduce after backward); DDP with its "
            "defaults, with `static_graph=True` and with `bucket_cap_mb` 2 and 0.5 (*DDP "
            "tuned* is the one of the three sizes with the lowest median); `DDP again` (a "
            "second default DDP with a model of its own, measured exactly like the other "
            "variants: the run's own noise); `chronica auto` "
            "(`ScheduledOptimizer` with its defaults: bucketed, trying priority scheduling "
            "only where its measurements say it can help, and keeping it only if it beat "
            "bucketed steps measured before and after its trial), `chronica bucketed` "
            "(`mode='bucketed'`: DDP's buckets, the same assignment as DDP's reducer "
            "rebuilds), and priority scheduling forced (`mode='scheduled'`): FIFO "
            "and priority with whole tensors, 256 KiB partitions with 1 MiB credit, "
            "auto-tuned. Every variant keeps its own model and optimizer for the whole run. "
            "Warm-up rounds run a block of every variant (chronica auto through its "
            "decision, auto-tuned through its search). Then, in each of "
            f"{result['repeats']} measured rounds, every variant runs a block of "
            f"{result['steps'] + 1} steps ({BLOCK_SCALE['mlp670k'] * result['steps'] + 1} for "
            "`mlp670k`, whose steps are about 5x shorter, so that blocks last alike) right "
            "next to a block of default DDP, the pair's "
            "order alternating and the pairs' sequence rotated every round; all variants get "
            "the same treatment. A block's step time is the median of its step-to-step "
            "times; a variant's ratio is the median over rounds of its block's over the DDP "
            "block beside it, given with a 95% bootstrap interval of that median "
            f"({BOOTSTRAP} resamples of the rounds): a ratio whose interval holds 1.03 cannot "
            "be told from 1.03 by this run. A block of a `ScheduledOptimizer` ends with "
            "`synchronize()` (no collective may stay in flight while another variant steps), "
            "which costs it nothing measured: its step-to-step times inside the block keep "
            "the overlap with the next forward. CPU: the process's CPU seconds per step (all "
            "its threads, gloo's included) on rank 0, and the training thread's alone; the "
            "process's minor page faults per step (median of its blocks). The "
            "bound `max(compute, comm)` is measured before, amid and after the rounds. "
            "Models: `mlp670k` (784-512-512-10, 669,706 parameters, batch 128 per rank), "
            "`vgg` (a small conv net: 96% of its 1.1 M parameters in the last layers, batch "
            "32), `mlp` (six 512x512 layers, batch 1024).",
            "",
            "The target: `chronica auto` within 3% of DDP (step time / DDP's ≤ 1.03) on "
            "loopback and on the unshaped veth, for `mlp670k` and `vgg`:",
            "",
            "| link | model | chronica auto / DDP | 95% interval | target | CPU / DDP's "
            "[95%] | / DDP static_graph | / DDP tuned | page faults per step, auto / DDP | "
            "what `chronica auto` decided (rank 0) |",
            "|---|---|---:|---|---|---:|---:|---:|---:|---|",
            *targets,
            "",
            *_default_heap(result),
            "The noise floor of this run: `DDP again` over DDP, the same code measured in "
            f"the same way, {', '.join(floor) or 'not measured'}.",
            "",
            "| link | model | variant | ms | / DDP | 95% interval | CPU / DDP's | training "
            "thread CPU / DDP's | page faults / step | / bound |",
            "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
            *rows,
            "",
            "![step time over the neighbouring DDP block's per variant, with 95% intervals]"
            "(img/gradsched.png)",
            "",
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} cores shared with "
            f"other work (load average {before[0]:.1f} when the run started, {after[0]:.1f} "
            f"when it ended), torch {machine.get('torch')}, {machine.get('date_utc')}, "
            f"{rounds} measured rounds. Reproduce: `{result['command']}`.",
            "",
        ]
    )


RESULTS = HERE / "results" / "gradsched.json"


def record_auto_target(result: dict, path: Path) -> None:
    """Keep an auto-target run as ``auto_target`` of the benchmark's results file at ``path``,
    the rest of the file unchanged (the page renders it after the main section).

    Args:
        result: a ``run(..., target="auto")`` result.
        path: the results file (``benchmarks/results/gradsched.json``).

    Example::

        >>> record_auto_target(result, RESULTS)   # doctest: +SKIP
    """
    if result.get("target") != "auto":
        raise ValueError("only a --target auto run is kept as auto_target")
    kept = json.loads(path.read_text())
    kept["auto_target"] = result
    path.write_text(json.dumps(kept, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", nargs="+", choices=LINKS, help="links to measure")
    parser.add_argument("--model", nargs="+", choices=list(MODELS), help="models to measure")
    parser.add_argument("--only", action="append", help="measure this variant (beside DDP)")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 20, quick 2)")
    parser.add_argument("--block", type=int, help="steps per block (default 7, quick 5)")
    parser.add_argument(
        "--default-malloc", action="store_true", help="leave glibc's heap trimming on"
    )
    parser.add_argument(
        "--target", choices=["auto"], help="auto: chronica auto against the fixed settings"
    )
    parser.add_argument("--markdown", type=Path, help="also write the docs section here")
    parser.add_argument(
        "--quiet-machine", action="store_true", help="nothing else ran: say so on the page"
    )
    parser.add_argument("--machine-state", help="what else ran meanwhile, for the page")
    parser.add_argument(
        "--record",
        action="store_true",
        help="with --target auto: keep the run as benchmarks/results/gradsched.json's "
        "auto_target (then `python -m benchmarks.report` renders the page)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds-of-all", action="store_true", help=argparse.SUPPRESS)
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
    result = run(
        args.quick,
        args.links,
        args.model,
        args.only,
        args.rounds,
        args.block,
        args.default_malloc,
        args.target,
    )
    result["quiet"] = args.quiet_machine
    if args.machine_state:
        result["machine_state"] = args.machine_state
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.record:
        record_auto_target(result, RESULTS)
    print(format_table(result))
    if args.target == "auto":
        print(auto_table(result))
    if args.markdown:
        args.markdown.write_text(render_markdown(result, ROOT / "docs" / "img"))


if __name__ == "__main__":
    main()
