"""Cuts profiled candidates into pipeline stages, one per IPU: the cheapest split that fits.

The candidates (``candidates.py``) come costed: by forward time or FLOPs for ``memory.plan``, by
predicted IPU seconds for ``timing.plan_time``. A dynamic programme cuts them into ``num_ipus``
contiguous stages, minimising the slowest stage's cost among the splits whose every IPU fits its
limit (or, if none fits, the largest IPU total). What each IPU holds is the memory estimate's
([Note: what each IPU holds] in ``estimate.py``), with the micro-batches in flight of the
runtime's 1F1B schedule: each stage becomes a ``StageActivations`` and ``activation_peaks``
gives its peak, so a recomputing stage keeps its inputs and marked values per micro-batch and
holds its largest segment again in backward, exactly as the compiled model's report counts it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from .. import env
from ..runtime.actions import ActionKind
from ..runtime.clock import Schedule
from ..runtime.schedules import make_schedule
from .activations import StageActivations
from .candidates import Candidates, Unit
from .estimate import ALLOWANCE_FRACTION, activation_peaks
from .report import IpuMemory, MemoryReport
from .settings import MemorySettings, memory_settings

__all__ = ["Plan", "best_cuts", "ipu_memories", "ipu_memory_of", "place"]

# Optimizer state bytes per float32 trainable element (on chip, before offload and RTS).
_STATE_BYTES = {"sgd": 4, "adam": 8, "adamw": 8, "lamb": 8, "rmsprop": 4, None: 0}


@dataclass(frozen=True)
class Plan:
    """A suggested placement: ``blocks[k]`` is the module that starts IPU ``k``'s block."""

    blocks: list[str]
    stage_costs: list[float]
    cost_unit: str
    report: MemoryReport

    def apply(self, model: nn.Module) -> nn.Module:
        """Put the suggested ``BeginBlock``s on ``model`` (in place, block ``IPU<k>`` on IPU
        ``k``; what runs before the first one joins IPU 0); returns ``model``."""
        from ..ops.blocks import BeginBlock

        for k, name in enumerate(self.blocks):
            BeginBlock(model.get_submodule(name), f"IPU{k}", ipu_id=k)
        return model

    @property
    def fits(self) -> bool:
        """Whether every IPU of the placement fits its limit."""
        return not self.report.over_limit

    def __str__(self) -> str:
        total = sum(self.stage_costs) or 1.0
        lines = ["Suggested placement (BeginBlock at each module):"]
        for k, (name, cost) in enumerate(zip(self.blocks, self.stage_costs)):
            share = 100 * cost / total
            lines.append(f"  IPU {k}: {name:<32} {share:5.1f}% of the {self.cost_unit}")
        lines.append(str(self.report))
        return "\n".join(lines)


@functools.cache
def _schedule(num_stages: int, micro_batches: int) -> Schedule:
    return make_schedule("1f1b", num_stages, micro_batches, training=True)


@functools.cache
def _events(num_stages: int, micro_batches: int, k: int) -> Schedule:
    """The runtime's 1F1B schedule reduced to what decides IPU ``k``'s peak: its actions up to
    the first forward and the first backward that hold the most micro-batches (a peak is a
    maximum over forwards of held × kept and over backwards of held × kept + a segment, so
    the later actions, which hold no more, cannot raise it). Other IPUs' lists are empty."""
    schedule = _schedule(num_stages, micro_batches)
    actions = schedule.ipu_actions[k]
    held, most, ends = 0, {ActionKind.F: 0, ActionKind.B: 0}, {ActionKind.F: 0, ActionKind.B: 0}
    for i, action in enumerate(actions):
        if action.kind not in most:
            continue
        held += 1 if action.kind is ActionKind.F else 0
        if held > most[action.kind]:
            most[action.kind], ends[action.kind] = held, i + 1
        held -= 1 if action.kind is ActionKind.B else 0
    kept = actions[: max(ends.values())]
    lists = tuple(kept if i == k else () for i in range(len(schedule.ipu_actions)))
    return dataclasses.replace(schedule, ipu_actions=lists)


def _activations(k: int, stage: Unit) -> StageActivations:
    """Stage ``k`` (on IPU ``k``) as the memory estimate sees a compiled stage."""
    return StageActivations(k, k, stage.saved, stage.inputs, "planner", stage.checkpoints,
                            stage.recomputed)  # fmt: skip


def ipu_memory_of(
    k: int,
    stage: Unit,
    num_stages: int,
    settings: MemorySettings,
    kind: str | None,
    limit: int,
) -> IpuMemory:
    """What IPU ``k`` holds with stage ``k`` of ``num_stages`` on it (float32 gradient
    accumulators and optimizer state).

    Args:
        k: the IPU and its stage.
        stage: the stage.
        num_stages: stages in the pipeline, one per IPU.
        settings: the memory options.
        kind: the optimizer (``"sgd"``, ``"adam"``, ``"adamw"``, ``"lamb"``, ``"rmsprop"``
            or None).
        limit: the IPU's memory in bytes.
    """
    act = _activations(k, stage)
    events = _events(num_stages, settings.gradient_accumulation, k)
    peaks, flight = activation_peaks(events, [act], settings.recompute)
    steps = 4 * stage.tensors if kind in ("adam", "adamw", "lamb", "rmsprop") else 0
    state = stage.trainable * _STATE_BYTES.get(kind, 8) + steps
    if settings.rts:
        state = -(-state // settings.replicas)
    return IpuMemory(
        ipu=k, stages=(k,), weights=stage.weights,
        gradients=4 * stage.trainable if settings.gradient_accumulation > 1 else 0,
        optimizer_state=0 if settings.off_chip else state,
        activations=peaks.get(k, 0), allowance=int(ALLOWANCE_FRACTION * limit), limit=limit,
        optimizer_state_off_chip=state if settings.off_chip else 0,
        activations_per_micro_batch={k: act.kept if settings.recompute else act.saved},
        in_flight={k: flight.get(k, 0)},
    )  # fmt: skip


def ipu_memories(
    stages: Sequence[Unit], settings: MemorySettings, kind: str | None, limit: int
) -> list[IpuMemory]:
    """``ipu_memory_of`` each stage, stage ``k`` on IPU ``k``."""
    return [ipu_memory_of(k, s, len(stages), settings, kind, limit) for k, s in enumerate(stages)]


def best_cuts(
    candidates: Candidates,
    num_ipus: int,
    settings: MemorySettings,
    kind: str | None,
    limit: int,
) -> list[int]:
    """The first unit of each stage: the least slowest-stage cost among the splits that fit
    (or, if none fits, the least largest IPU total)."""
    n, k = len(candidates.units), num_ipus
    best: dict[tuple[int, int], tuple[tuple[float, float], list[int]]] = {}

    def score(start: int, end: int, s: int) -> tuple[float, float]:
        stage = candidates.stage(start, end, first=s == 0, last=s == k - 1)
        mem = ipu_memory_of(s, stage, k, settings, kind, limit)
        return (0.0 if mem.total <= limit else 1.0) * mem.total, stage.cost

    for end in range(1, n - k + 2):
        best[(1, end)] = (score(0, end, 0), [0])
    for s in range(1, k):
        for end in range(s + 1, n - (k - s) + 2):
            options = []
            for start in range(s, end):
                if (s, start) not in best:
                    continue
                (over, cost), cuts = best[(s, start)]
                o2, c2 = score(start, end, s)
                options.append(((max(over, o2), max(cost, c2)), [*cuts, start]))
            if options:
                best[(s + 1, end)] = min(options, key=lambda x: x[0])
    return best[(k, n)][1]


def place(
    candidates: Candidates,
    num_ipus: int,
    options: Any,
    optimizer: str | None,
    cost_unit: str,
) -> Plan:
    """Cut costed ``candidates`` into ``num_ipus`` stages and estimate each IPU's memory.

    Args:
        candidates: the profiled candidates, each with its cost.
        num_ipus: how many stages / IPUs.
        options: ``poptorch.Options`` (gradient accumulation, replicas, offload, RTS,
            recomputation).
        optimizer: as ``ipu_memories``'s ``kind``.
        cost_unit: what the costs are, for the printed plan.

    Returns:
        The ``Plan``.
    """
    settings = memory_settings(options, training=True)
    limit = env.ipu_memory()
    cuts = best_cuts(candidates, num_ipus, settings, optimizer, limit)
    stages = candidates.stages(cuts)
    report = MemoryReport(
        ipu_memories(stages, settings, optimizer, limit), "1f1b", settings.gradient_accumulation,
        {"replicas": settings.replicas, "optimizer": optimizer, "offload": settings.off_chip,
         "RTS": settings.rts, "recomputation": settings.recompute},
        [f"allowance = {ALLOWANCE_FRACTION:.0%} of the limit (code, exchange buffers)",
         "planner estimate: float32 gradient accumulators and optimizer state"],
    )  # fmt: skip
    names = candidates.names
    return Plan([names[c] for c in cuts], [s.cost for s in stages], cost_unit, report)
