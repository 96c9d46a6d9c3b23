"""``python -m chronica.demo``: the same as ``chronica demo``."""

import sys

from chronica.demo.cli import main

sys.exit(main(sys.argv[1:]))
