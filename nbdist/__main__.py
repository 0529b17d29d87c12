"""`python -m nbdist ...` runs the `nbdist` command (see `nbdist.cli`)."""

import sys

from nbdist.cli import main

if __name__ == "__main__":
    sys.exit(main())
