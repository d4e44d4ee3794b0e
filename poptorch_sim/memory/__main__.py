"""``python -m poptorch_sim.memory``: run a PopTorch program up to its first compile and print
the memory per IPU and the predicted time per call (``poptorch_sim.timing``).

    python -m poptorch_sim.memory train.py --epochs 1
    python -m poptorch_sim.memory --plot memory.png train.py

The program runs as ``__main__`` with its own arguments until its first ``trainingModel`` or
``inferenceModel`` compiles (its first call or ``compile``); nothing runs on the IPUs. The report
is printed whether the model fits or not; the exit status is 1 when an IPU is over its limit.
"""

from __future__ import annotations

import argparse
import sys

from ..cli.program import run_program
from .build import CompiledOnly, stop_after_compile

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the program to its first compile and print the report.

    Returns:
        0 when every IPU fits, 1 when one does not, 2 when the program compiled no model.
    """
    parser = argparse.ArgumentParser(
        prog="python -m poptorch_sim.memory",
        description="Print the memory per IPU of a PopTorch program's first compiled model.",
    )
    parser.add_argument("--plot", help="also draw the report into this image file")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    args = parser.parse_args(argv)
    stop_after_compile(True)
    try:
        run_program(args.script, args.args)
    except CompiledOnly as done:
        print(done.report)
        print(f"estimated in {1e3 * done.report.seconds:.1f} ms")
        if done.timing is not None:
            print()
            print(done.timing)
        if args.plot:
            print(f"plot: {done.report.plot(args.plot)}")
        return 1 if done.report.over_limit else 0
    finally:
        stop_after_compile(False)
    print(f"{args.script} finished without compiling a model", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
