"""``chronica coordinator``: the coordinator as a process of its own, for multi-node jobs.

It needs what every rank's sampler is built from: the sizes (a ``.npy`` file or a text file
with one number per line) and the sampler's arguments. Ranks find it through
``CHRONICA_COORDINATOR=host:port``; a rank whose sizes or arguments differ is refused with
an error that says so. It serves until interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

import numpy as np

from chronica.comm.coordinator import Coordinator
from chronica.core import ScheduleConfig, Scheduler

__all__ = ["main"]

logger = logging.getLogger("chronica")


def _load_sizes(path: Path) -> np.ndarray:
    if not path.is_file():
        raise SystemExit(f"chronica coordinator: --sizes {path} is not a file")
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    return np.loadtxt(path, dtype=np.float64, ndmin=1)


def build_parser() -> argparse.ArgumentParser:
    """The command line; the names follow the samplers' arguments."""
    parser = argparse.ArgumentParser(
        prog="chronica coordinator",
        description="Serve kind='dynamic' plans to the ranks of a multi-node job.",
    )
    parser.add_argument("--sizes", type=Path, required=True, help=".npy or text, one per line")
    parser.add_argument("--world", type=int, required=True, help="number of ranks")
    parser.add_argument("--batch-size", type=int, required=True, help="global batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shuffle", default="global", help="shuffle policy name")
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--cost", default="linear", help="linear or quadratic")
    parser.add_argument("--variable-batch", action="store_true")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--min-batch", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument(
        "--host", default=None, help="interface to bind (default MASTER_ADDR, else 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=None, help="default CHRONICA_PORT or 50051")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the coordinator until SIGINT or SIGTERM."""
    args = build_parser().parse_args(argv)
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
    scheduler = Scheduler(_load_sizes(args.sizes), config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Coordinator(scheduler, args.host, args.port) as coordinator:
        host, port, pub = coordinator.endpoint  # type: ignore[misc]
        print(
            f"chronica coordinator on {host}:{port} (pub {pub}); ranks: "
            f"CHRONICA_COORDINATOR={host}:{port}",
            flush=True,
        )
        stop.wait()
        logger.info("chronica: coordinator stopping: %s", coordinator.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
