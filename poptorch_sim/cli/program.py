"""Runs a user's Python program in this process, as ``python program.py args...`` would."""

from __future__ import annotations

import os
import runpy
import sys

__all__ = ["run_program"]


def run_program(program: str, args: list[str]) -> None:
    """Run ``program`` as ``__main__`` with ``args`` as its command line.

    Its folder goes first on ``sys.path``, so it imports its sibling modules as it would when
    started directly.

    Args:
        program: the path of the Python file.
        args: its arguments (``sys.argv[1:]`` inside it).
    """
    sys.argv = [program, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    runpy.run_path(program, run_name="__main__")
