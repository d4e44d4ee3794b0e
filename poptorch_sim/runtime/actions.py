"""The records a schedule is made of: ``Action`` (``1F0``) and ``Schedule`` (per-IPU lists).

See the glossary in ``poptorch_sim.runtime.schedules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["ActionKind", "Action", "Schedule", "COMPUTE"]


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


@dataclass(frozen=True)
class Schedule:
    """Per-IPU action lists for ``num_stages`` stages and ``num_microbatches`` micro-batches.

    Attributes:
        name: the generator's name (a key of ``SCHEDULES``).
        num_stages: ``N``.
        num_microbatches: ``M``.
        training: whether backward passes and optimizer steps are scheduled.
        stage_ipus: the IPU of each stage.
        ipu_actions: for each IPU, its actions in execution order.
        serial: micro-batch ``m`` enters stage 0 only after the last stage has finished the
            forward of micro-batch ``m-1`` (sharded execution: one micro-batch in flight).
    """

    name: str
    num_stages: int
    num_microbatches: int
    training: bool
    stage_ipus: tuple[int, ...]
    ipu_actions: tuple[tuple[Action, ...], ...]
    serial: bool = False

    def __str__(self) -> str:
        from .clock import format_grid

        return format_grid(self)
