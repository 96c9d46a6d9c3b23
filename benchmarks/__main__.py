"""``python -m benchmarks [--quick] [--only NAME ...]``: run the benchmarks (see run_all)."""

import logging

from benchmarks.run_all import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    raise SystemExit(main(prog="python -m benchmarks"))
