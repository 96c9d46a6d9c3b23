"""Security: the address the coordinator binds, a port already in use, CURVE authentication
with real sockets on loopback, and no pickle, eval or exec anywhere in the package."""

import ast
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tokenize
from pathlib import Path
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest
import zmq
from attacks import attack
from thread_total import ThreadTotal
from workers import free_ports, scaled

import chronica
from chronica.comm import standalone
from chronica.comm.address import resolve_bind, resolve_endpoint
from chronica.comm.auth import CurveClient, CurveServer, make_keys
from chronica.comm.client import PlanClient
from chronica.comm.coordinator import Coordinator
from chronica.comm.gate_process import HARD_BYTES
from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.session import DynamicSession

_ENV = ("MASTER_ADDR", "CHRONICA_BIND", "CHRONICA_PORT", "CHRONICA_COORDINATOR")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Each test states the environment it needs."""
    for name in list(os.environ):
        if name in _ENV or name.startswith("CHRONICA_CURVE_"):
            monkeypatch.delenv(name)


def _scheduler(world: int) -> Scheduler:
    sizes = np.random.default_rng(0).lognormal(5, 1, 600)
    config = ScheduleConfig(
        num_replicas=world, batch_size=16 * world, kind="dynamic", variable_batch=True, window=4
    )
    return Scheduler(sizes, config)


@pytest.fixture(scope="module")
def scheduler():
    return _scheduler(4)


@pytest.fixture(scope="module")
def keys():
    server, good, bad = (zmq.curve_keypair() for _ in range(3))
    return SimpleNamespace(server=server, good=good, bad=bad)


def _wait_for(condition, seconds=3.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- where it listens ------------------------------------------------------------------


def test_the_default_bind_is_loopback_only(scheduler):
    with Coordinator(scheduler, port=0) as coordinator:
        router, pub = coordinator.bound
        assert router.startswith("tcp://127.0.0.1:") and pub.startswith("tcp://127.0.0.1:")
        assert coordinator.bind_source == "default"


def test_master_addr_names_the_interface_and_names_are_resolved(scheduler, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    with Coordinator(scheduler, port=0) as coordinator:
        assert coordinator.bound[0].startswith("tcp://127.0.0.1:")
        assert coordinator.bind_source == "MASTER_ADDR"
    monkeypatch.setenv("CHRONICA_BIND", "127.0.0.1")
    assert resolve_bind() == ("127.0.0.1", "CHRONICA_BIND")  # it wins over MASTER_ADDR
    assert resolve_bind("::1") == ("::1", "host")


@attack(
    "held",
    "MASTER_ADDR spelled as every interface (0, 0.0, 00, 0x0, ::0, "
    "0:0:0:0:0:0:0:0 ...): refused, never bound",
)
@pytest.mark.parametrize(
    "wildcard",
    ["0.0.0.0", "*", "::", "0", "0.0", "0.0.0", "00", "0x0", "::0", "[::]", "0:0:0:0:0:0:0:0"],
)
def test_every_interface_is_never_taken_from_master_addr(scheduler, monkeypatch, wildcard):
    monkeypatch.setenv("MASTER_ADDR", wildcard)
    with pytest.raises(
        ValueError, match=r"MASTER_ADDR=.*every interface.*CHRONICA_BIND=0\.0\.0\.0"
    ):
        Coordinator(scheduler, port=0)
    # Ranks never connect to a wildcard: loopback stands for it.
    assert resolve_endpoint(wildcard, 1234) == ("127.0.0.1", 1234)


def test_every_interface_needs_the_explicit_opt_in(scheduler, monkeypatch, caplog):
    assert resolve_bind("0.0.0.0") == ("0.0.0.0", "host")
    monkeypatch.setenv("CHRONICA_BIND", "*")
    with caplog.at_level(logging.WARNING, logger="chronica"):
        with Coordinator(scheduler, port=0) as coordinator:
            assert coordinator.bound[0].startswith("tcp://0.0.0.0:")
            assert coordinator.bind_source == "CHRONICA_BIND"
    assert any("every interface without authentication" in r.getMessage() for r in caplog.records)


def test_bind_addresses_that_cannot_work_fail_clearly(scheduler, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    with pytest.raises(ValueError, match=r"MASTER_ADDR='no-such-host\.invalid' does not resolve"):
        Coordinator(scheduler, port=0)
    coordinator = Coordinator(scheduler, "192.0.2.1", 0)  # TEST-NET-1: not this machine's
    with pytest.raises(RuntimeError, match=r"192\.0\.2\.1 .*not an address of this machine"):
        coordinator.start()


def test_a_port_in_use_is_a_clear_error_naming_it(scheduler, tmp_path):
    base = free_ports(2)[0]
    with socket.socket() as other:  # another program holds the port
        other.bind(("127.0.0.1", base))
        other.listen()
        with pytest.raises(RuntimeError, match=f"port 127.0.0.1:{base} is already in use.*"):
            Coordinator(scheduler, "127.0.0.1", base).start()
        np.save(tmp_path / "sizes.npy", np.ones(64))
        argv = ["--sizes", str(tmp_path / "sizes.npy"), "--world", "2", "--batch-size", "8"]
        with pytest.raises(SystemExit, match=f"{base}.*CHRONICA_PORT"):
            standalone.main([*argv, "--port", str(base)])
    with socket.socket() as other:  # only the publishing port, base + 1, is taken
        other.bind(("127.0.0.1", base + 1))
        other.listen()
        with pytest.raises(RuntimeError, match=rf"port {base + 1} \(port \+ 1, for publishing\)"):
            Coordinator(scheduler, "127.0.0.1", base).start()
    _wait_for(lambda: _bindable(base))  # the failed start released the port it had bound


def _bindable(port: int) -> bool:
    with socket.socket() as probe:  # ZeroMQ closes a listener in its I/O thread, a bit later
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# -- CURVE -----------------------------------------------------------------------------


def _client(coordinator, rank, curve=None, timeout=2.0):
    host, port, pub = coordinator.endpoint
    scheduler = coordinator.scheduler
    world, digest = scheduler.config.num_replicas, scheduler.digest
    return PlanClient(rank, world, digest, host, port, pub_port=pub, timeout=timeout, curve=curve)


@attack(
    "held",
    "under CURVE, peers without keys, with an unlisted key or expecting another "
    "server key: refused at the handshake",
)
def test_curve_serves_listed_keys_and_refuses_everyone_else(scheduler, keys, caplog):
    before = set(threading.enumerate())
    curve = CurveServer(secret=keys.server[1], allowed=[keys.good[0]])
    coordinator = Coordinator(scheduler, "127.0.0.1", 0, curve=curve).start()
    clients = []
    try:
        good = CurveClient(server_public=keys.server[0], secret=keys.good[1])
        unlisted = CurveClient(server_public=keys.server[0], secret=keys.bad[1])
        other_server = CurveClient(server_public=keys.bad[0], secret=keys.good[1])
        intruders = [
            _client(coordinator, 1),  # no keys at all
            _client(coordinator, 2, unlisted),
            _client(coordinator, 3, other_server),
        ]
        clients += intruders
        with caplog.at_level(logging.WARNING, logger="chronica"):
            started = time.monotonic()
            for intruder in intruders:
                assert not intruder.connect()  # refused at the handshake: falls back at once
                assert intruder.plan(0, 0) is None
            # Each refusal comes at the handshake, not after a connect time-out (2 s each).
            assert time.monotonic() - started < scaled(3 * 2.0)
            members = [_client(coordinator, r, good) for r in (0, 1, 2, 3)]
            clients += members
            assert all(c.connect() for c in members)
            plans = [c.plan(0, 0) for c in members]
            static = scheduler.plan_epoch(0)
            for step in range(4):
                got = np.sort(np.concatenate([p.local(step) for p in plans]))
                whole = static.indices[static.bounds[step, 0] : static.bounds[step, -1]]
                np.testing.assert_array_equal(got, np.sort(whole))
            _wait_for(lambda: _received_by_pub(members))  # the next window, encrypted
            _wait_for(lambda: coordinator.stats.handshake_failures >= 3)
        for intruder in intruders:
            intruder._drain()
            assert intruder.stats.published == intruder.stats.fetched == 0
            assert intruder.stats.fallbacks == 1
        assert coordinator.stats.refused_keys >= 1 and coordinator.stats.hellos == 4
        said = [r.getMessage() for r in caplog.records]
        for rank in (1, 2, 3):  # each says why it falls back
            assert any(f"rank {rank}: the coordinator cannot be used" in m for m in said)
        assert any("rank 2" in m and "refused this peer's CURVE key" in m for m in said)
        bad_public = keys.bad[0].decode()
        assert any(f"refused CURVE client key {bad_public}" in m for m in said)
        assert not any(keys.server[1].decode() in m or keys.good[1].decode() in m for m in said)
    finally:
        for c in clients:
            c.close()
        coordinator.close()
    assert coordinator._gate is None and coordinator._context is None
    _wait_for(lambda: not [t for t in threading.enumerate() if t not in before])


def test_without_its_authenticator_a_curve_socket_admits_nobody(keys):
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    CurveServer(secret=keys.server[1], allowed=[keys.good[0]]).apply(server)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = ctx.socket(zmq.DEALER)
    CurveClient(server_public=keys.server[0], secret=keys.good[1]).apply(client)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        client.send(b"hello")  # queued: the handshake can never complete
        assert not server.poll(500)
    finally:
        for sock in (client, server):
            sock.close(0)
        ctx.term()


def _received_by_pub(clients) -> bool:
    for c in clients:
        c._drain()
    return all(c.stats.published for c in clients)


def test_a_session_takes_its_keys_from_a_key_folder(tmp_path, monkeypatch, caplog):
    folder = make_keys(tmp_path / "keys")
    for name in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="exists"):
        make_keys(folder)  # never overwrites keys
    monkeypatch.setenv("CHRONICA_CURVE_DIR", str(folder))
    alone = DynamicSession(_scheduler(1), 0, port=0, timeout=5.0)
    try:
        assert alone.coordinator.curve is not None and alone.client.curve is not None
        steps = list(alone.steps(0))
        assert len(steps) == alone.scheduler.num_steps()
        assert alone.windows_static == 0 and alone.windows_dynamic > 0
    finally:
        alone.close()
    # A rank whose key is not on the list falls back to the static plan, and says so.
    scheduler = _scheduler(2)
    port = free_ports(2)[0]
    with Coordinator(scheduler, "127.0.0.1", port) as coordinator:
        assert coordinator.curve is not None
        monkeypatch.setenv("CHRONICA_CURVE_CLIENT_SECRET", zmq.curve_keypair()[1].decode())
        monkeypatch.setenv("CHRONICA_COORDINATOR", f"127.0.0.1:{port}")
        with caplog.at_level(logging.WARNING, logger="chronica"):
            outsider = DynamicSession(scheduler, 1, timeout=1.0)
            try:
                got = [indices for _, indices, _, _ in outsider.steps(0)]
            finally:
                outsider.close()
        static = scheduler.plan_epoch(0)
        assert outsider.windows_dynamic == 0
        for step, indices in enumerate(got):
            np.testing.assert_array_equal(indices, static.local(step, 1))
        assert any("static plan" in r.getMessage() for r in caplog.records)


GOOD_PUBLIC, GOOD_SECRET = (k.decode() for k in zmq.curve_keypair())
OTHER_PUBLIC = zmq.curve_keypair()[0].decode()


@pytest.mark.parametrize(
    "env, match",
    [
        ({"CHRONICA_CURVE_SERVR_SECRET": GOOD_SECRET}, "unknown variable.*SERVR_SECRET"),
        ({"CHRONICA_CURVE_ALLOWED": GOOD_PUBLIC}, "no secret key.*CHRONICA_CURVE_SERVER_SECRET"),
        ({"CHRONICA_CURVE_SERVER_SECRET": GOOD_SECRET[:-1]}, "SERVER_SECRET must be a 40-char"),
        (
            {
                "CHRONICA_CURVE_SERVER_SECRET": GOOD_SECRET,
                "CHRONICA_CURVE_SERVER_PUBLIC": OTHER_PUBLIC,
            },
            "SERVER_PUBLIC is not the public key of CHRONICA_CURVE_SERVER_SECRET",
        ),
        ({"CHRONICA_CURVE_SERVER_SECRET": GOOD_SECRET}, "allowed is empty"),
        (
            {"CHRONICA_CURVE_SERVER_SECRET": GOOD_SECRET, "CHRONICA_CURVE_ALLOWED": "nope"},
            "CHRONICA_CURVE_ALLOWED",
        ),
        ({"CHRONICA_CURVE_DIR": "/no/such/folder"}, "CHRONICA_CURVE_DIR=.*not a folder"),
    ],
)
def test_coordinator_key_settings_fail_early_without_showing_secrets(env, match):
    with pytest.raises(ValueError, match=match) as error:
        CurveServer.from_env(env)
    assert GOOD_SECRET not in str(error.value)


@pytest.mark.parametrize(
    "env, match",
    [
        ({"CHRONICA_CURVE_CLIENT_SECRET": GOOD_SECRET}, "coordinator's public key"),
        ({"CHRONICA_CURVE_SERVER_PUBLIC": GOOD_PUBLIC}, "rank has no secret key"),
        (
            {
                "CHRONICA_CURVE_SERVER_PUBLIC": OTHER_PUBLIC,
                "CHRONICA_CURVE_CLIENT_SECRET": GOOD_SECRET,
                "CHRONICA_CURVE_CLIENT_PUBLIC": OTHER_PUBLIC,
            },
            "CLIENT_PUBLIC is not the public key of CHRONICA_CURVE_CLIENT_SECRET",
        ),
    ],
)
def test_rank_key_settings_fail_early_without_showing_secrets(env, match):
    with pytest.raises(ValueError, match=match) as error:
        CurveClient.from_env(env)
    assert GOOD_SECRET not in str(error.value)


def test_no_settings_no_curve_and_reprs_hide_secrets(keys):
    assert CurveServer.from_env({}) is None and CurveClient.from_env({}) is None
    server = CurveServer(secret=keys.server[1], allowed=[keys.good[0]])
    client = CurveClient(server_public=keys.server[0], secret=keys.good[1])
    assert server.public == keys.server[0] and client.public == keys.good[0]
    assert keys.server[1].decode() not in repr(server)
    assert keys.good[1].decode() not in repr(client)


def test_a_libzmq_without_curve_is_a_clear_error(scheduler, keys, monkeypatch):
    monkeypatch.setattr(zmq, "has", lambda capability: False)
    with pytest.raises(RuntimeError, match="built without"):
        CurveServer(secret=keys.server[1], allowed=[keys.good[0]])
    monkeypatch.setenv("CHRONICA_CURVE_SERVER_SECRET", keys.server[1].decode())
    monkeypatch.setenv("CHRONICA_CURVE_ALLOWED", keys.good[0].decode())
    with pytest.raises(RuntimeError, match="CURVE"):
        Coordinator(scheduler, port=0)


# -- nothing received is ever executed -------------------------------------------------

_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve"}
_CALLS = {"eval", "exec", "compile", "__import__"}


def _offences(path: Path) -> list[str]:
    with tokenize.open(path) as source:
        tokens = [
            t
            for t in tokenize.generate_tokens(source.readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.STRING)
        ]
    found = []
    text = [t.string for t in tokens] + ["", ""]
    for i, token in enumerate(tokens):
        if token.type != tokenize.NAME:
            continue
        attribute = i > 0 and text[i - 1] == "."
        called = text[i + 1] == "("
        if token.string in _MODULES or (token.string in _CALLS and called and not attribute):
            found.append(f"{path}:{token.start[0]}: {token.string}")
        if token.string == "allow_pickle" and text[i + 1] == "=" and text[i + 2] != "False":
            found.append(f"{path}:{token.start[0]}: allow_pickle={text[i + 2]}")
    return found


def test_no_pickle_eval_or_exec_in_the_package():
    root = Path(chronica.__file__).parent
    offences = [o for path in sorted(root.rglob("*.py")) for o in _offences(path)]
    assert not offences, "\n".join(offences)


def test_the_scan_would_see_them(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import pickle\nx = eval('1')\nnp.load(f, allow_pickle=True)\n"
        "# pickle in a comment is fine\nmodel.eval()\ns = 'exec(1)'\n"
    )
    assert [o.rsplit(": ", 1)[1] for o in _offences(sample)] == [
        "pickle",
        "eval",
        "allow_pickle=True",
    ]


# -- a plan that does not fit is not used ----------------------------------------------


@attack(
    "degraded",
    "a plan with a foreign sample, an inflated weight, another window or an unequal "
    "count: the static plan serves",
)
@pytest.mark.parametrize(
    "tamper", ["foreign sample", "inflated weight", "other window", "unequal count"]
)
def test_a_tampered_plan_is_refused_and_the_static_plan_serves(monkeypatch, caplog, tamper):
    """What a rank does with a plan a buggy coordinator, or an attacker on an
    unauthenticated network, could deliver: check it against the static plan first. An
    unequal count with a weight to match would pass every per-sample check, but a
    DataLoader batching a fixed count would split its steps and DDP would hang."""
    honest = Coordinator._part

    def part(self, plan, rank, seq):
        message = msgpack.unpackb(honest(self, plan, rank, seq))
        if tamper == "unequal count":
            indices = np.frombuffer(message["idx"], "<i8")
            offsets = np.frombuffer(message["off"], "<i8")
            keep = np.ones(indices.shape[0], bool)
            keep[offsets[1:] - 1] = False  # each step's last sample, weights to match
            counts = np.diff(offsets) - 1
            message["idx"] = indices[keep].tobytes()
            message["off"] = np.concatenate([[0], np.cumsum(counts)]).astype("<i8").tobytes()
            message["w"] = (counts / 16.0).astype("<f8").tobytes()
        elif tamper == "foreign sample":
            indices = np.frombuffer(message["idx"], "<i8").copy()
            indices[0] = 10**9
            message["idx"] = indices.tobytes()
        elif tamper == "inflated weight":
            message["w"] = (np.frombuffer(message["w"], "<f8") * 2).tobytes()
        else:
            message["first"] += 4
        return msgpack.packb(message, use_bin_type=True)

    def parts(self, plan, seq):
        return [part(self, plan, rank, seq) for rank in range(plan.num_replicas)]

    monkeypatch.setattr(Coordinator, "_part", part)
    monkeypatch.setattr(Coordinator, "_parts", parts)  # what it publishes
    scheduler = _scheduler(1)
    if tamper == "unequal count":
        sizes = np.random.default_rng(0).lognormal(5, 1, 600)
        scheduler = Scheduler(sizes, ScheduleConfig(1, 16, kind="dynamic", window=4))
    with caplog.at_level(logging.WARNING, logger="chronica"):
        session = DynamicSession(scheduler, 0, port=0, timeout=0.5)
        try:
            got = [(step, indices, weight) for step, indices, weight, _ in session.steps(0)]
        finally:
            session.close()
    static = scheduler.plan_epoch(0)
    for step, indices, weight in got:
        np.testing.assert_array_equal(indices, static.local(step, 0))
        assert weight == static.loss_weights[step, 0]
    assert session.windows_dynamic == 0
    # Another window's part passes the rank's own checks; its vote (alone, as the only
    # rank) finds that it is not the window's samples.
    said = "do not fit together" if tamper == "other window" else "does not fit the static plan"
    assert session.plans_refused >= (tamper != "other window")
    assert any(said in r.getMessage() for r in caplog.records)


def test_the_coordinator_command_serves_with_curve_from_a_key_folder(tmp_path):
    folder = make_keys(tmp_path / "keys")
    sizes = np.random.default_rng(0).lognormal(5, 1, 600)
    np.save(tmp_path / "sizes.npy", sizes)
    port = free_ports(2)[0]
    env = {k: v for k, v in os.environ.items() if k not in _ENV}
    env["CHRONICA_CURVE_DIR"] = str(folder)
    command = [sys.executable, "-m", "chronica.cli", "coordinator", "--sizes"]
    command += [str(tmp_path / "sizes.npy"), "--world", "2", "--batch-size", "32"]
    command += ["--variable-batch", "--window", "4", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert f"on 127.0.0.1:{port} (pub {port + 1}, CURVE on)" in line
        assert f"CHRONICA_COORDINATOR=127.0.0.1:{port}" in line
        scheduler = _scheduler(2)  # the same sizes and arguments as the command's
        curve = CurveClient.from_env({"CHRONICA_CURVE_DIR": str(folder)})
        client = PlanClient(
            1, 2, scheduler.digest, "127.0.0.1", port, timeout=scaled(10.0), curve=curve
        )
        try:
            assert client.connect() and client.plan(0, 0) is not None
        finally:
            client.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()


# -- an unauthenticated flood beside a training job ------------------------------------

# A peer that speaks just enough ZMTP to be read (greeting, READY), then sends one endless
# multipart message: 1 MiB chunks of empty frames (about 32 bytes of libzmq memory per byte
# on the wire) or of 4 KiB frames, to the ROUTER and the PUB port in turn, reconnecting
# whenever it is cut, until the kernel has taken TOTAL bytes.
_FLOOD = r"""
import socket, sys
host, ports, total = sys.argv[1], [int(p) for p in sys.argv[2:4]], int(sys.argv[4])
greeting = b"\xff" + bytes(8) + b"\x7f\x03\x00NULL" + bytes(16) + b"\x00" + bytes(31)
def ready(kind):
    body = b"\x05READY\x0bSocket-Type" + len(kind).to_bytes(4, "big") + kind
    return bytes([0x04, len(body)]) + body
chunks = [b"\x01\x00" * (1 << 19), (b"\x03" + (4096).to_bytes(8, "big") + bytes(4096)) * 256]
sent = connections = 0
while sent < total:
    port = ports[(connections // 2) % 2]
    chunk = chunks[connections % 2]
    connections += 1
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(greeting + ready(b"DEALER" if port == ports[0] else b"SUB"))
            while sent < total:
                s.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass  # cut: connect again
print(sent, connections)
"""
_FLOOD_BYTES = 1 << 30
# What the flood may add to the memory of the process hosting the coordinator.
_HOST_GROWTH = 64 << 20


def _rss(pid: int | str = "self") -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE")


@attack(
    "degraded",
    "1 GiB of unauthenticated ZMTP (multipart floods of empty and 4 KiB frames, both ports) "
    "beside a 2-rank job: the host process stays within 64 MiB, exactly-once holds",
)
def test_a_gigabyte_of_unauthenticated_flood_costs_the_host_nothing(caplog):
    """The coordinator runs as in the default deployment (a thread of rank 0's process,
    here this test's); an unauthenticated peer sends 1 GiB of the multipart floods that
    grow libzmq without bound. Its sockets live in the gate process, which cuts or is
    replaced, so the hosting process's memory stays within ``_HOST_GROWTH`` and both
    ranks train every sample exactly once per epoch, from dynamic or static plans."""
    sizes = np.random.default_rng(0).lognormal(5, 1, 400)
    config = ScheduleConfig(num_replicas=2, batch_size=16, kind="dynamic", window=4)
    scheduler = Scheduler(sizes, config)
    agreement = ThreadTotal(2)
    sessions = [
        DynamicSession(
            scheduler, rank, port=0, timeout=scaled(2.0), agree=agreement.agreement(rank)
        )
        for rank in (0,)
    ]
    host, port, pub = sessions[0].coordinator.endpoint
    sessions.append(
        DynamicSession(
            scheduler, 1, host=host, port=port, timeout=scaled(2.0), agree=agreement.agreement(1)
        )
    )
    gate = sessions[0].coordinator._gate
    limits = Path(f"/proc/{gate.pid()}/limits").read_text().splitlines()
    address_space = next(line for line in limits if line.startswith("Max address space"))
    assert address_space.split()[3] == str(HARD_BYTES)  # the gate's memory, capped
    trained: list[list[tuple[int, int, np.ndarray]]] = [[], []]
    failures: list[BaseException] = []
    peak = [0]
    flood: subprocess.Popen[str] | None = None

    def train(rank: int, epochs: range) -> None:
        session = sessions[rank]
        try:
            for epoch in epochs:  # while the flood lasts, and at least two epochs
                for step, indices, _, _ in session.steps(epoch):
                    trained[rank].append((epoch, step, np.asarray(indices)))
                    peak[0] = max(peak[0], _rss())
                    session.report(1e-3, step)
                if epoch >= epochs.start + 1 and flood is not None and flood.poll() is not None:
                    return
        except BaseException as exc:
            failures.append(exc)
            raise

    def run(epochs: range) -> list[threading.Thread]:
        ranks = [threading.Thread(target=train, args=(r, epochs)) for r in (0, 1)]
        for thread in ranks:
            thread.start()
        return ranks

    with caplog.at_level(logging.WARNING, logger="chronica"):
        try:
            for thread in run(range(1)):  # first use: imports, compiled kernels, caches
                thread.join(120)
            base = _rss()
            flood = subprocess.Popen(
                [sys.executable, "-c", _FLOOD, host, str(port), str(pub), str(_FLOOD_BYTES)],
                stdout=subprocess.PIPE,
                text=True,
            )
            ranks = run(range(1, 10_000))
            out, _ = flood.communicate(timeout=600)
            for thread in ranks:
                thread.join(600)
        finally:
            if flood is not None:
                flood.kill()
            stats = sessions[0].coordinator.stats
            for session in sessions:
                session.close()
    sent, connections = map(int, out.split())
    assert sent >= _FLOOD_BYTES and connections > 1  # the gate cut it, again and again
    assert not failures and not any(thread.is_alive() for thread in ranks)
    assert peak[0] - base < _HOST_GROWTH
    # Exactly once: both ranks ran the same steps, and every step holds its static samples.
    assert [(e, s) for e, s, _ in trained[0]] == [(e, s) for e, s, _ in trained[1]]
    for (epoch, step, mine), (_, _, theirs) in zip(*trained, strict=True):
        static = scheduler.plan_epoch(epoch)
        whole = static.indices[static.bounds[step, 0] : static.bounds[step, -1]]
        np.testing.assert_array_equal(np.sort(np.concatenate([mine, theirs])), np.sort(whole))
    epochs = {e for e, _, _ in trained[0]}
    for epoch in epochs:
        seen = np.concatenate([i for e, _, i in trained[0] + trained[1] if e == epoch])
        assert np.array_equal(np.sort(seen), np.arange(sizes.shape[0])[: seen.shape[0]])
    assert stats.gate_restarts + stats.gate.get("cut", 0) + stats.handshake_failures > 0


# -- planning stays within a horizon of the job's progress -----------------------------


def _ranks(coordinator, ranks):
    return [_client(coordinator, r, timeout=scaled(2.0)) for r in ranks]


def _serving(coordinator, ranks):
    """Clients of ``ranks``, connected and holding the first window."""
    clients = _ranks(coordinator, ranks)
    assert all(c.connect() for c in clients)
    assert all(c.plan(0, 0) is not None for c in clients)
    return clients


def _assert_partition(scheduler, plans, epoch, first):
    """The plans' parts of every step of the window are that step's static samples."""
    static = scheduler.plan_epoch(epoch)
    for step in range(first, first + plans[0].num_steps):
        got = np.sort(np.concatenate([p.local(step) for p in plans]))
        whole = static.indices[static.bounds[step, 0] : static.bounds[step, -1]]
        np.testing.assert_array_equal(got, np.sort(whole))


@pytest.fixture(scope="module")
def long_epochs():
    """Epochs of 312 steps: longer than the planning horizon (64 steps)."""
    sizes = np.random.default_rng(0).lognormal(5, 1, 20_000)
    return Scheduler(sizes, ScheduleConfig(4, 64, kind="dynamic", variable_batch=True, window=4))


@attack(
    "held",
    "a far epoch fetched, or a report planning ahead, before the job starts: refused or "
    "harmless, every real rank gets its plans",
)
def test_a_far_epoch_before_the_job_starts_leaves_the_ranks_their_plans(scheduler):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        (rogue,) = _ranks(coordinator, [3])
        assert rogue.connect()
        far = 10**6
        rogue.plan(far, 0)  # alone, it is the job's progress: planned, but nothing is lost
        ranks = _ranks(coordinator, range(4))  # real rank 3 takes over from the rogue
        assert all(c.connect() for c in ranks)
        for first in range(0, scheduler.num_steps(), 4):
            plans = [c.plan(0, first) for c in ranks]
            assert all(p is not None for p in plans)
            _assert_partition(scheduler, plans, 0, first)
            for c in ranks:
                c.report(0, first, 1.0, 1e-3)
        assert all(c.stats.fallbacks == 0 for c in ranks)
        for c in [rogue, *ranks]:
            c.close()


@attack(
    "held",
    "an insider fetches epochs 1 to 10 mid-job: each refused without planning, the real "
    "ranks keep their plans",
)
def test_an_insider_fetching_ahead_is_refused_without_planning(long_epochs):
    with Coordinator(long_epochs, "127.0.0.1", 0) as coordinator:
        ranks = _serving(coordinator, range(4))
        # (0, 0), and (0, 4) planned early
        _wait_for(lambda: coordinator.stats.windows == 2, scaled(3.0))
        planned = coordinator.stats.windows
        (insider,) = _ranks(coordinator, [2])  # says hello as a real rank
        assert insider.connect()
        for epoch in range(1, 11):
            assert insider.plan(epoch, 0) is None
        assert insider.stats.refused_fetches == 10 and coordinator.stats.refused["stale"] == 10
        assert coordinator.stats.windows == planned  # nothing was planned for it
        assert all(coordinator.planner.planned(epoch, 0) is None for epoch in range(1, 11))
        assert all(c.plan(0, 4) is not None for c in ranks)
        for c in [insider, *ranks]:
            c.close()


# -- the table of attacks in SECURITY.md is the suite's --------------------------------

_ROOT = Path(__file__).resolve().parents[2]
_TABLE_HEAD = "| attack | outcome | test |\n|---|---|---|\n"


def _registered_attacks() -> list[tuple[str, str, str]]:
    """``(what, outcome, test)`` of every test under tests/ decorated with ``@attack``."""
    found = []
    for path in sorted((_ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "attack"
                ):
                    outcome, what = (ast.literal_eval(a) for a in decorator.args)
                    test = f"{path.relative_to(_ROOT)}::{node.name}"
                    found.append((what, outcome, test))
    return found


def _attack_table(attacks) -> str:
    held = sum(outcome == "held" for _, outcome, _ in attacks)
    rows = "".join(f"| {what} | {outcome} | `{test}` |\n" for what, outcome, test in attacks)
    return (
        f"{_TABLE_HEAD}{rows}\n**{len(attacks)} attacks tried: {held} held, "
        f"{len(attacks) - held} degraded.**"
    )


def test_the_attack_table_is_current():
    """SECURITY.md lists exactly the tests marked ``@attack``, with their outcomes and the
    counts; docs/deployment.md repeats the counts. To add an attack, decorate its test
    (tests/helpers/attacks.py) and paste the table this test prints when it fails."""
    attacks = _registered_attacks()
    assert len(attacks) >= 10
    table = _attack_table(attacks)
    security = (_ROOT / "SECURITY.md").read_text()
    assert table in security, f"SECURITY.md's table of attacks should read:\n\n{table}"
    held = sum(outcome == "held" for _, outcome, _ in attacks)
    count = f"{len(attacks)} attacks tried: {held} held, {len(attacks) - held} degraded"
    assert count in " ".join((_ROOT / "docs" / "deployment.md").read_text().split())


# -- the gate ------------------------------------------------------------------------


@attack(
    "held",
    "5000 requests from a connection that never says a valid hello: at most 256 a second "
    "(after a burst) reach the coordinator, a real rank is served",
)
def test_strangers_reach_the_coordinator_at_a_bounded_rate(scheduler):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        host, port, _ = coordinator.endpoint
        stranger = zmq.Context.instance().socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.connect(f"tcp://{host}:{port}")
        started = time.monotonic()
        for _ in range(5000):
            stranger.send(b"\x81\xa1v\x02")  # a map without a type: refused when read
        _wait_for(lambda: coordinator.stats.gate.get("limited", 0) > 0, 30)
        elapsed = time.monotonic() - started
        burst = 2 * scheduler.config.num_replicas + 64
        assert coordinator.stats.rejected <= burst + 256 * elapsed + 1
        (rank,) = _ranks(coordinator, [0])
        assert rank.connect() and rank.plan(0, 0) is not None
        rank.close()
        stranger.close(0)


@attack(
    "degraded",
    "the gate process killed mid-job (as when memory runs out): another starts on the same "
    "ports, the ranks say hello again and are served",
)
def test_a_killed_gate_is_replaced_on_the_same_ports(scheduler):
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        ranks = _serving(coordinator, range(4))
        endpoint, pid = coordinator.endpoint, coordinator._gate.pid()
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: coordinator.stats.gate_restarts == 1, 30)
        assert coordinator.endpoint == endpoint and coordinator._gate.pid() != pid
        # A rank that asked while the gate was down fell back for that window; each says
        # hello again (however long a loaded machine takes to reconnect), then is served.
        _wait_for(lambda: all(c.connect() for c in ranks), scaled(30))
        plans = [c.plan(0, 4) for c in ranks]
        assert all(p is not None for p in plans)
        _assert_partition(scheduler, plans, 0, 4)
        for c in ranks:
            c.close()


# -- admission: real ranks win over connection floods -------------------------------------

# Idle connections the flood keeps open (``ulimit -n`` must allow them in the flood's
# process and, up to the gate's cap, in the gate's).
_FLOOD_IDLE = 10_000
_FLOOD_HELLOS = 64


def _run_two_ranks_through(coordinator, scheduler, monkeypatch, timeout):
    """A 2-rank job (threads) on ``coordinator``: both join, rank 1 is killed after two
    windows and resumed by a new session; returns every rank's (step, indices) and the
    sessions' dynamic and static window counts."""
    host, port, _ = coordinator.endpoint
    monkeypatch.setenv("CHRONICA_COORDINATOR", f"{host}:{port}")
    total = ThreadTotal(2)
    got: dict[int, list] = {0: [], 1: []}
    windows = {"dynamic": 0, "static": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(rank: int) -> None:
        try:
            start, lives = 0, 2 if rank == 1 else 1
            for life in range(lives):
                session = DynamicSession(
                    scheduler, rank, timeout=timeout, agree=total.agreement(rank)
                )
                try:
                    for step, indices, _, _ in session.steps(0, start):
                        got[rank].append((step, indices.tolist()))
                        session.report(1e-3, step)
                        if life + 1 < lives and step == 2 * scheduler.config.window - 1:
                            start = step + 1
                            break  # killed: its connection goes, a new process resumes
                finally:
                    session.close()
                    with lock:
                        windows["dynamic"] += session.windows_dynamic
                        windows["static"] += session.windows_static
        except BaseException as error:  # reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(300))
    assert not errors and not any(t.is_alive() for t in threads), errors
    return got, windows


@attack(
    "held",
    "10,000 idle TCP connections (kept open: each one cut is opened again) plus wrong-digest "
    "hellos from 64 connections while a 2-rank job joins and a rank is killed and resumed, "
    "with and without CURVE: every join succeeds and every window is served dynamically",
)
@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_connection_floods_never_lock_real_ranks_out(monkeypatch, tmp_path, curve):
    if curve:
        monkeypatch.setenv("CHRONICA_CURVE_DIR", str(make_keys(tmp_path / "keys")))
    scheduler = _scheduler(2)
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        host, port, pub = coordinator.endpoint
        flood = subprocess.Popen(
            [sys.executable, str(Path(__file__).parents[1] / "helpers" / "flood.py")]
            + [host, str(port), str(pub), str(_FLOOD_IDLE), str(_FLOOD_HELLOS), "600"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(chronica.__file__).parents[1])},
        )
        try:
            assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
            _wait_for(lambda: coordinator.stats.gate.get("evicted", 0) > 0, scaled(60))
            got, windows = _run_two_ranks_through(coordinator, scheduler, monkeypatch, scaled(10))
            gate = dict(coordinator.stats.gate)
        finally:
            flood.kill()
            flood.wait()
    static = scheduler.plan_epoch(0)
    for rank in (0, 1):
        assert [step for step, _ in got[rank]] == list(range(static.num_steps))
    for step in range(static.num_steps):
        both = sorted(got[0][step][1] + got[1][step][1])
        assert both == sorted(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
    per_rank = -(-static.num_steps // scheduler.config.window)
    print(f"flood ({'curve' if curve else 'plain'}): gate {gate}, windows {windows}")
    # Rank 0's windows, rank 1's before it was killed and after it resumed: all dynamic.
    assert windows == {"dynamic": 2 * per_rank, "static": 0}, (windows, gate)
    assert gate["evicted"] > 0  # the flood filled the gate, which made room for the ranks


# Gate kills the attack below makes, one a second (its description says the number; on a
# quiet machine, 2-rank jobs ran 360 of 360 windows dynamically over 30 kills).
_GATE_KILLS = 20


@attack(
    "degraded",
    "the gate process killed every second, 20 times, during a 2-rank job: each time "
    "replaced at once, at least 90% of windows served dynamically, every sample once per epoch",
)
def test_a_gate_killed_every_second_costs_few_windows(monkeypatch):
    scheduler = _scheduler(2)
    static = [scheduler.plan_epoch(epoch) for epoch in range(2)]
    with Coordinator(scheduler, "127.0.0.1", 0) as coordinator:
        host, port, _ = coordinator.endpoint
        monkeypatch.setenv("CHRONICA_COORDINATOR", f"{host}:{port}")
        total = ThreadTotal(2)
        stop, kills, killed = threading.Event(), [0], [None]
        go_on = [True]
        epoch_start = threading.Barrier(2, action=lambda: go_on.__setitem__(0, not stop.is_set()))
        got: dict[int, list] = {0: [], 1: []}
        windows = {"dynamic": 0, "static": 0}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def run(rank: int) -> None:
            session = DynamicSession(
                scheduler, rank, timeout=scaled(5), agree=total.agreement(rank)
            )
            try:
                epoch = 0
                while epoch_start.wait(scaled(120)) is not None and go_on[0]:
                    for step, indices, _, _ in session.steps(epoch):
                        got[rank].append((epoch, step, indices.tolist()))
                        session.report(1e-3, step)
                        time.sleep(0.02)  # a step's work
                    epoch += 1
            except BaseException as error:  # reported by the test
                errors.append(error)
                epoch_start.abort()
            finally:
                session.close()
                with lock:
                    windows["dynamic"] += session.windows_dynamic
                    windows["static"] += session.windows_static

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        steps = scheduler.num_steps()
        try:
            # A kill a second until _GATE_KILLS gates were killed and both ranks have run two
            # epochs under them (a loaded machine runs fewer steps a second); a job that
            # stalls meets the limit and fails.
            limit = time.monotonic() + scaled(300)
            while not errors and time.monotonic() < limit:
                if kills[0] >= _GATE_KILLS and min(map(len, got.values())) >= 2 * steps:
                    break
                pid = coordinator._gate.pid()
                # Until the coordinator notices, pid() names the gate already killed: a
                # second kill of it would count a kill that no restart can answer.
                if pid is not None and pid != killed[0]:
                    os.kill(pid, signal.SIGKILL)
                    kills[0], killed[0] = kills[0] + 1, pid
                time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(scaled(300))
        assert not errors and not any(t.is_alive() for t in threads), errors
        restarts = coordinator.stats.gate_restarts
    epochs = len(got[0]) // steps
    assert epochs >= 2 and len(got[1]) == len(got[0]) == epochs * steps
    for (epoch, step, a), (_, _, b) in zip(got[0], got[1], strict=True):
        plan = static[epoch % 2] if epoch < 2 else scheduler.plan_epoch(epoch)
        want = plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]]
        assert sorted(a + b) == sorted(want.tolist())
    served = windows["dynamic"] / (windows["dynamic"] + windows["static"])
    print(f"gate killed {kills[0]} times, {restarts} restarts, windows {windows}, {served:.1%}")
    assert kills[0] >= _GATE_KILLS and restarts >= kills[0] - 1
    assert served >= 0.9, windows
