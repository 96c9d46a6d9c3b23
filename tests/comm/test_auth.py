"""chronica.comm.auth: CURVE keys and key folders, the allow-list's decisions, and what a
failed handshake is said to mean. How a coordinator under CURVE treats peers end to end,
and the environment's refusals, are in test_security.py."""

import logging
import os
import stat

import pytest
import zmq
from workers import scaled

from chronica.comm.auth import (
    ZAP_DOMAIN,
    CurveClient,
    CurveServer,
    HandshakeMonitor,
    ZapGate,
    describe_handshake_failure,
    make_keys,
)

SERVER_PUBLIC, SERVER_SECRET = zmq.curve_keypair()
CLIENT_PUBLIC, CLIENT_SECRET = zmq.curve_keypair()
OTHER_PUBLIC, OTHER_SECRET = zmq.curve_keypair()


# -- key folders -----------------------------------------------------------------------


def test_make_keys_writes_a_folder_both_sides_read(tmp_path):
    folder = make_keys(tmp_path / "keys")
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert names == [
        "allowed/client.key",
        "client.key",
        "client.key_secret",
        "server.key",
        "server.key_secret",
    ]
    for secret in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE((folder / secret).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    server = CurveServer.from_env({"CHRONICA_CURVE_DIR": str(folder)})
    client = CurveClient.from_env({"CHRONICA_CURVE_DIR": str(folder)})
    assert client.server_public == server.public and server.allowed == {client.public}


def test_make_keys_never_replaces_keys(tmp_path):
    make_keys(tmp_path)
    before = (tmp_path / "server.key_secret").read_bytes()
    with pytest.raises(ValueError, match="exists; choose an empty folder"):
        make_keys(tmp_path)
    assert (tmp_path / "server.key_secret").read_bytes() == before


def test_allowed_keys_add_up_from_the_folder_and_the_variable(tmp_path):
    folder = make_keys(tmp_path)
    env = {"CHRONICA_CURVE_DIR": str(folder), "CHRONICA_CURVE_ALLOWED": OTHER_PUBLIC.decode()}
    server = CurveServer.from_env(env)
    assert OTHER_PUBLIC in server.allowed and len(server.allowed) == 2


def test_a_secret_file_others_can_read_is_warned_about(tmp_path, caplog):
    folder = make_keys(tmp_path)
    os.chmod(folder / "server.key_secret", 0o644)
    with caplog.at_level(logging.WARNING, logger="chronica"):
        CurveServer.from_env({"CHRONICA_CURVE_DIR": str(folder)})
    assert any("chmod 600" in r.getMessage() for r in caplog.records)


def test_rank_zero_beside_its_coordinator_derives_the_server_key():
    env = {
        "CHRONICA_CURVE_SERVER_SECRET": SERVER_SECRET.decode(),
        "CHRONICA_CURVE_CLIENT_SECRET": CLIENT_SECRET.decode(),
    }
    assert CurveClient.from_env(env).server_public == SERVER_PUBLIC


# -- keys given directly -----------------------------------------------------------------


def test_keys_are_normalised_and_checked_as_pairs():
    server = CurveServer(secret=SERVER_SECRET.decode(), allowed=[CLIENT_PUBLIC.decode()])
    assert server.secret == SERVER_SECRET and server.public == SERVER_PUBLIC
    assert server.allowed == frozenset({CLIENT_PUBLIC})
    client = CurveClient(server_public=SERVER_PUBLIC, secret=CLIENT_SECRET, public=CLIENT_PUBLIC)
    assert client.public == CLIENT_PUBLIC
    with pytest.raises(ValueError, match="public is not the public key of secret"):
        CurveClient(server_public=SERVER_PUBLIC, secret=CLIENT_SECRET, public=OTHER_PUBLIC)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: CurveServer(secret=123, allowed=[CLIENT_PUBLIC]), TypeError, "str or bytes"),
        (lambda: CurveServer(secret=b"short", allowed=[CLIENT_PUBLIC]), ValueError, "40-char"),
        (lambda: CurveServer(secret=SERVER_SECRET, allowed=CLIENT_PUBLIC), TypeError, "allowed"),
        (lambda: CurveServer(secret=SERVER_SECRET, allowed=5), TypeError, "allowed"),
        (lambda: CurveServer(secret=SERVER_SECRET, allowed=[]), ValueError, "allowed is empty"),
        (lambda: CurveClient(server_public=None, secret=CLIENT_SECRET), TypeError, "server_public"),
    ],
)
def test_bad_keys_are_refused_without_showing_secrets(make, error, match):
    with pytest.raises(error, match=match) as raised:
        make()
    assert SERVER_SECRET.decode() not in str(raised.value)
    assert CLIENT_SECRET.decode() not in str(raised.value)


# -- the allow-list and handshakes -------------------------------------------------------


def test_the_zap_gate_admits_listed_keys_and_queues_the_others():
    context = zmq.Context()
    server = CurveServer(secret=SERVER_SECRET, allowed=[CLIENT_PUBLIC])
    zap = ZapGate(context, server)
    try:
        assert zap.callback(ZAP_DOMAIN, CLIENT_PUBLIC)
        assert not zap.callback(ZAP_DOMAIN, OTHER_PUBLIC)
        assert not zap.callback("another domain", CLIENT_PUBLIC)
        assert zap.refused == 2 and zap.take_refused() == [OTHER_PUBLIC, CLIENT_PUBLIC]
        assert zap.take_refused() == []
    finally:
        zap.stop()
        zap.stop()  # idempotent
        context.term()


def test_a_client_expecting_another_server_key_sees_the_handshake_fail():
    context = zmq.Context()
    server = CurveServer(secret=SERVER_SECRET, allowed=[CLIENT_PUBLIC])
    zap = ZapGate(context, server)
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    monitor = None
    try:
        for sock in (router, dealer):
            sock.setsockopt(zmq.LINGER, 0)
        server.apply(router)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        CurveClient(server_public=OTHER_PUBLIC, secret=CLIENT_SECRET).apply(dealer)
        monitor = HandshakeMonitor(dealer)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        assert monitor.socket.poll(int(1e3 * scaled(10)))  # the failure event, not a sleep
        failures = monitor.failures()
        assert failures and all("CURVE" in f or "handshake" in f for f in failures)
        assert monitor.failures() == []  # each said once
    finally:
        if monitor is not None:
            monitor.close()
            monitor.close()  # idempotent
        dealer.close(0)
        router.close(0)
        zap.stop()
        context.term()


@pytest.mark.parametrize(
    "event, value, says",
    [
        (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, "refused this peer's CURVE key (ZAP status 400)"),
        (
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
            "one side uses CURVE and the other does not",
        ),
        (
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC,
            "expects another coordinator public key",
        ),
        (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x10000001, "not a ZeroMQ peer of this protocol"),
        (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, "the coordinator's gate cut it"),
    ],
)
def test_failed_handshakes_are_explained(event, value, says):
    assert says in describe_handshake_failure(event, value)
