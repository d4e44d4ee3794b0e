"""``python -m poptorch_sim.poprun``: PopRun's launcher (see ``poptorch_sim/distributed/launcher.py``)."""

from __future__ import annotations

import sys

from .distributed.launcher import main

if __name__ == "__main__":
    sys.exit(main())
