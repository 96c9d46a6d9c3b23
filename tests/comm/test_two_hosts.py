"""A job across two hosts, as two network namespaces (as ``benchmarks/netns.sh`` builds
them): node 0's host name maps to 127.0.1.1 on node 0 (the Debian/Ubuntu default) and to
node 0's address on node 1. Rank 0's coordinator must refuse to bind loopback, loudly and
before training, naming what the name resolved to and the fix; with the name mapped to
node 0's address it binds that address and node 1 reaches it. Needs root (``ip netns``);
skipped where namespaces cannot be made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workers import scaled

import chronica

_ROOT = str(Path(chronica.__file__).parents[1])
_SETUP = """
import sys
import numpy as np
from chronica.core import ScheduleConfig, Scheduler
sizes = np.random.default_rng(0).lognormal(5, 1, 200)
scheduler = Scheduler(sizes, ScheduleConfig(2, 16, kind="dynamic", window=4))
"""
# Rank 0's coordinator: refused, or bound (then it serves until its stdin closes).
_SERVE = (
    _SETUP
    + """
from chronica.comm.coordinator import Coordinator
try:
    coordinator = Coordinator(scheduler, port=0).start()
except ValueError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(0)
print("BOUND", *coordinator.endpoint[:2], flush=True)
sys.stdin.read()
coordinator.close()
"""
)
# Rank 1 on the other host: joins by node 0's name and fetches the first window.
_JOIN = (
    _SETUP
    + """
from chronica.comm.client import PlanClient
client = PlanClient(1, 2, scheduler.digest, "node0", int(sys.argv[1]), timeout=30.0)
print("JOINED", client.connect(), client.plan(0, 0) is not None, flush=True)
client.close()
"""
)


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=scaled(30))


@pytest.fixture
def two_hosts():
    """Namespaces ``<name>-0`` (10.231.N.1) and ``<name>-1`` (10.231.N.2) on a veth pair;
    yields (name, node 0's address); removes everything after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = os.getpid() % 250
    name = f"chr31-{os.getpid()}"
    subnet = f"10.231.{tag}"
    try:
        _run(["ip", "netns", "add", f"{name}-0"])
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot make a network namespace here: {exc}")
    try:
        _run(["ip", "netns", "add", f"{name}-1"])
        a, b = f"c31a{tag}", f"c31b{tag}"
        _run(
            ["ip", "link", "add", a, "netns", f"{name}-0", "type", "veth", "peer", "name", b]
            + ["netns", f"{name}-1"]
        )
        for node, dev in ((0, a), (1, b)):
            _run(
                ["ip", "-n", f"{name}-{node}", "addr", "add", f"{subnet}.{node + 1}/24", "dev", dev]
            )
            _run(["ip", "-n", f"{name}-{node}", "link", "set", "lo", "up"])
            _run(["ip", "-n", f"{name}-{node}", "link", "set", dev, "up"])
        yield name, f"{subnet}.1"
    finally:
        for node in (0, 1):
            subprocess.run(["ip", "netns", "del", f"{name}-{node}"], capture_output=True)
            shutil.rmtree(f"/etc/netns/{name}-{node}", ignore_errors=True)


def _hosts(namespace: str, address: str) -> None:
    """``ip netns exec`` mounts /etc/netns/<namespace>/hosts over /etc/hosts."""
    folder = Path("/etc/netns") / namespace
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(f"127.0.0.1 localhost\n{address} node0\n")


def _python(namespace: str, program: str, *args: str, **options) -> subprocess.Popen[str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": _ROOT,
        "MASTER_ADDR": "node0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",
    }
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", program, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **options,
    )


def test_node_zero_named_as_loopback_is_refused_before_training(two_hosts):
    name, _ = two_hosts
    _hosts(f"{name}-0", "127.0.1.1")
    out, _ = _python(f"{name}-0", _SERVE).communicate(timeout=scaled(120))
    assert out.startswith("REFUSED"), out
    assert "would listen on 127.0.1.1, a loopback address" in out
    assert "MASTER_ADDR='node0' resolves to 127.0.1.1 on this host" in out
    assert "WORLD_SIZE=2 > LOCAL_WORLD_SIZE=1" in out and "Set MASTER_ADDR" in out


def test_node_zero_named_as_its_address_serves_the_other_host(two_hosts):
    name, address = two_hosts
    _hosts(f"{name}-0", address)
    _hosts(f"{name}-1", address)
    server = _python(f"{name}-0", _SERVE)
    try:
        assert server.stdout is not None
        bound = server.stdout.readline().split()
        assert bound[:2] == ["BOUND", address], bound
        joined, _ = _python(f"{name}-1", _JOIN, bound[2]).communicate(timeout=scaled(120))
        assert joined.strip() == "JOINED True True", joined
    finally:
        server.communicate(timeout=scaled(60))
