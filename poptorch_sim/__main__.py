"""``python -m poptorch_sim SCRIPT [ARGS...]`` runs ``poptorch_sim/cli/run.py``; kept here for ``-m``."""

import sys

from .cli.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
