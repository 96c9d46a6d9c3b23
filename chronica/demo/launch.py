"""Start the demo's ranks as subprocesses, watch them, and collect rank 0's results (no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chronica.comm.ports import free_port
from chronica.demo.config import COORDINATED, DemoConfig

__all__ = ["DemoError", "launch"]

_WORKER = "chronica.demo.worker"


class DemoError(RuntimeError):
    """The distributed job failed or timed out; the message says which rank and why."""


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(config: DemoConfig, timeout_s: float) -> dict[str, Any]:
    """Run the ranks as subprocesses and return rank 0's results; never leaves a rank behind."""
    package_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="chronica-demo-") as tmp:
        config_path = Path(tmp) / "config.json"
        result_path = Path(tmp) / "result.json"
        payload = asdict(config)
        payload["samplers"] = list(config.samplers)
        payload["simulate_worlds"] = list(config.simulate_worlds)
        if COORDINATED.intersection(config.samplers) and not config.coordinator_port:
            # A coordinator publishes on its port + 1; several seeds run one each, 2 ports apart.
            payload["coordinator_port"] = free_port(2 * config.seeds)
        config_path.write_text(json.dumps(payload))
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE=str(config.world_size),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
        )
        # Keep freed memory in the ranks' heaps (glibc): returning it to the OS and faulting it
        # back is slow on some virtual machines and would be billed to random steps.
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 36))
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 25))
        command = [sys.executable, "-m", _WORKER, str(config_path), str(result_path)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(config.world_size):
                procs.append(subprocess.Popen(command, env=dict(env, RANK=str(rank))))
            deadline = time.monotonic() + timeout_s
            while True:
                codes = [proc.poll() for proc in procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    rank, code = failed[0]
                    raise DemoError(f"rank {rank} exited with code {code} (see its output above)")
                if all(code == 0 for code in codes):
                    break
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"the demo did not finish within {timeout_s:.0f} s; stopped all ranks "
                        f"(raise --timeout on a slow machine)"
                    )
                time.sleep(0.2)
        finally:
            _stop(procs)
        if not result_path.is_file():
            raise DemoError("rank 0 finished without writing its results")
        return json.loads(result_path.read_text())
