"""``python -m poptorch_sim.poprun`` runs ``poptorch_sim/cli/poprun.py``; kept here for ``-m``."""

import sys

from .cli.poprun import main

if __name__ == "__main__":
    sys.exit(main())
