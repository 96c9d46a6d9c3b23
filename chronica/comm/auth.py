"""Optional CURVE authentication and encryption of the coordinator's sockets.

Without it, anyone who can reach the coordinator's ports can talk to it (see SECURITY.md).
With it, the ROUTER and PUB sockets are CURVE servers: a peer must prove that it holds the
secret key of a public key on the coordinator's allow-list, and every byte is encrypted.
A peer without keys, or with a key not on the list, fails the handshake: it never sees a
plan and the coordinator keeps serving the others.

Keys are Z85 text (40 characters, as ``zmq.curve_keypair()`` makes them) or certificate
files in the format of ``zmq.auth.create_certificates``. Configuration comes from the
arguments (``CurveServer`` / ``CurveClient``) or from the environment:

``CHRONICA_CURVE_DIR``            a folder as ``chronica coordinator --make-keys DIR`` writes
                                  it: ``server.key`` (every rank), ``server.key_secret``
                                  (the coordinator only), ``client.key_secret`` (every rank),
                                  ``allowed/*.key`` (client public keys the coordinator admits)
``CHRONICA_CURVE_SERVER_SECRET``  the coordinator's secret key (instead of the file)
``CHRONICA_CURVE_SERVER_PUBLIC``  the coordinator's public key (ranks; instead of the file)
``CHRONICA_CURVE_CLIENT_SECRET``  the rank's secret key (instead of the file)
``CHRONICA_CURVE_CLIENT_PUBLIC``  optional: checked against the secret key when given
``CHRONICA_CURVE_ALLOWED``        client public keys admitted, comma-separated (added to
                                  ``allowed/``)

Authentication is on as soon as one ``CHRONICA_CURVE_*`` variable is set, and then whatever
is missing is an error that names it: a half-configured job fails at start, never silently
in the clear. Secret keys never appear in messages or logs; public keys may.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = [
    "ENV_ALLOWED",
    "ENV_CLIENT_PUBLIC",
    "ENV_CLIENT_SECRET",
    "ENV_DIR",
    "ENV_SERVER_PUBLIC",
    "ENV_SERVER_SECRET",
    "CurveClient",
    "CurveServer",
    "HandshakeMonitor",
    "ZapGate",
    "make_keys",
    "require_curve",
]

logger = logging.getLogger("chronica")

ENV_DIR = "CHRONICA_CURVE_DIR"
ENV_SERVER_SECRET = "CHRONICA_CURVE_SERVER_SECRET"
ENV_SERVER_PUBLIC = "CHRONICA_CURVE_SERVER_PUBLIC"
ENV_CLIENT_SECRET = "CHRONICA_CURVE_CLIENT_SECRET"
ENV_CLIENT_PUBLIC = "CHRONICA_CURVE_CLIENT_PUBLIC"
ENV_ALLOWED = "CHRONICA_CURVE_ALLOWED"
_KNOWN = frozenset(
    {
        ENV_DIR,
        ENV_SERVER_SECRET,
        ENV_SERVER_PUBLIC,
        ENV_CLIENT_SECRET,
        ENV_CLIENT_PUBLIC,
        ENV_ALLOWED,
    }
)
_PREFIX = "CHRONICA_CURVE_"

# The ZAP domain of the coordinator's sockets: the authenticator answers for it only.
ZAP_DOMAIN = "chronica"
_Z85 = re.compile(rb"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
# Allow-lists beyond this are a configuration mistake (a wrong folder), not a job.
_MAX_ALLOWED = 1 << 16


def require_curve() -> None:
    """Raise ``RuntimeError`` unless this libzmq can do CURVE (it names the fix).

    Example::

        >>> require_curve()  # pyzmq's own wheels include CURVE: returns None
    """
    if not zmq.has("curve"):
        raise RuntimeError(
            f"CURVE authentication was asked for, but libzmq {zmq.zmq_version()} was built "
            f"without it; install pyzmq's own wheels (pip install --force-reinstall pyzmq), "
            f"which include it, or unset the {_PREFIX}* variables"
        )


def _key(value: str | bytes, name: str) -> bytes:
    """A Z85 key as bytes; the message names ``name`` and never shows a secret's value."""
    if not isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a Z85 CURVE key (str or bytes), not {type(value)}")
    raw = (value.encode("ascii", "replace") if isinstance(value, str) else value).strip()
    if not _Z85.fullmatch(raw):
        raise ValueError(
            f"{name} must be a 40-character Z85 CURVE key (as zmq.curve_keypair() makes; "
            f"got {len(raw)} characters or characters outside Z85)"
        )
    return raw


def _public_of(secret: bytes, name: str) -> bytes:
    try:
        return zmq.curve_public(secret)
    except zmq.ZMQError as exc:
        raise ValueError(f"{name} is not a valid CURVE secret key ({exc})") from None


def _check_pair(public: bytes | None, secret: bytes, public_name: str, secret_name: str) -> bytes:
    derived = _public_of(secret, secret_name)
    if public is not None and public != derived:
        raise ValueError(
            f"{public_name} is not the public key of {secret_name}; give the pair made "
            f"together (or leave {public_name} out: it is derived from the secret key)"
        )
    return derived


def _secret_file(path: Path, name: str) -> bytes:
    """The secret key of a ``.key_secret`` certificate, warning if others can read it."""
    try:
        mode = path.stat().st_mode
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{name}: cannot read the certificate {path} ({exc})") from None
    if secret is None:
        raise ValueError(f"{name}: {path} holds no secret key (use the .key_secret file)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning(
            "chronica: %s is readable by other users; chmod 600 it (it holds a secret key)", path
        )
    key = _key(secret, f"the secret key in {path}")
    where = f"the public key in {path}"
    _check_pair(_key(public, where), key, where, f"the secret key in {path}")
    return key


def _public_file(path: Path, name: str) -> bytes:
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{name}: cannot read the certificate {path} ({exc})") from None
    return _key(public, f"the public key in {path}")


def _curve_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``CHRONICA_CURVE_*`` variables that are set; an unknown name is an error."""
    found = {k: v for k, v in environ.items() if k.startswith(_PREFIX) and v.strip()}
    unknown = sorted(set(found) - _KNOWN)
    if unknown:
        raise ValueError(
            f"unknown variable(s) {', '.join(unknown)}; the CURVE settings are "
            f"{', '.join(sorted(_KNOWN))}"
        )
    return found


def _env_key(env: Mapping[str, str], name: str) -> bytes | None:
    return _key(env[name], name) if name in env else None


def _from_dir(env: Mapping[str, str], filename: str) -> Path | None:
    folder = env.get(ENV_DIR)
    if folder is None:
        return None
    if not Path(folder).is_dir():
        raise ValueError(f"{ENV_DIR}={folder!r} is not a folder")
    path = Path(folder) / filename
    return path if path.is_file() else None


@dataclass(frozen=True)
class CurveServer:
    """The coordinator's CURVE identity and the client public keys it admits.

    Guarantees (checked here, so a bad configuration fails before any socket exists): both
    keys are valid Z85, ``public`` belongs to ``secret``, and ``allowed`` holds at least
    one valid client public key: an empty allow-list would admit nobody. A key that is not
    ``str``/``bytes`` is a ``TypeError``, one that is not Z85 a ``ValueError``; the messages
    never show a secret key.

    Args:
        secret: the coordinator's Z85 secret key.
        allowed: the client public keys (Z85) it admits.
        public: its public key, checked against ``secret`` (default: derived from it).

    Example::

        >>> server_public, server_secret = zmq.curve_keypair()
        >>> client_public, client_secret = zmq.curve_keypair()
        >>> server = CurveServer(secret=server_secret, allowed={client_public})
    """

    secret: bytes
    allowed: frozenset[bytes]
    public: bytes = b""

    def __post_init__(self) -> None:
        require_curve()
        secret = _key(self.secret, "the coordinator's secret key")
        given = _key(self.public, "the coordinator's public key") if self.public else None
        public = _check_pair(given, secret, "public", "secret")
        if isinstance(self.allowed, (str, bytes)) or not isinstance(self.allowed, Iterable):
            raise TypeError(
                "allowed must be a collection of client public keys (a list or set of "
                f"Z85 str or bytes), not {type(self.allowed)}"
            )
        allowed = frozenset(_key(k, "a client public key in allowed") for k in self.allowed)
        if not allowed:
            raise ValueError(
                f"allowed is empty: no rank could connect; add the ranks' public keys "
                f"({ENV_ALLOWED} or {ENV_DIR}/allowed/*.key)"
            )
        if len(allowed) > _MAX_ALLOWED:
            raise ValueError(f"allowed holds {len(allowed)} keys, more than {_MAX_ALLOWED}")
        object.__setattr__(self, "secret", secret)
        object.__setattr__(self, "public", public)
        object.__setattr__(self, "allowed", allowed)

    def __repr__(self) -> str:  # the dataclass repr would print the secret key
        return f"CurveServer(public={self.public.decode()!r}, allowed={len(self.allowed)} keys)"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CurveServer | None:
        """The coordinator's configuration from ``CHRONICA_CURVE_*``; ``None`` if none set.

        Args:
            environ: the variables to read (default ``os.environ``).
        """
        env = _curve_env(os.environ if environ is None else environ)
        if not env:
            return None
        secret = _env_key(env, ENV_SERVER_SECRET)
        if secret is None and (path := _from_dir(env, "server.key_secret")) is not None:
            secret = _secret_file(path, ENV_DIR)
        if secret is None:
            raise ValueError(
                f"CURVE is on ({', '.join(sorted(env))} set) but the coordinator has no secret "
                f"key: set {ENV_SERVER_SECRET}, or {ENV_DIR} to a folder with server.key_secret "
                f"(chronica coordinator --make-keys DIR writes one)"
            )
        _check_pair(_env_key(env, ENV_SERVER_PUBLIC), secret, ENV_SERVER_PUBLIC, ENV_SERVER_SECRET)
        allowed = [
            _key(k, f"an entry of {ENV_ALLOWED}")
            for k in env.get(ENV_ALLOWED, "").replace(",", " ").split()
        ]
        if ENV_DIR in env and (Path(env[ENV_DIR]) / "allowed").is_dir():
            folder = Path(env[ENV_DIR]) / "allowed"
            allowed += [_public_file(p, ENV_DIR) for p in sorted(folder.glob("*.key"))]
        return cls(secret=secret, allowed=frozenset(allowed))

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server of the ``chronica`` ZAP domain (before bind); it
        admits nobody unless a ``ZapGate`` runs on its context.

        Args:
            sock: a ZeroMQ socket not bound yet.
        """
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        # Without a ZAP handler libzmq admits any client that knows the server's public key;
        # enforcing the domain makes a missing or stopped authenticator refuse everyone.
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


@dataclass(frozen=True)
class CurveClient:
    """A rank's CURVE keys and the coordinator's public key it expects.

    Guarantees: all keys are valid Z85 and ``public`` belongs to ``secret``.

    Args:
        server_public: the coordinator's Z85 public key.
        secret: the rank's Z85 secret key.
        public: the rank's public key, checked against ``secret`` (default: derived).

    Example::

        >>> client = CurveClient(server_public=server.public, secret=client_secret)
    """

    server_public: bytes
    secret: bytes
    public: bytes = b""

    def __post_init__(self) -> None:
        require_curve()
        server = _key(self.server_public, "server_public")
        secret = _key(self.secret, "the rank's secret key")
        given = _key(self.public, "the rank's public key") if self.public else None
        object.__setattr__(self, "server_public", server)
        object.__setattr__(self, "secret", secret)
        object.__setattr__(self, "public", _check_pair(given, secret, "public", "secret"))

    def __repr__(self) -> str:  # the dataclass repr would print the secret key
        return (
            f"CurveClient(public={self.public.decode()!r}, "
            f"server_public={self.server_public.decode()!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CurveClient | None:
        """A rank's configuration from ``CHRONICA_CURVE_*``; ``None`` if none is set.

        Args:
            environ: the variables to read (default ``os.environ``).
        """
        env = _curve_env(os.environ if environ is None else environ)
        if not env:
            return None
        server = _env_key(env, ENV_SERVER_PUBLIC)
        if server is None and (path := _from_dir(env, "server.key")) is not None:
            server = _public_file(path, ENV_DIR)
        if server is None and ENV_SERVER_SECRET in env:  # rank 0 beside its own coordinator
            server = _public_of(_key(env[ENV_SERVER_SECRET], ENV_SERVER_SECRET), ENV_SERVER_SECRET)
        if server is None:
            raise ValueError(
                f"CURVE is on ({', '.join(sorted(env))} set) but the rank does not know the "
                f"coordinator's public key: set {ENV_SERVER_PUBLIC}, or {ENV_DIR} to a folder "
                f"with server.key"
            )
        secret = _env_key(env, ENV_CLIENT_SECRET)
        if secret is None and (path := _from_dir(env, "client.key_secret")) is not None:
            secret = _secret_file(path, ENV_DIR)
        if secret is None:
            raise ValueError(
                f"CURVE is on ({', '.join(sorted(env))} set) but the rank has no secret key: "
                f"set {ENV_CLIENT_SECRET}, or {ENV_DIR} to a folder with client.key_secret"
            )
        _check_pair(_env_key(env, ENV_CLIENT_PUBLIC), secret, ENV_CLIENT_PUBLIC, ENV_CLIENT_SECRET)
        return cls(server_public=server, secret=secret)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the coordinator (before connect).

        Args:
            sock: a ZeroMQ socket not connected yet.
        """
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


def make_keys(folder: str | os.PathLike[str]) -> Path:
    """Write a server and a client key pair into ``folder`` in the ``CHRONICA_CURVE_DIR``
    layout (``allowed/client.key`` admits the client key); secret files are mode 600.
    Refuses (``ValueError``) to overwrite existing keys.

    Args:
        folder: where to write them (created if missing).

    Example::

        >>> make_keys("/secure/chronica-keys")  # then CHRONICA_CURVE_DIR=/secure/chronica-keys
        PosixPath('/secure/chronica-keys')
    """
    require_curve()
    root = Path(folder)
    allowed = root / "allowed"
    existing = [p for p in (root / "server.key_secret", root / "client.key_secret") if p.exists()]
    if existing:
        raise ValueError(f"{existing[0]} exists; choose an empty folder (keys are not replaced)")
    allowed.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for name in ("server", "client"):
        # Create the secret file 600 before the key is written into it.
        os.close(os.open(root / f"{name}.key_secret", os.O_CREAT | os.O_WRONLY, 0o600))
        zmq.auth.create_certificates(root, name)
    (allowed / "client.key").write_bytes((root / "client.key").read_bytes())
    return root


class ZapGate:
    """A ``ThreadAuthenticator`` on ``context`` that admits the public keys of ``curve``.

    Refused keys are counted and queued (at most 64 kept) for the coordinator to log from its
    own thread; ``stop()`` stops the authenticator thread (idempotent).

    Args:
        context: the ZeroMQ context of the CURVE server sockets.
        curve: the configuration whose ``allowed`` keys are admitted.

    Example::

        >>> zap = ZapGate(context, server)  # before the sockets of ``context`` bind
        >>> zap.stop()
    """

    def __init__(self, context: zmq.Context, curve: CurveServer) -> None:
        require_curve()
        self._allowed = curve.allowed
        self._lock = threading.Lock()
        self.refused = 0
        self._recent: deque[bytes] = deque(maxlen=64)
        self._auth: ThreadAuthenticator | None = ThreadAuthenticator(
            context, log=logging.getLogger("chronica.zap")
        )
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """The ZAP decision for a client's Z85 public ``key`` (authenticator thread).

        Args:
            domain: the ZAP domain of the socket asked about.
            key: the client's Z85 public key.
        """
        if domain == ZAP_DOMAIN and key in self._allowed:
            return True
        with self._lock:
            self.refused += 1
            self._recent.append(key)
        return False

    def take_refused(self) -> list[bytes]:
        """Public keys refused since the last call."""
        with self._lock:
            keys = list(self._recent)
            self._recent.clear()
        return keys

    def stop(self) -> None:
        """Stop the authenticator thread (idempotent): the sockets then admit nobody."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def describe_handshake_failure(event: int, value: int) -> str:
    """What a failed ZeroMQ handshake (a monitor event) most likely means, in words.

    Args:
        event: the monitor event (``zmq.EVENT_HANDSHAKE_FAILED_*``).
        value: the event's value (a ZAP status or a ZMTP error code).

    Example::

        >>> describe_handshake_failure(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
        "the coordinator refused this peer's CURVE key (ZAP status 400)"
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the coordinator refused this peer's CURVE key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return (
                "one side uses CURVE and the other does not (set the same CHRONICA_CURVE_* "
                "configuration for the coordinator and the ranks)"
            )
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "CURVE decryption failed (the client expects another coordinator public key)"
        return f"not a ZeroMQ peer of this protocol (ZMTP error {value:#x})"
    return (
        "the connection ended during its handshake: the coordinator's gate cut it (it keeps "
        "ranks that said hello first and evicts the oldest other connections when more than "
        "4096 are open, e.g. under a connection flood; the rank reconnects by itself), the "
        "coordinator restarted, or the CURVE settings or keys do not match (a wrong "
        "coordinator public key)"
    )


class HandshakeMonitor:
    """Failed handshakes of one socket, read without blocking (a ZeroMQ socket monitor).

    Args:
        sock: the socket to watch (call ``close()`` before closing it).

    Example::

        >>> monitor = HandshakeMonitor(dealer)
        >>> monitor.failures()  # descriptions, e.g. of a CURVE key the server refused
        []
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self._owner = sock
        self.socket: zmq.Socket | None = sock.get_monitor_socket(_FAILED)

    def failures(self) -> list[str]:
        """Descriptions of the handshakes that failed since the last call."""
        found: list[str] = []
        while self.socket is not None:
            try:
                event = recv_monitor_message(self.socket, zmq.NOBLOCK)
            except zmq.ZMQError:  # nothing queued (Again), or the socket is gone
                break
            found.append(describe_handshake_failure(event["event"], event["value"]))
        return found

    def close(self) -> None:
        """Stop monitoring (idempotent); call before closing the monitored socket."""
        if self.socket is not None:
            try:
                self._owner.disable_monitor()
            except zmq.ZMQError:
                pass  # the monitored socket is already closed
            self.socket.close(0)
            self.socket = None
