"""Predicted IPU time: how long a compiled model's calls would take on Mk2 or Bow IPUs.

    report.py       TimeReport / IpuTime: the table (``str``) and the Gantt chart (``.plot``)
    settings.py     the options that matter (IPU version, DI, GA, replicas, offload, RTS)
    hardware.py     one table of constants per IPU version, each with its source
    calibration.py  the parameters no datasheet gives: two fitted (and on what), two set
    estimate.py     the cost model ([Note: what a call costs])
    build.py        the compile hook
    plot.py         the Gantt chart
    planner.py      ``BeginBlock`` positions by predicted time (``plan_time``)

The estimate reads the same analysis of the compiled program as the memory estimate
(``analysis/``): nothing runs on the IPUs, and no run is needed. ``model.cycleCount()`` (with
``opts.logCycleCount(True)``) returns the predicted cycles of the last call.

Simulated: every figure here is a prediction of a cost model calibrated on four published
MLPerf results (``benchmarks/ipu_time.py``); PopTorch counts cycles only on hardware.

>>> # model = poptorch.trainingModel(net, opts, optimizer); model.compile(x, y)
>>> # print(poptorch_sim.time_report(model))
"""

from __future__ import annotations

from typing import Any

from ..errors import Error
from .calibration import CALIBRATION, Calibration
from .hardware import BOW, IPU_VERSIONS, MK2, IpuHardware, ipu_hardware
from .planner import TimePlan, plan_time
from .report import CATEGORIES, IpuTime, TimeReport

__all__ = [
    "BOW",
    "CALIBRATION",
    "CATEGORIES",
    "Calibration",
    "IPU_VERSIONS",
    "IpuHardware",
    "IpuTime",
    "MK2",
    "TimePlan",
    "TimeReport",
    "ipu_hardware",
    "plan_time",
    "time_report",
]


def time_report(poptorch_model: Any) -> TimeReport:
    """The predicted time of one call of a compiled model on IPUs (made when it compiled).

    Args:
        poptorch_model: what ``poptorch.trainingModel`` / ``inferenceModel`` returned.

    Returns:
        The ``TimeReport``: ``run_seconds``, ``samples_per_second``, ``pipeline_cycles``,
        ``bottleneck``, ``bubble_fraction``, ``.ipus`` (seconds per category), ``str`` for a
        table, ``.plot(path)`` for a Gantt chart.

    Raises:
        Error: the model has not been compiled yet.

    >>> # print(poptorch_sim.time_report(model).samples_per_second)
    """
    report = getattr(poptorch_model, "__dict__", {}).get("_time_report")
    if report is None or not poptorch_model.isCompiled():
        raise Error(
            "time_report() needs a compiled model: call model(inputs) or "
            "model.compile(inputs) first"
        )
    return report  # type: ignore[no-any-return]
