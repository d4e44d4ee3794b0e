"""``python -m poptorch_sim.shard`` runs ``poptorch_sim/cli/shard.py``; kept here for ``-m``."""

import sys

from .cli.shard import main

if __name__ == "__main__":
    sys.exit(main())
