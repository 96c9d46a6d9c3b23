"""``chronica coordinator``: the coordinator as a process of its own, for multi-node jobs.

It needs what every rank's sampler is built from: the sizes (any file ``chronica simulate
--sizes`` reads: text with one number per line, ``.npy``, or a ``.csv``/``.parquet`` column
named with ``--column``; one reader, ``chronica.sizes_io``) and the sampler's arguments.
Ranks find it through ``CHRONICA_COORDINATOR=host:port``; a rank whose sizes or arguments
differ is refused with an error that says so. It serves until interrupted (Ctrl-C or SIGTERM).

It binds ``--host`` (else ``CHRONICA_BIND``, else ``MASTER_ADDR``, else 127.0.0.1); every
interface only when one of them says ``0.0.0.0``. ``--make-keys DIR`` writes CURVE keys for
``CHRONICA_CURVE_DIR`` and exits (see ``chronica.comm.auth`` and SECURITY.md).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

import numpy as np

from chronica import sizes_io
from chronica.comm.address import listens_everywhere
from chronica.comm.auth import ENV_DIR, make_keys
from chronica.comm.coordinator import Coordinator
from chronica.core import ScheduleConfig, Scheduler, validate_sizes
from chronica.sizes_io import SIZES_HELP

__all__ = ["main"]

logger = logging.getLogger("chronica")


def _load_sizes(path: Path, column: str | None) -> np.ndarray:
    """The sizes file, read as ``chronica simulate --sizes`` reads it; ``ValueError`` names
    ``--sizes``/``--column`` and the fix."""
    return validate_sizes(sizes_io.read_sizes(path, column), name=sizes_io.describe(path, column))


def build_parser() -> argparse.ArgumentParser:
    """The command line; the names follow the samplers' arguments.

    Example::

        >>> build_parser().parse_args(["--sizes", "sizes.npy", "--world", "8"]).world
        8
    """
    parser = argparse.ArgumentParser(
        prog="chronica coordinator",
        description="Serve kind='dynamic' plans to the ranks of a multi-node job.",
    )
    parser.add_argument("--sizes", type=Path, help=f"{SIZES_HELP} (required)")
    parser.add_argument("--column", metavar="NAME", help="column of a .csv/.parquet --sizes file")
    parser.add_argument("--world", type=int, help="number of ranks (required)")
    parser.add_argument("--batch-size", type=int, help="global batch (required)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shuffle", default="global", help="shuffle policy name")
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--cost", default="linear", help="linear or quadratic")
    parser.add_argument("--variable-batch", action="store_true")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--min-batch", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument(
        "--host",
        default=None,
        help="address to bind (default CHRONICA_BIND, else MASTER_ADDR, else 127.0.0.1; "
        "0.0.0.0 for every interface)",
    )
    parser.add_argument("--port", type=int, default=None, help="default CHRONICA_PORT or 50051")
    parser.add_argument(
        "--make-keys",
        type=Path,
        metavar="DIR",
        help=f"write CURVE server and client keys into DIR (for {ENV_DIR}) and exit",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the coordinator until SIGINT or SIGTERM; returns the exit status.

    Bad arguments end the process with a message naming them (``SystemExit``), never a
    traceback: a missing ``--sizes``/``--world``/``--batch-size``, a sizes file that cannot
    be read, a port in use.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Example::

        >>> main(["--sizes", "sizes.npy", "--world", "8", "--batch-size", "256"])
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.make_keys is not None:
        try:
            folder = make_keys(args.make_keys)
        except (ValueError, RuntimeError, OSError) as exc:
            raise SystemExit(f"chronica coordinator: {exc}") from None
        print(
            f"CURVE keys in {folder}: give every rank and the coordinator {ENV_DIR}={folder} "
            f"(the coordinator needs server.key_secret, the ranks server.key and "
            f"client.key_secret; allowed/ lists the client keys admitted)",
            flush=True,
        )
        return 0
    required = (("--sizes", args.sizes), ("--world", args.world), ("--batch-size", args.batch_size))
    missing = [flag for flag, value in required if value is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    try:
        return _serve(args)
    except (ValueError, RuntimeError) as exc:  # bad arguments, a port in use: no traceback
        raise SystemExit(f"chronica coordinator: {exc}") from None


def _serve(args: argparse.Namespace) -> int:
    config = ScheduleConfig(
        num_replicas=args.world,
        batch_size=args.batch_size,
        kind="dynamic",
        shuffle=args.shuffle,
        seed=args.seed,
        drop_last=args.drop_last,
        cost=args.cost,
        variable_batch=args.variable_batch,
        window=args.window,
        min_batch=args.min_batch,
        max_batch=args.max_batch,
    )
    scheduler = Scheduler(_load_sizes(args.sizes, args.column), config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Coordinator(scheduler, args.host, args.port) as coordinator:
        assert coordinator.endpoint is not None  # start() bound the sockets
        host, port, pub = coordinator.endpoint
        reach = "<this node's address>" if listens_everywhere(host) else host
        auth = "CURVE on" if coordinator.curve is not None else "no authentication"
        print(
            f"chronica coordinator on {host}:{port} (pub {pub}, {auth}); ranks: "
            f"CHRONICA_COORDINATOR={reach}:{port}",
            flush=True,
        )
        stop.wait()
        logger.info("chronica: coordinator stopping: %s", coordinator.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
