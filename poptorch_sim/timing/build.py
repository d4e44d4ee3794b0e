"""Builds a model's ``TimeReport`` at compile from the program's analysis and the options."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..analysis.program import ProgramAnalysis
from ..logger import logger
from .estimate import estimate
from .report import TimeReport
from .settings import time_settings

__all__ = ["at_compile", "trace_tracks"]


def at_compile(analysis: ProgramAnalysis, trainer: Any, options: Any) -> TimeReport:
    """The compile hook: the time report of a freshly compiled model.

    Args:
        analysis: the program's analysis (``analysis/program.py``), shared with memory.
        trainer: its ``DeviceTrainer`` (training) or None.
        options: its ``poptorch.Options``.

    Raises:
        Error: an unknown IPU version (``useOfflineIpuTarget``, ``POPTORCH_SIM_IPU_VERSION``).
    """
    start = time.perf_counter()
    settings = time_settings(options, analysis.training, analysis.mode, len(analysis.ipus))
    report = estimate(analysis, settings, trainer)
    report = replace(report, seconds=time.perf_counter() - start)
    logger.debug("poptorch_sim time estimate (%.1f ms):\n%s", 1e3 * report.seconds, report)
    return report


def trace_tracks(report: TimeReport, trace: Any) -> None:
    """Put one predicted step per IPU beside the host's tracks of an execution trace
    (``TraceRecorder.predicted``), in microseconds from the trace's start."""
    from .plot import timeline

    for ipu, bars in timeline(report).items():
        trace.predicted[f"IPU {ipu} (predicted, {report.hardware})"] = [
            (1e6 * start, 1e6 * length, what) for start, length, what in bars
        ]
