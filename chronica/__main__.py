"""``python -m chronica``: the ``chronica`` command (``demo``, ``simulate``, ``bench``,
``coordinator``), for environments where the console script is not on ``PATH``."""

import sys

from chronica.cli import main

if __name__ == "__main__":
    sys.exit(main())
