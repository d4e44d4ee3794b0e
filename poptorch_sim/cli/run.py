"""``python -m poptorch_sim SCRIPT [ARGS...]``: run an unmodified PopTorch script."""

from __future__ import annotations

import sys

import poptorch  # noqa: F401  (makes ``import poptorch`` resolve to poptorch_sim)

from .program import run_program

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` with ``argv[1:]`` as its arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m poptorch_sim SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    run_program(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
