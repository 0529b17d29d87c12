"""`python -m nbdist ...` runs the `nbdist` command (see `nbdist.app.cli`)."""

import sys

from nbdist.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
