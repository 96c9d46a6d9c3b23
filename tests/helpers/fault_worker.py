"""One rank of a real gloo job with kind="dynamic" under a fault, started by
tests/adapters/torch/test_faults.py (the job of dynamic_job.py).

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and CHRONICA_TEST_PORT (the port of rank
0's coordinator; it also uses port + 1) or CHRONICA_COORDINATOR (a standalone one); argv:
output JSON path, scenario. Two epochs; the last rank is emulated 4x slower in its reports.
After each step's collective a rank appends its batch to ``<output>.journal`` and saves its
sampler state to ``<output>.state`` (what a training loop checkpoints). Scenarios:

* "silent": the last rank stops calling ``report`` after step ``SILENT_AFTER`` of epoch 0;
* "delay": rank 0's coordinator answers the window at step ``DELAYED_FIRST`` of epoch 0
  ``DELAY`` seconds late (a test-only wrapper around ``Coordinator._ensure``), longer than
  the last rank's time-out (``SHORT_TIMEOUT``) and shorter than the other ranks';
* "coordinator": the ranks use a standalone coordinator, which the test kills after step
  ``KILL_AFTER`` of epoch 0 and starts again after step ``RESTART_AFTER``; rank 0 tells
  the test by a file ``<CHRONICA_TEST_DIR>/<event>`` and waits for ``<event>.done``;
* "crash": the last rank kills itself (SIGKILL) right after saving its state at step
  ``CRASH_AFTER`` of epoch 0; "resume": every rank continues from its saved state;
* "tampered": three epochs from a fake coordinator (CHRONICA_COORDINATOR, started by
  tests/comm/test_tampering.py) that attacks window after window, with a time-out of
  ``TAMPER_TIMEOUT``; a rank whose coordinator stopped answering says hello again after
  the step (``connect``), so every attack meets an attached rank.

Besides its batches a rank records, per window, its vote (token, agreed) and the
generation of the plan its client returned (0: none).
"""

import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from dynamic_job import PER_RANK, WINDOW, N, sizes

from chronica.comm.coordinator import Coordinator
from chronica.runtime import DynamicOptions
from chronica.torch.utils.data import DistributedBatchSampler

SILENT_AFTER = 5
DELAYED_FIRST, DELAY, SHORT_TIMEOUT, TIMEOUT = 8, 2.5, 0.5, 10.0
KILL_AFTER, RESTART_AFTER, RESTART_TIMEOUT, STEP_SECONDS = 5, 13, 3.0, 0.05
CRASH_AFTER = 9
TAMPER_TIMEOUT, TAMPER_EPOCHS = 1.0, 3


def delay_window() -> None:
    """Make this process's coordinator plan (and so answer and publish) one window late."""
    ensure = Coordinator._ensure

    def late(self, epoch, first):
        if (epoch, first) == (0, DELAYED_FIRST) and self.planner.planned(epoch, first) is None:
            time.sleep(DELAY)
        return ensure(self, epoch, first)

    Coordinator._ensure = late


def tell_test(event: str) -> None:
    """Rank 0: ask the test to act on the coordinator, and wait until it has."""
    folder = Path(os.environ["CHRONICA_TEST_DIR"])
    (folder / event).touch()
    deadline = time.monotonic() + 60
    while not (folder / f"{event}.done").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test did not act on {event}")
        time.sleep(0.02)


def save(path: Path, state: dict) -> None:
    """Replace ``path`` atomically: a crash leaves the old state or the new one."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(state))
    os.replace(part, path)


def main(out_path: str, scenario: str) -> None:
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    world, rank = dist.get_world_size(), dist.get_rank()
    if scenario == "delay" and rank == 0:
        delay_window()
    lengths = sizes()
    sampler = DistributedBatchSampler(
        list(range(N)),
        batch_size=PER_RANK * world,
        kind="dynamic",
        variable_batch=True,
        sizes=lengths,
        window=WINDOW,
        dynamic=DynamicOptions(
            port=int(os.environ.get("CHRONICA_TEST_PORT", 0)) or None,
            timeout={"coordinator": RESTART_TIMEOUT, "tampered": TAMPER_TIMEOUT}.get(
                scenario, TIMEOUT
            ),
        ),
    )
    journal, checkpoint = Path(out_path + ".journal"), Path(out_path + ".state")
    first_epoch, first_step = 0, 0
    if scenario == "resume":
        state = json.loads(checkpoint.read_text())
        sampler.load_state_dict(state)
        first_epoch, first_step = state["epoch"], state["step"]
    session = sampler.stream.session
    votes = []  # (own token: the window's digest or NO_PLAN, agreed) per window, in order
    agree = session.agree

    def recording(token, imbalance) -> bool:
        agreed = agree(token, imbalance)
        votes.append((token, agreed))
        return agreed

    session.agree = recording
    gens = []  # the generation of the plan the client returned per window, 0 for none
    plan = session.client.plan

    def recording_plan(epoch, first, timeout=None):
        got = plan(epoch, first, timeout)
        gens.append(0 if got is None else got.gen)
        return got

    session.client.plan = recording_plan
    slow = 4.0 if rank == world - 1 else 1.0
    epochs, reported = [], 0
    for epoch in range(first_epoch, TAMPER_EPOCHS if scenario == "tampered" else 2):
        start = first_step if epoch == first_epoch else 0
        if start == 0:
            sampler.set_epoch(epoch)
        steps = []
        for step, batch in enumerate(sampler, start):
            steps.append([int(i) for i in batch])
            # A step's collective, as in data-parallel training: ranks move in lock-step.
            everyone = [None] * world
            dist.all_gather_object(everyone, len(batch))
            with journal.open("a") as f:
                f.write(json.dumps([epoch, step, steps[-1]]) + "\n")
            save(checkpoint, sampler.state_dict())
            if scenario == "crash" and rank == world - 1 and (epoch, step) == (0, CRASH_AFTER):
                os.kill(os.getpid(), signal.SIGKILL)
            if scenario == "coordinator":
                time.sleep(STEP_SECONDS)  # compute: re-attaching takes a few steps
            if scenario == "coordinator" and epoch == 0 and step in (KILL_AFTER, RESTART_AFTER):
                if rank == 0:
                    tell_test("kill" if step == KILL_AFTER else "restart")
                dist.barrier()
            if (
                scenario == "delay"
                and rank == world - 1
                and (epoch, step) == (0, DELAYED_FIRST - 1)
            ):
                # Set just before the delayed window, so that only it can exceed it (the
                # first window, planned cold, may take longer on a loaded machine).
                session.client.timeout = SHORT_TIMEOUT
            if scenario == "tampered" and not session.client.attached:
                session.client.connect()
            silent = scenario == "silent" and rank == world - 1
            if not (silent and (epoch > 0 or step > SILENT_AFTER)):
                sampler.report(lengths[batch].sum() * 1e-6 * slow)
                reported += 1 if session.client.attached else 0
        epochs.append(steps)
    result = {
        "rank": rank,
        "epochs": epochs,
        "votes": votes,
        "gens": gens,
        "plans_refused": session.plans_refused,
        "dynamic_windows": session.windows_dynamic,
        "static_windows": session.windows_static,
        "client": asdict(session.client.stats),
        "reported": reported,
    }
    sent = [None] * world
    dist.all_gather_object(sent, reported)
    if rank == 0 and session.coordinator is not None:
        coordinator = session.coordinator
        # Reports are sent without waiting: give the last ones a moment to be taken.
        deadline = time.monotonic() + 10
        while coordinator.stats.reports < sum(sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        times = coordinator.planner.times
        _, beta = times.params()
        result["coordinator"] = {
            "reports": coordinator.stats.reports,
            "model_reports": [times.reports(r) for r in range(world)],
            "beta": beta.tolist(),
        }
    dist.barrier()
    sampler.close()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
