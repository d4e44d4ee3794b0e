"""Per-IPU memory: what each IPU of a compiled model holds, checked against its limit.

    report.py       MemoryReport / IpuMemory: the table (``str``) and the plot (``.plot``)
    plot.py         stacked bars against a limit (matplotlib), for ``MemoryReport.plot``
    settings.py     the options that matter (GA, replicas, offload, RTS, recomputation)
    activations.py  bytes saved for backward per stage and micro-batch (meta-tensor forward)
    saved.py        the counting rule shared by estimate and measurement
    estimate.py     the memory model ([Note: what each IPU holds])
    build.py        the compile hook: report, profile folder, limit check
    limits.py       PopTorch's out-of-memory behaviour
    probe.py        measuring a real run (``measure``)
    candidates.py   profiling the modules where a block may start (weights, bytes, cost)
    placement.py    cutting them into stages, one per IPU, the cheapest split that fits
    planner.py      suggesting BeginBlock positions under the limit (``plan``)

The limit is ``POPTORCH_SIM_IPU_MEMORY`` (default a Mk2 IPU: 1472 tiles × 624 KiB); a model
over it warns at compile, or with ``POPTORCH_SIM_OUT_OF_MEMORY=error`` fails as on an IPU unless
the engine option ``debug.allowOutOfMemory`` is set (``opts.enableProfiling()`` sets it). With a
profile folder (``enableProfiling`` / ``autoReport.directory``) the report is written there as
``memory_<training|inference>_<n>.txt|.json|.png``.

Simulated: the estimate is of the IPU's memory; the simulator itself keeps what its host needs
(one copy of the state for all replicas, SGD velocities in float32 whatever
``velocity_accum_type`` says), runs models over the limit by default, and recomputes a pipelined
stage only when asked to or when it marks values with ``recomputationCheckpoint`` (PopTorch
recomputes by default; see tests/test_footguns.py).

>>> # model = poptorch.trainingModel(net, opts, optimizer); model.compile(x, y)
>>> # print(poptorch_sim.memory_report(model))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import Error
from .build import write_profile
from .estimate import ALLOWANCE_FRACTION
from .placement import Plan
from .planner import plan
from .probe import SavedProbe
from .report import CATEGORIES, IpuMemory, MemoryReport, format_bytes
from .saved import storage_key

__all__ = [
    "ALLOWANCE_FRACTION",
    "CATEGORIES",
    "IpuMemory",
    "MeasuredIpu",
    "MemoryReport",
    "Plan",
    "format_bytes",
    "measure",
    "memory_report",
    "plan",
    "write_profile",
]


def memory_report(poptorch_model: Any) -> MemoryReport:
    """The memory estimate of each IPU of a compiled model (made when it compiled).

    Args:
        poptorch_model: what ``poptorch.trainingModel`` / ``inferenceModel`` returned.

    Returns:
        The ``MemoryReport``: ``.ipus`` (bytes per category, ``total``, ``limit``), ``str``
        for a table, ``.plot(path)`` for a figure.

    Raises:
        Error: the model has not been compiled yet.

    >>> # print(poptorch_sim.memory_report(model).ipus[0].total)
    """
    report = getattr(poptorch_model, "__dict__", {}).get("_memory_report")
    if report is None or not poptorch_model.isCompiled():
        raise Error(
            "memory_report() needs a compiled model: call model(inputs) or "
            "model.compile(inputs) first"
        )
    return report  # type: ignore[no-any-return]


@dataclass(frozen=True)
class MeasuredIpu:
    """What one IPU really held during a measured training call, in bytes.

    Attributes:
        ipu: the IPU.
        weights: storage bytes of the parameters and buffers of its stages.
        optimizer_state: optimizer state tensors on chip (per replica under RTS: each tensor's
            shard of ``ceil(elements / replicas)``).
        optimizer_state_off_chip: the same, held off chip.
        activations: peak bytes saved for backward during the call.
        activations_per_micro_batch: per stage, the most one micro-batch saved (or kept).
        recomputed_at_once: with recomputation, the most one backward's recomputation saved
            in all. Simulated: the simulator recomputes all of a stage's segments before
            differentiating them and holds this for a moment; an IPU holds one segment at a
            time, which ``activations`` counts.
    """

    ipu: int
    weights: int
    optimizer_state: int
    optimizer_state_off_chip: int
    activations: int
    activations_per_micro_batch: dict[int, int] = field(default_factory=dict)
    recomputed_at_once: int = 0


def measure(poptorch_model: Any, *args: Any, **kwargs: Any) -> list[MeasuredIpu]:
    """Run one call of a pipelined or sharded model and measure what each IPU held.

    The model is compiled first if needed; the call trains (or infers) as usual, with the saved
    tensors counted on each worker thread (see ``probe.py``). Compare with
    ``memory_report(poptorch_model)``.

    Raises:
        Error: the model runs as one program (no blocks): there are no IPU workers to probe.

    >>> # for est, got in zip(memory_report(model).ipus, measure(model, x, y)):
    >>> #     print(est.activations, got.activations)
    """
    from ..executor import staged_parts  # the executor imports memory.build as it loads

    if not poptorch_model.isCompiled():
        poptorch_model.compile(*args, **kwargs)
    parts = staged_parts(poptorch_model)
    if parts is None:
        raise Error("measure() needs a model with blocks (it runs on IPU worker threads)")
    probe = SavedProbe(parts.stages)
    for executor in parts.executors.values():
        executor.probe = probe
    try:
        poptorch_model(*args, **kwargs)
    finally:
        for executor in parts.executors.values():
            executor.probe = None
    report = memory_report(poptorch_model)
    return [_measured(ipu, parts.stages, parts.trainer, report, probe) for ipu in report.ipus]


def _measured(
    estimate: IpuMemory, stages: Any, trainer: Any, report: MemoryReport, probe: SavedProbe
) -> MeasuredIpu:
    ipu = estimate.ipu
    seen: dict[int, int] = {}
    params: list[torch.Tensor] = []
    for spec in stages:
        if spec.ipu != ipu:
            continue
        for t in [*spec.module.parameters(), *spec.module.buffers()]:
            if storage_key(t) not in seen:
                seen[storage_key(t)] = t.untyped_storage().nbytes()
                params.append(t)
    on = off = 0
    # SGD with use_combined_accum: the velocity is PopART's combined accumulator, counted with
    # the gradients, not the optimizer state (see [Note: what each IPU holds]).
    snap = trainer.snapshot if trainer is not None else None
    if snap is not None and not (snap.kind == "sgd" and snap.use_combined_accum):
        optimizer = trainer.optimizer
        off_chip = bool(getattr(optimizer, "off_chip", False))
        replicas = report.settings["replicas"] if report.settings["RTS"] else 1
        for p in params:
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    nbytes = math.ceil(value.numel() / replicas) * value.element_size()
                    on, off = (on, off + nbytes) if off_chip else (on + nbytes, off)
    per_mb = {s: n for s, n in probe.per_micro_batch.items() if s in estimate.stages}
    return MeasuredIpu(
        ipu, sum(seen.values()), on, off, probe.peak.get(ipu, 0), per_mb,
        probe.at_once.get(ipu, 0),
    )  # fmt: skip
