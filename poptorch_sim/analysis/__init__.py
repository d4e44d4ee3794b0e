"""One analysis of a compiled program, made once per compile, that the memory and time estimates read.

    ops.py        FLOPs and bytes per op of a stage's forward (a dispatch mode)
    program.py    ``ProgramAnalysis``: stages, their IPUs, activations and ops, the schedule

The analysis runs each stage's forward once on fake tensors (``memory/activations.py``): the
same run gives the bytes a stage saves for backward (memory) and the FLOPs and bytes of its ops
(time). ``memory.build`` and ``timing.build`` each read it; neither runs the model again.
"""

from __future__ import annotations

from .ops import OpCounter, OpTotals, op_kind

__all__ = ["OpCounter", "OpTotals", "op_kind"]
