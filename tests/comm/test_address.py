"""chronica.comm.address: where the coordinator binds, where ranks connect, ports and
CHRONICA_COORDINATOR, and the errors that name the setting and the fix. Nothing here binds a
socket (SECURITY.md's bind rules are exercised against live coordinators in
test_security.py)."""

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.comm.address import (
    DEFAULT_PORT,
    bind_error,
    external_coordinator,
    listens_everywhere,
    resolve_bind,
    resolve_endpoint,
    resolve_port,
    spans_hosts,
)

_ENV = ("MASTER_ADDR", "CHRONICA_BIND", "CHRONICA_PORT", "CHRONICA_COORDINATOR")
_LAUNCH = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
_LAUNCH += ("PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in _ENV + _LAUNCH:
        monkeypatch.delenv(name, raising=False)


# -- ports -----------------------------------------------------------------------------


def test_a_port_comes_from_the_argument_then_the_environment_then_the_default(monkeypatch):
    assert resolve_port() == DEFAULT_PORT == 50051
    monkeypatch.setenv("CHRONICA_PORT", "6000")
    assert resolve_port() == 6000
    assert resolve_port(7000) == 7000
    assert resolve_port(0) == 0  # any free port
    monkeypatch.setenv("CHRONICA_PORT", "")
    assert resolve_port() == DEFAULT_PORT  # empty is unset


@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=65535)))
def test_ports_out_of_range_are_value_errors_naming_the_next_port(port):
    with pytest.raises(ValueError, match=r"port=.*next port"):
        resolve_port(port)


@pytest.mark.parametrize("port", ["50051", 1.0, True])
def test_ports_that_are_no_ints_are_type_errors(port):
    with pytest.raises(TypeError, match="port"):
        resolve_port(port)


@pytest.mark.parametrize("value", ["http", "70000", "-1", "5e3"])
def test_a_bad_chronica_port_is_named(monkeypatch, value):
    monkeypatch.setenv("CHRONICA_PORT", value)
    with pytest.raises(ValueError, match="CHRONICA_PORT"):
        resolve_port()
    with pytest.raises(ValueError, match="CHRONICA_PORT"):
        resolve_endpoint()


# -- where ranks connect ---------------------------------------------------------------


def test_ranks_connect_to_the_argument_else_master_addr_else_loopback(monkeypatch):
    assert resolve_endpoint() == ("127.0.0.1", DEFAULT_PORT)
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert resolve_endpoint(port=5000) == ("10.1.2.3", 5000)
    assert resolve_endpoint("node-7", 5000) == ("node-7", 5000)  # names are not resolved


@pytest.mark.parametrize("wildcard", ["*", "0.0.0.0", "::", "[::]", "0", "0.0", "::0"])
def test_a_wildcard_is_not_connectable_and_master_addr_or_loopback_stands_for_it(
    monkeypatch, wildcard
):
    assert resolve_endpoint(wildcard, 1234) == ("127.0.0.1", 1234)
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert resolve_endpoint(wildcard, 1234) == ("10.1.2.3", 1234)
    monkeypatch.setenv("MASTER_ADDR", "0.0.0.0")
    assert resolve_endpoint(wildcard, 1234) == ("127.0.0.1", 1234)


def test_an_endpoint_host_is_checked():
    with pytest.raises(ValueError, match="host"):
        resolve_endpoint("  ")
    with pytest.raises(TypeError, match="host"):
        resolve_endpoint(7)


# -- where the coordinator binds ---------------------------------------------------------


def test_the_bind_address_comes_first_from_host_then_chronica_bind_then_master_addr(
    monkeypatch,
):
    assert resolve_bind() == ("127.0.0.1", "default")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.2")
    assert resolve_bind() == ("127.0.0.2", "MASTER_ADDR")
    monkeypatch.setenv("CHRONICA_BIND", " 127.0.0.3 ")
    assert resolve_bind() == ("127.0.0.3", "CHRONICA_BIND")
    assert resolve_bind("127.0.0.4") == ("127.0.0.4", "host")


@pytest.mark.parametrize(
    "host, address",
    [("*", "0.0.0.0"), ("0.0.0.0", "0.0.0.0"), ("::", "::"), ("[::]", "::"), ("[::1]", "::1")],
)
def test_every_interface_and_bracketed_addresses_are_bound_as_asked(host, address):
    assert resolve_bind(host) == (address, "host")


def test_host_names_are_resolved_to_an_address():
    address, source = resolve_bind("localhost")
    assert source == "host" and address in ("127.0.0.1", "::1")


def test_a_master_addr_meaning_every_interface_is_refused_naming_the_opt_in(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "0")
    with pytest.raises(ValueError, match=r"CHRONICA_BIND=0\.0\.0\.0"):
        resolve_bind()
    monkeypatch.setenv("CHRONICA_BIND", "0.0.0.0")  # the opt-in wins
    assert resolve_bind() == ("0.0.0.0", "CHRONICA_BIND")


def test_bind_hosts_are_checked():
    with pytest.raises(ValueError, match="host=''"):
        resolve_bind("")
    with pytest.raises(TypeError, match="host=7"):
        resolve_bind(7)
    with pytest.raises(ValueError, match="does not resolve"):
        resolve_bind("no-such-host.invalid")


def test_listens_everywhere_reads_what_resolve_bind_returns():
    assert listens_everywhere(resolve_bind("*")[0])
    assert listens_everywhere(resolve_bind("::")[0])
    assert not listens_everywhere(resolve_bind("127.0.0.1")[0])


# -- a standalone coordinator ------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("10.0.0.1:50051", ("10.0.0.1", 50051)),
        (" node-3:7000 ", ("node-3", 7000)),
        ("[::1]:5000", ("::1", 5000)),
        ("", None),
    ],
)
def test_chronica_coordinator_names_host_and_port(value, expected):
    assert external_coordinator({"CHRONICA_COORDINATOR": value}) == expected


def test_chronica_coordinator_is_read_from_the_environment(monkeypatch):
    assert external_coordinator() is None
    monkeypatch.setenv("CHRONICA_COORDINATOR", "127.0.0.1:6000")
    assert external_coordinator() == ("127.0.0.1", 6000)


@pytest.mark.parametrize("value", ["nohostport", "10.0.0.1:99999", ":5000", "h:0", "h:port"])
def test_a_bad_chronica_coordinator_shows_the_form_expected(value):
    with pytest.raises(ValueError, match=r"CHRONICA_COORDINATOR=.*host:port.*10\.0\.0\.1:50051"):
        external_coordinator({"CHRONICA_COORDINATOR": value})


# -- bind failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, role, says",
    [
        (errno.EADDRINUSE, "router", "port 127.0.0.1:6000 is already in use"),
        (errno.EADDRINUSE, "pub", "port 6000 (port + 1, for publishing)"),
        (errno.EADDRNOTAVAIL, "router", "127.0.0.1 (from MASTER_ADDR) is not an address"),
        (errno.EACCES, "router", "ports below 1024 need privileges"),
        (errno.EPERM, "router", "cannot bind 127.0.0.1:6000 ("),
    ],
)
def test_a_bind_failure_is_explained_with_its_fix(code, role, says):
    text = bind_error(OSError(code, "failed"), "127.0.0.1", 6000, role, "MASTER_ADDR")
    assert text.startswith("chronica coordinator cannot bind 127.0.0.1:6000")
    assert says in text
    if code == errno.EADDRINUSE:
        assert "CHRONICA_PORT" in text and "port 0" in text


# -- a world that spans hosts ----------------------------------------------------------


@pytest.mark.parametrize(
    "env, evidence",
    [
        ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, "WORLD_SIZE=16 > LOCAL_WORLD_SIZE=8"),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "OMPI_COMM"),
        ({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "1"}, "PMI_SIZE=4"),
        ({"SLURM_JOB_NUM_NODES": "2"}, "SLURM_JOB_NUM_NODES=2"),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, None),
        ({"WORLD_SIZE": "8"}, None),
        ({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "1"}, None),
        ({}, None),
    ],
)
def test_the_launcher_tells_whether_the_world_spans_hosts(env, evidence):
    found = spans_hosts(env)
    assert found == evidence if evidence is None else evidence in found


@pytest.mark.parametrize(
    "setting, value, resolved",
    [
        ("MASTER_ADDR", "localhost", "resolves to 127.0.0.1 on this host"),
        ("MASTER_ADDR", "127.0.1.1", "MASTER_ADDR='127.0.1.1' resolves to 127.0.1.1"),
        ("CHRONICA_BIND", "::1", "CHRONICA_BIND='::1'"),
        (None, None, "unset, so loopback is the default"),
    ],
)
def test_a_loopback_bind_in_a_world_that_spans_hosts_is_refused_naming_the_fix(
    monkeypatch, setting, value, resolved
):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    if setting is not None:
        monkeypatch.setenv(setting, value)
    with pytest.raises(ValueError) as caught:
        resolve_bind()
    message = str(caught.value)
    assert "spans hosts (WORLD_SIZE=2 > LOCAL_WORLD_SIZE=1)" in message and resolved in message
    assert "Set MASTER_ADDR (or CHRONICA_BIND) to this node's address" in message


def test_a_real_address_or_every_interface_is_bound_in_a_world_that_spans_hosts(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert resolve_bind("10.1.2.3") == ("10.1.2.3", "host")
    assert resolve_bind("*") == ("0.0.0.0", "host")
