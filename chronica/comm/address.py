"""Where the coordinator listens and where ranks find it: ports, bind addresses, endpoints.

One job: turn the settings a user gives (arguments, ``CHRONICA_BIND``, ``MASTER_ADDR``,
``CHRONICA_PORT``, ``CHRONICA_COORDINATOR``) into numeric addresses and ports, refusing what
cannot work with an error that names the setting and the fix. Nothing here opens a socket.

* ``resolve_bind``: the address the coordinator binds (loopback unless told otherwise;
  every interface only when ``host`` or ``CHRONICA_BIND`` asks for it by name);
* ``resolve_endpoint``: where ranks connect (``MASTER_ADDR`` or loopback);
* ``resolve_port``: the ROUTER port (the PUB socket uses the next one);
* ``external_coordinator``: a standalone coordinator named by ``CHRONICA_COORDINATOR``;
* ``listens_everywhere``, ``bind_error``: what a bound address means, why a bind failed;
* ``spans_hosts``: whether the launcher says the world has ranks on other hosts (then a
  loopback bind is refused: no other host could reach it).

SECURITY.md ("What listens on the network") states the rules in prose.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Mapping

from chronica.core.checks import check_int

__all__ = [
    "DEFAULT_PORT",
    "ENV_BIND",
    "ENV_COORDINATOR",
    "ENV_PORT",
    "bind_error",
    "external_coordinator",
    "listens_everywhere",
    "resolve_bind",
    "resolve_endpoint",
    "resolve_port",
    "spans_hosts",
]

DEFAULT_PORT = 50051
ENV_BIND = "CHRONICA_BIND"
ENV_PORT = "CHRONICA_PORT"
ENV_COORDINATOR = "CHRONICA_COORDINATOR"
_WILDCARDS = {"*": "0.0.0.0", "0.0.0.0": "0.0.0.0", "::": "::", "[::]": "::"}
# What ``resolve_bind`` returns for "every interface", IPv4 and IPv6.
_EVERYWHERE = ("0.0.0.0", "::")


def _port(value: object, name: str) -> int:
    hint = " (0: any free port; the coordinator also uses the next port)"
    return check_int(name, value, 0, 65534, hint)


def _check_host(name: str, value: object) -> str:
    """``value`` stripped, if it is a non-empty string; else ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} must be a host name or address (a str)")
    if not value.strip():
        raise ValueError(f"{name}={value!r} must be a host name or address")
    return value.strip()


def resolve_port(port: int | None = None) -> int:
    """The coordinator's ROUTER port: ``port``, else ``CHRONICA_PORT``, else
    ``DEFAULT_PORT``; the PUB socket uses the next one.

    Args:
        port: the port, 0 for any free one; ``None`` reads ``CHRONICA_PORT``.

    A port that is not an int is a ``TypeError``, one outside ``[0, 65534]`` (the next port
    must exist too) a ``ValueError``; both name where it came from.

    Example::

        >>> resolve_port(5000)
        5000
        >>> resolve_port()  # CHRONICA_PORT unset
        50051
    """
    if port is not None:
        return _port(port, "port")
    text = os.environ.get(ENV_PORT)
    if not text:
        return DEFAULT_PORT
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{ENV_PORT}={text!r} must be a port number") from None
    return _port(value, ENV_PORT)


def resolve_endpoint(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where ranks connect: ``(host, port)`` from the arguments, else ``MASTER_ADDR`` /
    ``CHRONICA_PORT``, else loopback and ``DEFAULT_PORT``. The PUB socket uses ``port + 1``.
    A wildcard ``host`` (a bind-everywhere address) is not connectable: ``MASTER_ADDR`` or
    loopback stands for it.

    Args:
        host: the coordinator's host name or address; ``None`` reads ``MASTER_ADDR``.
        port: its ROUTER port; ``None`` reads ``CHRONICA_PORT`` (see ``resolve_port``).

    Example::

        >>> resolve_endpoint("10.0.0.1", 5000)
        ('10.0.0.1', 5000)
        >>> resolve_endpoint("0.0.0.0", 5000)  # MASTER_ADDR unset: loopback stands for it
        ('127.0.0.1', 5000)
    """
    if host is not None:
        _check_host("host", host)
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    host = host or master
    if _everywhere(host):
        host = master if not _everywhere(master) else "127.0.0.1"
    return host, resolve_port(port)


def _everywhere(host: str) -> bool:
    """Whether ``host`` is a spelling of "all interfaces" (``*``, ``0.0.0.0``, ``0``,
    ``0.0``, ``::``, ``::0``...), which binds everywhere and connects nowhere."""
    literal = host.strip().removeprefix("[").removesuffix("]")
    if literal in _WILDCARDS:
        return True
    try:
        return ipaddress.ip_address(literal).is_unspecified
    except ValueError:
        pass
    try:
        return socket.inet_aton(literal) == bytes(4)  # the short IPv4 forms: "0", "0.0"
    except OSError:
        return False


def listens_everywhere(address: str) -> bool:
    """Whether ``address``, as ``resolve_bind`` returns it, is every interface.

    Args:
        address: a numeric address from ``resolve_bind`` (or a coordinator's ``endpoint``).

    Example::

        >>> listens_everywhere("0.0.0.0"), listens_everywhere("127.0.0.1")
        (True, False)
    """
    return address in _EVERYWHERE


def resolve_bind(host: str | None = None) -> tuple[str, str]:
    """The numeric address the coordinator binds, and the setting it came from.

    ``host`` if given, else ``CHRONICA_BIND``, else ``MASTER_ADDR``, else ``127.0.0.1``; a
    host name is resolved (ZeroMQ binds addresses, not names). Every interface (``*``,
    ``0.0.0.0``, ``::`` or any other spelling: ``0``, ``0.0``, ``::0``, a name resolving to
    one) is bound only when ``host`` or ``CHRONICA_BIND`` says so: a ``MASTER_ADDR`` that
    means every interface is an error, never a silent bind to every interface.

    Args:
        host: the address or host name to bind; ``None`` reads the environment.

    A ``host`` that is not a string is a ``TypeError``; an empty one, a name that does not
    resolve, a ``MASTER_ADDR`` meaning every interface, or a loopback address while the
    launcher says the world spans hosts (``spans_hosts``) a ``ValueError`` naming the
    setting, what it resolved to and the fix.

    Example::

        >>> resolve_bind()  # no CHRONICA_BIND, no MASTER_ADDR
        ('127.0.0.1', 'default')
        >>> resolve_bind("*")
        ('0.0.0.0', 'host')
    """
    candidates = (
        ("host", host),
        (ENV_BIND, os.environ.get(ENV_BIND) or None),
        ("MASTER_ADDR", os.environ.get("MASTER_ADDR") or None),
    )
    for source, value in candidates:
        if value is None:
            continue
        value = _check_host(source, value)
        address = _WILDCARDS.get(value) or _numeric(value, source)
        # Every spelling of "all interfaces", a name that resolves to one included.
        if _everywhere(address.split("%")[0]) and source == "MASTER_ADDR":
            raise ValueError(
                f"MASTER_ADDR={value!r} would make the coordinator listen on every "
                f"interface; set MASTER_ADDR to this node's address, or {ENV_BIND}=0.0.0.0 "
                f"to listen everywhere on purpose (then enable CURVE: see SECURITY.md)"
            )
        _refuse_loopback(address, value, source)
        return address, source
    _refuse_loopback("127.0.0.1", "127.0.0.1", "default")
    return "127.0.0.1", "default"


# (world size, ranks on this host) as launchers set them: torchrun and torch.distributed,
# Open MPI, MPICH/Intel MPI (hydra); Slurm says the node count directly.
_LAUNCHERS = (
    ("WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "MPI_LOCALNRANKS"),
)


def spans_hosts(environ: Mapping[str, str] | None = None) -> str | None:
    """The launcher's evidence that the job's ranks run on more than one host (e.g.
    ``"WORLD_SIZE=2 > LOCAL_WORLD_SIZE=1"``), or ``None`` when it says one host or nothing.

    Args:
        environ: where to read the launcher's variables (default ``os.environ``).

    Example::

        >>> spans_hosts({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
        'WORLD_SIZE=16 > LOCAL_WORLD_SIZE=8'
        >>> spans_hosts({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) is None
        True
    """
    env = os.environ if environ is None else environ
    for world, local in _LAUNCHERS:
        try:
            if int(env[world]) > int(env[local]) > 0:
                return f"{world}={env[world]} > {local}={env[local]}"
        except (KeyError, ValueError):
            continue
    for nodes in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env.get(nodes, "")
        if value.isdigit() and int(value) > 1:
            return f"{nodes}={value}"
    return None


def _refuse_loopback(address: str, value: str, source: str) -> None:
    """``ValueError`` if ``address`` is loopback while the launcher says the world spans
    hosts: the other hosts' ranks could never reach it, and every window would be static."""
    evidence = spans_hosts()
    try:
        loopback = ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return
    if evidence is None or not loopback:
        return
    how = (
        f"{source} is unset, so loopback is the default"
        if source == "default"
        else (
            f"{source}={value!r} resolves to {address} on this host"
            + (
                " (Debian and Ubuntu map a host's own name to 127.0.1.1 in /etc/hosts)"
                if value != address
                else ""
            )
        )
    )
    raise ValueError(
        f"chronica coordinator would listen on {address}, a loopback address, but the job "
        f"spans hosts ({evidence}): ranks on other hosts could never reach it. {how}. Set "
        f"MASTER_ADDR (or {ENV_BIND}) to this node's address on the network the ranks share "
        f"(its IP, or a name that resolves to it on every host), or map the name to that "
        f"address in /etc/hosts"
    )


def _numeric(host: str, source: str) -> str:
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(literal))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(literal, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise ValueError(
            f"{source}={host!r} does not resolve ({exc}); give this node's IP address"
        ) from None
    addresses = [a for a in (info[4][0] for info in infos) if isinstance(a, str)]
    return next((a for a in addresses if ":" not in a), addresses[0])


def external_coordinator(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The standalone coordinator ``CHRONICA_COORDINATOR=host:port`` names, or ``None``.

    Args:
        environ: where to read the variable (default ``os.environ``).

    A value that is not ``host:port`` with a port in ``[1, 65534]`` (the PUB socket is on
    the next port) is a ``ValueError`` that shows the expected form; an IPv6 host may be
    bracketed (``[::1]:50051``).

    Example::

        >>> external_coordinator({"CHRONICA_COORDINATOR": "10.0.0.1:50051"})
        ('10.0.0.1', 50051)
        >>> external_coordinator({}) is None
        True
    """
    text = (os.environ if environ is None else environ).get(ENV_COORDINATOR, "").strip()
    if not text:
        return None
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 1 <= int(port) <= 65534:
        raise ValueError(
            f"{ENV_COORDINATOR}={text!r} must be host:port with a port in [1, 65534] "
            f"(the coordinator also uses port + 1), e.g. 10.0.0.1:50051"
        )
    return host, int(port)


def bind_error(exc: OSError, host: str, port: int, role: str, source: str) -> str:
    """Why binding ``host:port`` failed, and the fix, in one sentence for a ``RuntimeError``.

    Args:
        exc: the ``OSError`` that ``bind`` raised.
        host: the address bound (as ``resolve_bind`` returned it).
        port: the port that failed.
        role: ``"router"`` (the port asked for) or ``"pub"`` (the next one, for publishing).
        source: the setting ``host`` came from (``resolve_bind``'s second value).

    Example::

        >>> bind_error(OSError(errno.EACCES, "denied"), "127.0.0.1", 80, "router", "default")
        'chronica coordinator cannot bind 127.0.0.1:80: ports below 1024 need privileges'
    """
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        what = "port" if role == "router" else f"port {port} (port + 1, for publishing) of"
        return (
            f"chronica coordinator cannot bind {where}: {what} {where} is already in use "
            f"(another job, or a coordinator still running); pass "
            f"DynamicOptions(port=...) (chronica coordinator --port) or set {ENV_PORT} "
            f"to a free port P with P+1 free too, or port 0 for any free ports"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"chronica coordinator cannot bind {where}: {host} (from "
            f"{source}) is not an address of this machine; set MASTER_ADDR or "
            f"{ENV_BIND} to one of its addresses (127.0.0.1 on a single node)"
        )
    if exc.errno == errno.EACCES:
        return f"chronica coordinator cannot bind {where}: ports below 1024 need privileges"
    return f"chronica coordinator cannot bind {where} ({exc})"
