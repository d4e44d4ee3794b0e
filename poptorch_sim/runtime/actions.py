"""The record a schedule is made of: ``Action`` (``1F0``), one step of one IPU.

The per-IPU lists are a ``Schedule`` (``clock.py``). See the glossary in
``poptorch_sim.runtime.schedules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["ActionKind", "Action", "COMPUTE"]


class ActionKind(Enum):
    """What an action does."""

    F = "F"
    B = "B"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    STEP = "STEP"


COMPUTE = frozenset({ActionKind.F, ActionKind.B, ActionKind.STEP})


@dataclass(frozen=True)
class Action:
    """One step of one IPU: ``kind`` of ``stage`` on micro-batch ``mb`` (``None`` for STEP)."""

    stage: int
    kind: ActionKind
    mb: int | None = None

    def __repr__(self) -> str:
        return f"{self.stage}{self.kind.value}{'' if self.mb is None else self.mb}"
