"""Builds a model's ``MemoryReport`` at compile from its program, optimizer and schedule.

The executor calls ``at_compile`` once the program and the trainer exist and before the model
first runs, with the program's analysis (``analysis/program.py``, shared with the time
estimate); the report is kept on the executor (``poptorch_sim.memory_report``), checked against
the limit (``limits.py``) and written to the profile folder when profiling.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from torch import nn

from .. import env
from ..analysis.program import ProgramAnalysis, analyse_program
from ..logger import logger
from ..runtime.schedules import Schedule, make_schedule
from .activations import StageActivations
from .estimate import ALLOWANCE_FRACTION, activation_peaks, ipu_memory
from .limits import check_limits
from .report import CATEGORIES, MemoryReport
from .settings import MemorySettings, memory_settings

__all__ = [
    "CompiledOnly",
    "at_compile",
    "report_at_compile",
    "stop_after_compile",
    "write_profile",
]

_serial = itertools.count()
_stop = False  # See stop_after_compile


class CompiledOnly(BaseException):
    """Raised at the first compile under ``stop_after_compile``: carries the memory report
    and the time report (``timing``, None when it could not be made).

    A ``BaseException``, so that a program's ``except Exception`` does not swallow it.
    """

    def __init__(self, report: MemoryReport, timing: Any = None) -> None:
        super().__init__("stopped after the first compile")
        self.report = report
        self.timing = timing


def stop_after_compile(stop: bool = True) -> None:
    """Make the next compile raise ``CompiledOnly`` with its report instead of running
    (``python -m poptorch_sim.memory``); out-of-memory is then reported, not raised."""
    global _stop
    _stop = stop


def at_compile(
    program: Any,
    trainer: Any,
    options: Any,
    first: Any,
    training: bool,
    analysis: ProgramAnalysis | None = None,
    timing: Any = None,
) -> MemoryReport:
    """The compile hook: build the report, write it to the profile folder, check the limit.

    ``analysis``: the program's analysis (made here when None); ``timing``: the time report,
    carried by ``CompiledOnly``.

    Raises:
        Error: out of memory with ``POPTORCH_SIM_OUT_OF_MEMORY=error`` (see ``limits.py``).
        ValueError: a bad ``POPTORCH_SIM_IPU_MEMORY`` or ``POPTORCH_SIM_OUT_OF_MEMORY``.
    """
    if analysis is None:
        analysis = analyse_program(program, first, training)
    report = report_at_compile(analysis, trainer, options)
    logger.debug("poptorch_sim memory estimate (%.1f ms):\n%s", 1e3 * report.seconds, report)
    if options.profile_dir:
        write_profile(report, options.profile_dir, training)
        trace = getattr(program, "trace", None)
        if trace is not None:  # counter tracks beside the IPUs' in the execution trace
            for ipu in report.ipus:
                values = {c: getattr(ipu, c) / 2**20 for c in CATEGORIES}
                trace.static_counters.append((f"IPU {ipu.ipu} memory estimate (MiB)", values))
    if _stop:
        raise CompiledOnly(report, timing)
    check_limits(report, options)
    return report


def report_at_compile(analysis: ProgramAnalysis, trainer: Any, options: Any) -> MemoryReport:
    """The memory report of a freshly compiled model.

    Args:
        analysis: the program's analysis (``analysis/program.py``).
        trainer: its ``DeviceTrainer`` (training) or None.
        options: its ``poptorch.Options``.
    """
    start = time.perf_counter()
    settings = memory_settings(options, analysis.training, analysis.mode, analysis.recompute)
    stages, acts = analysis.stages, analysis.activations
    report = build_report(
        stages, acts, settings, analysis.schedule_name, trainer, env.ipu_memory()
    )
    notes = list(report.notes)
    failed = [a for a in acts if a.method.startswith("failed")]
    if failed:
        notes.append(f"activations of stages {[a.stage for a in failed]} unknown "
                     f"({failed[0].method})")  # fmt: skip
    return MemoryReport(
        report.ipus, report.schedule, report.micro_batches, report.settings, notes,
        analysis.seconds + time.perf_counter() - start,
    )  # fmt: skip


def build_report(
    stages: Sequence[tuple[int, int, nn.Module]],
    acts: Sequence[StageActivations],
    settings: MemorySettings,
    schedule_name: str,
    trainer: Any,
    limit: int,
) -> MemoryReport:
    """Assemble the report from stages ``(index, ipu, module)`` and their activations."""
    m = settings.gradient_accumulation
    ipus = [ipu for _, ipu, _ in stages]
    schedule = _schedule(schedule_name, len(stages), m, settings.training, tuple(ipus))
    peaks, in_flight = activation_peaks(schedule, acts, settings.recompute)
    optimizer = None
    if trainer is not None:
        optimizer = (trainer.snapshot, {id(p): i for i, p in enumerate(trainer.params)})
    per_ipu = []
    for ipu in sorted(set(ipus)):
        mine = [(s, module) for s, i, module in stages if i == ipu]
        own = {s for s, _ in mine}
        per_mb = {a.stage: (a.kept if settings.recompute else a.saved) for a in acts
                  if a.stage in own}  # fmt: skip
        flight = {s: n for s, n in in_flight.items() if s in own}
        per_ipu.append(
            ipu_memory(ipu, mine, settings, optimizer, (peaks.get(ipu, 0), per_mb, flight), limit)
        )
    kind = trainer.snapshot.kind if trainer is not None else None
    summary = {
        "replicas": settings.replicas,
        "optimizer": kind,
        "offload": settings.off_chip,
        "RTS": settings.rts,
        "recomputation": settings.recompute,
    }
    notes = [
        f"allowance = {ALLOWANCE_FRACTION:.0%} of the limit for code, exchange buffers and "
        "temporaries (not measured)",
    ]
    if not settings.training:
        notes.append("inference: nothing is saved for backward; transient activations are "
                     "part of the allowance")  # fmt: skip
    return MemoryReport(per_ipu, schedule.name, m, summary, notes)


@functools.lru_cache(maxsize=64)
def _schedule(name: str, stages: int, micro_batches: int, training: bool,
              ipus: tuple[int, ...]) -> Schedule:  # fmt: skip
    """The runtime's schedule (pure, so built and validated once per shape)."""
    return make_schedule(name, stages, micro_batches, training=training, stage_ipus=ipus)


def write_profile(report: MemoryReport, directory: str, training: bool) -> list[str]:
    """Write the report as text, JSON and a PNG plot into the profile folder; their paths."""
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(
        directory, f"memory_{'training' if training else 'inference'}_{next(_serial)}"
    )
    with open(stem + ".txt", "w") as f:
        f.write(str(report) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(report.to_dict(), f, indent=1, default=str)
    return [stem + ".txt", stem + ".json", report.plot(stem + ".png")]
