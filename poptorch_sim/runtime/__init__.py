"""The multi-IPU runtime: schedules as data, IPU worker threads and the pipeline that runs them."""

from __future__ import annotations

from .actions import Action, ActionKind
from .clock import Schedule, format_grid, simulate, validate
from .pipeline import PipelineRuntime
from .pool import default_devices
from .schedules import SCHEDULES, fill_drain, forward_only, make_schedule, one_f_one_b, sharded

__all__ = [
    "Action",
    "ActionKind",
    "Schedule",
    "SCHEDULES",
    "fill_drain",
    "one_f_one_b",
    "forward_only",
    "sharded",
    "make_schedule",
    "simulate",
    "validate",
    "format_grid",
    "PipelineRuntime",
    "default_devices",
]
