"""One rank of the gloo job of tests/adapters/torch/test_grad_torch.py.

argv: output JSON path, timeline path. Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
For SGD (momentum, two parameter groups), Adam and AdamW (weight decay) it trains a model
whose forward order differs from its registration order, once with ``ScheduledOptimizer``
(small partitions and credit, rank-dependent backward delays) and once with plain
all-reduce-average + ``optimizer.step()``, and reports both. Then, against real
``DistributedDataParallel(find_unused_parameters=True)`` (broadcast_buffers on), a model with
BatchNorm, a layer only rank 1 uses on odd steps and one that no rank uses after the first
step, in every mode of ``ScheduledOptimizer`` (``mode="auto"``: through its whole search of
settings, and through a second decision after ``trial.reopen``). Last, a scheduled loop with
a timeline that never calls ``close()``: the file must be complete once this process exited.
"""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from chronica.runtime import auto
from chronica.torch.distributed import ScheduledOptimizer

STEPS = 4


class Net(nn.Module):
    """Registered head first, used last; a big layer cut into partitions, small ones fused."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 3)
        self.big = nn.Linear(32, 64)
        self.stem = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.big(self.norm(torch.relu(self.stem(x))))))


def make_optimizer(kind: str, model: Net) -> torch.optim.Optimizer:
    if kind == "sgd":
        groups = [
            {"params": [*model.head.parameters(), *model.stem.parameters()], "lr": 0.05},
            {"params": [*model.big.parameters(), *model.norm.parameters()], "lr": 0.01},
        ]
        return torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-2)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)


def slow_backward(model: Net, rank: int) -> None:
    """Make gradients ready at different moments on each rank."""
    delay = {0: model.big, 1: model.stem}[rank % 2]
    delay.register_full_backward_hook(lambda *args: time.sleep(0.02))


def train(kind: str, scheduled: bool, rank: int, world: int, timeline: str | None) -> dict:
    torch.manual_seed(0)
    model = Net()
    opt = make_optimizer(kind, model)
    loss_fn = nn.CrossEntropyLoss()
    report: dict = {"dispatch": []}
    # SGD's learning rate halves after every step: updates still in flight when the
    # scheduler steps must use the rate of their own step.
    lr_schedule = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) if kind == "sgd" else None
    if scheduled:
        slow_backward(model, rank)
        opt = ScheduledOptimizer(
            model,
            opt,
            partition_bytes=2048,
            credit_bytes=3000,
            timeline=timeline,
            mode="scheduled",
        )
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if scheduled and step > 1:
            # The forward waited for every parameter: the previous step is complete (the
            # first step reduces everything at once, before scheduling starts).
            report["dispatch"].append(opt.last_dispatch)
        loss.backward()
        if not scheduled:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()  # scheduled: returns while gradients may still be in flight
        if lr_schedule is not None:
            lr_schedule.step()
    if scheduled:
        opt.synchronize()
        report["dispatch"].append(opt.last_dispatch)
        report["max_in_flight"] = opt.max_in_flight_bytes
        report["credit"] = opt.credit_bytes
        report["partition"] = opt.partition_bytes
        report["partitions"] = opt.partition_shapes()
        state = opt.state_dict()
        opt.close()
    else:
        state = opt.state_dict()
    report["params"] = {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}
    report["state"] = {
        str(k): {n: v.flatten().tolist() for n, v in s.items() if torch.is_tensor(v)}
        for k, s in state["state"].items()
    }
    report["sizes"] = {n: p.numel() for n, p in model.named_parameters()}
    return report


# mode="auto" with min_saving=0 searches two settings (whole gradients, 1 KiB partitions)
# and settles by step 34 whatever it measures; "auto-redecide" reopens it at REOPEN_STEP and
# settles again by step 70.
DDP_STEPS = 80
REOPEN_STEP = 40
VARIANTS = {
    "bucketed": {"mode": "bucketed"},
    "scheduled": {"mode": "scheduled", "partition_bytes": 1024, "credit_bytes": 2048},
    "auto-switch": {"mode": "auto", "min_saving": 0.0, "partition_bytes": 1024},
    "auto-stay": {"mode": "auto", "min_saving": 1.0},
    "auto-redecide": {"mode": "auto", "min_saving": 0.0, "partition_bytes": 1024},
}


class UnusedNet(nn.Module):
    """BatchNorm statistics; ``spare`` is used by rank 1 on odd steps only (unused on rank 0,
    and by everyone on even steps); ``once`` on the first step only, then by no rank, so
    momentum and weight decay would move it if it were stepped with a zero gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.bn = nn.BatchNorm1d(32)
        self.big = nn.Linear(32, 64)
        self.head = nn.Linear(64, 3)
        self.spare = nn.Linear(64, 3)
        self.once = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor, step: int, rank: int) -> torch.Tensor:
        h = torch.relu(self.big(self.bn(torch.relu(self.stem(x)))))
        out = self.head(h)
        if step % 2 == 1 and rank == 1:
            out = out + self.spare(h)
        if step == 0:
            out = out + self.once(h)
        return out


def against_ddp(kind: str, variant: str, rank: int) -> dict:
    """Train ``UnusedNet`` with DDP (``variant="ddp"``) or ScheduledOptimizer; report all."""
    torch.manual_seed(0)
    model = UnusedNet()
    if kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    net: nn.Module = model
    if variant == "ddp":
        net = DistributedDataParallel(model, find_unused_parameters=True)
    else:
        opt = ScheduledOptimizer(model, opt, **VARIANTS[variant])
    loss_fn = nn.CrossEntropyLoss()
    settings: list[str] = []  # the setting in force after each step (mode="auto")
    decisions: list[str] = []
    for step in range(DDP_STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss_fn(net(x, step, rank), y).backward()
        opt.step()
        if isinstance(opt, ScheduledOptimizer) and opt.trial is not None:
            settings.append(str(opt.setting))
            if opt.trial.settled and opt.trial.decision not in decisions:
                decisions.append(opt.trial.decision)
            if variant == "auto-redecide" and step == REOPEN_STEP:
                opt.trial.reopen("reopened by the test")
    report: dict = {}
    if isinstance(opt, ScheduledOptimizer):
        opt.synchronize()
        stats = opt.stats()
        report["stats"] = {"mode": stats.mode, "steps": stats.steps, "verdict": stats.verdict}
        report["stats"]["decision"] = stats.decision
        report["settings"] = settings
        report["decisions"] = decisions
        report["decided"] = opt.trial.decisions if opt.trial is not None else 0
        # How many steps' medians planned the order in force, and that order.
        report["planned_from"] = opt._planned_from if opt.setting.engine == "scheduled" else None
        report["dispatch"] = opt.last_dispatch
        state = opt.state_dict()
        opt.close()
    else:
        state = opt.state_dict()
    report["params"] = {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}
    report["buffers"] = {n: b.flatten().tolist() for n, b in model.named_buffers()}
    report["state"] = {
        str(k): {n: v.flatten().tolist() for n, v in s.items() if torch.is_tensor(v)}
        for k, s in state["state"].items()
    }
    return report


KEEP = []  # optimizers left open until the interpreter exits


def unclosed_timeline(path: str, rank: int) -> None:
    """The docs' loop: synchronize() at the end, never close(); the object stays alive."""
    torch.manual_seed(0)
    model = Net()
    opt = ScheduledOptimizer(
        model, torch.optim.SGD(model.parameters(), lr=0.01), timeline=path, mode="scheduled"
    )
    for step in range(4):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.synchronize()
    KEEP.append(opt)


def main(out_path: str, timeline: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for kind in ("sgd", "adam", "adamw"):
        results[kind] = {
            "scheduled": train(kind, True, rank, world, timeline if kind == "adam" else None),
            "plain": train(kind, False, rank, world, None),
        }
    for kind in ("sgd", "adamw"):
        results[f"ddp-{kind}"] = {v: against_ddp(kind, v, rank) for v in ("ddp", *VARIANTS)}
    unclosed_timeline(timeline.replace("trace", "unclosed"), rank)
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "results": results}, f)


if __name__ == "__main__":
    # The trial at its shortest: one window of the survivor after the search, no extra ones
    # where the noise cannot tell (bounds the unit tests of chronica.runtime.auto cover), so
    # that the steps below always decide. Set here, not at import: a test that imports this
    # module must not change its process.
    auto.MIN_WINDOWS_KEPT = auto.MAX_WINDOWS_KEPT = 1
    main(sys.argv[1], sys.argv[2])
