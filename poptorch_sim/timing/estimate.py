"""The time model: seconds per call on each IPU, from the program's analysis and the options.

[Note: what a call costs]
For one replica (every replica runs the same program in step), per micro-batch on IPU ``i``:

===============  ==============================================================================
compute          per op of its stages' forward: matmuls FLOPs / (peak at the op's dtype ×
                 amp_efficiency), convolutions the same with conv_efficiency, memory-bound ops bytes / (on-tile bandwidth ×
                 memory_efficiency). Backward costs twice its forward (an input gradient and a
                 weight gradient per matmul; pointwise ops read twice what they wrote), a
                 recomputing stage runs its forward a second time in backward
exchange         the operands of the compute ops, moved tile to tile at the exchange bandwidth
sync             ``superstep_cycles`` per costing op (its BSP supersteps), per pass
ipu_copies       bytes a stage passes to a stage on another IPU (and, training, the gradients
                 back) over one IPU-Link
host_io          the micro-batch's inputs over PCIe to the first stage's IPU (StreamCopy);
                 hidden behind compute with IO tiles
===============  ==============================================================================

Schedules (N stages, GA micro-batches per step, DI steps per call):

=====================  ========================================================================
pipelined training     PopART's GA + 2(N - 1) pipeline cycles per step, each as long as the
                       slowest IPU's forward + backward of one micro-batch (fill and flush
                       included: an IPU with nothing to do waits for the cycle's sync)
pipelined inference    DI + N - 1 cycles per call of the slowest IPU's forward
sharded / phased       one IPU at a time: GA × the sum of every IPU's work per step
single IPU             GA × its forward + backward per step
=====================  ========================================================================

Once per step (training): the weight update on every IPU at once (the bytes of weights,
gradients and optimizer state at the on-tile bandwidth; state off chip streamed in and out at
the streaming-memory bandwidth; RTS: each replica updates 1/R), and the gradient all-reduce over
every replica of every instance (a ring: 2 (R - 1) / R of the gradient bytes over one IPU-Link,
plus a sync per ring step; beyond an IPU-POD64, the gateway's 100 GbE share per IPU is the
slowest hop). A call is DI steps; ``cycleCount()`` is the call's seconds × the clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..analysis.ops import OpTotals
from ..analysis.program import ProgramAnalysis
from ..logger import warning_once
from ..memory.estimate import optimizer_state_shapes
from ..memory.saved import storage_key, tensor_bytes
from .calibration import CALIBRATION, Calibration
from .hardware import IpuHardware
from .report import IpuTime, TimeReport
from .settings import TimeSettings

__all__ = ["PassCost", "estimate", "pass_cost", "pipeline_cycles"]

_POD = 64  # IPUs joined by IPU-Links alone (IPU-POD64); beyond, gateway links join them
_IPUS_PER_GATEWAY = 4  # one IPU-M2000 / Bow-2000 shares its 100 GbE among its 4 IPUs


@dataclass(frozen=True)
class PassCost:
    """Seconds of one pass (a forward, or a backward) of one micro-batch."""

    compute: float = 0.0
    exchange: float = 0.0
    sync: float = 0.0

    def __add__(self, other: PassCost) -> PassCost:
        return PassCost(
            self.compute + other.compute, self.exchange + other.exchange, self.sync + other.sync
        )

    def __mul__(self, k: float) -> PassCost:
        return PassCost(self.compute * k, self.exchange * k, self.sync * k)

    @property
    def total(self) -> float:
        """All three."""
        return self.compute + self.exchange + self.sync


def pass_cost(ops: OpTotals, hw: IpuHardware, cal: Calibration = CALIBRATION) -> PassCost:
    """Seconds of one forward counted in ``ops`` on IPU ``hw``. See [Note: what a call costs]."""
    compute = sum(
        flops / (hw.peak_flops(dtype) * cal.amp_efficiency) for dtype, flops in ops.flops.items()
    ) + sum(
        flops / (hw.peak_flops(dtype) * cal.conv_efficiency)
        for dtype, flops in ops.conv_flops.items()
    )
    memory_bw = hw.tiles * hw.memory_bytes_per_cycle * hw.clock_hz
    compute += ops.memory_bytes / (memory_bw * cal.memory_efficiency)
    exchange = ops.compute_bytes / (hw.tiles * hw.exchange_bytes_per_cycle * hw.clock_hz)
    sync = ops.ops * cal.superstep_cycles / hw.clock_hz
    return PassCost(compute, exchange, sync)


def pipeline_cycles(mode: str, stages: int, micro_batches: int, training: bool) -> int:
    """Cycles of one step's schedule: PopART's GA + 2(N - 1) (training) or M + N - 1
    (inference) when pipelined; one stage at a time otherwise (``micro_batches × stages``)."""
    if mode == "pipelined" and stages > 1:
        return micro_batches + (2 if training else 1) * (stages - 1)
    return micro_batches * stages


@dataclass
class _IpuWork:
    """One IPU's work per micro-batch and per step (seconds)."""

    ipu: int
    stages: tuple[int, ...]
    fwd: PassCost = PassCost()
    per_stage: list[tuple[int, int, float, float]] = dataclasses.field(default_factory=list)
    passes: PassCost = PassCost()  # forward + backward (+ recompute) of one micro-batch
    copies: float = 0.0
    host_io: float = 0.0
    update: float = 0.0
    all_reduce: float = 0.0

    @property
    def per_micro_batch(self) -> float:
        return self.passes.total + self.copies + self.host_io


def _ipu_work(
    analysis: ProgramAnalysis, settings: TimeSettings, cal: Calibration
) -> list[_IpuWork]:
    hw = settings.hardware
    by_stage = {a.stage: a for a in analysis.activations}
    ipu_of = {s: ipu for s, ipu, _ in analysis.stages}
    first_ipu = analysis.stages[0][1]
    out = []
    for ipu in analysis.ipus:
        mine = [s for s, i, _ in analysis.stages if i == ipu]
        work = _IpuWork(ipu, tuple(mine))
        for s in mine:
            act = by_stage.get(s)
            ops = act.ops if act is not None and act.ops is not None else OpTotals()
            fwd = pass_cost(ops, hw, cal)
            work.fwd = work.fwd + fwd
            copy = 0.0
            if ipu_of.get(s + 1, ipu) != ipu and act is not None:
                copy = act.outputs * (2 if settings.training else 1) / hw.link_bytes_per_s
            work.copies += copy
            work.per_stage.append((s, ipu, fwd.total, copy))
        backward = 2.0 + (1.0 if settings.recompute else 0.0)
        work.passes = work.fwd * (1.0 + (backward if settings.training else 0.0))
        if ipu == first_ipu and not settings.io_tiles:
            work.host_io = analysis.host_input_bytes / hw.host_bytes_per_s
        out.append(work)
    return out


def _ring_seconds(nbytes: int, settings: TimeSettings, num_ipus: int, cal: Calibration) -> float:
    """The gradient all-reduce of ``nbytes`` on one IPU over every replica (a ring)."""
    r = settings.total_replicas
    if r <= 1 or nbytes == 0:
        return 0.0
    hw = settings.hardware
    bandwidth = hw.link_bytes_per_s
    if r * num_ipus > _POD:
        bandwidth = min(bandwidth, hw.gateway_bytes_per_s / _IPUS_PER_GATEWAY)
    steps = 2 * (r - 1)
    return steps / r * nbytes / bandwidth + steps * cal.superstep_cycles / hw.clock_hz


def _update_seconds(
    params: list[Any], trainer: Any, settings: TimeSettings, cal: Calibration
) -> tuple[float, int]:
    """Seconds of one IPU's weight update and its gradient bytes."""
    hw = settings.hardware
    index = {id(p): i for i, p in enumerate(trainer.params)} if trainer is not None else {}
    on_chip = streamed = grads = 0
    for p in params:
        grads += tensor_bytes(p)
        on_chip += 3 * tensor_bytes(p)  # read the weight and its gradient, write the weight
        i = index.get(id(p))
        if trainer is None or i is None:
            continue
        for _, dtype, numel in optimizer_state_shapes(
            trainer.snapshot, i, p.numel(), settings.gradient_accumulation
        ):
            nbytes = 2 * numel * dtype.itemsize  # read and write
            if settings.off_chip:
                streamed += nbytes
            on_chip += nbytes
    shard = settings.total_replicas if settings.rts else 1
    memory_bw = hw.tiles * hw.memory_bytes_per_cycle * hw.clock_hz * cal.memory_efficiency
    seconds = on_chip / shard / memory_bw + streamed / shard / hw.streaming_bytes_per_s
    return seconds, grads


def _trainable(analysis: ProgramAnalysis, ipu: int) -> list[Any]:
    seen: set[int] = set()
    out = []
    for _, i, module in analysis.stages:
        if i != ipu:
            continue
        for p in module.parameters():
            key = storage_key(p) if p.device.type != "meta" else id(p)
            if p.requires_grad and key not in seen:
                seen.add(key)
                out.append(p)
    return out


def estimate(
    analysis: ProgramAnalysis,
    settings: TimeSettings,
    trainer: Any = None,
    cal: Calibration = CALIBRATION,
) -> TimeReport:
    """The time report of a compiled program. See [Note: what a call costs].

    Args:
        analysis: the program's analysis.
        settings: the time options.
        trainer: the ``DeviceTrainer`` (its optimizer sizes the update), or None.
        cal: the calibrated parameters.
    """
    hw = settings.hardware
    works = _ipu_work(analysis, settings, cal)
    if settings.training:
        for w in works:
            w.update, grads = _update_seconds(_trainable(analysis, w.ipu), trainer, settings, cal)
            w.all_reduce = _ring_seconds(grads, settings, len(works), cal)
    n, ga, di = len(analysis.stages), settings.gradient_accumulation, settings.device_iterations
    micro = ga if settings.training else di
    cycles = pipeline_cycles(analysis.mode, n, micro, settings.training)
    if analysis.mode == "pipelined" and n > 1:
        schedule = cycles * max(w.per_micro_batch for w in works)
    else:
        schedule = micro * sum(w.per_micro_batch for w in works)
    step = schedule + max(w.update for w in works) + max(w.all_reduce for w in works)
    run = di * step if settings.training else schedule
    steps = di if settings.training else 1
    ipus = [_ipu_time(w, micro * steps, steps, run, settings.training) for w in works]
    unknown = _unknown_ops(analysis)
    samples = analysis.micro_batch_size * micro * steps * settings.total_replicas
    bubble = 1.0 - micro / cycles if cycles else 0.0
    return TimeReport(
        ipu_version=hw.version,
        hardware=hw.name,
        clock_hz=hw.clock_hz,
        run_seconds=run,
        samples_per_second=samples / run if run > 0 else 0.0,
        pipeline_cycles=cycles,
        bottleneck=_bottleneck(ipus),
        bubble_fraction=bubble,
        ipus=ipus,
        mode=analysis.mode,
        micro_batches=micro,
        settings=_summary(settings, analysis),
        unknown_ops=unknown,
        notes=_notes(settings, unknown) + _uncounted(analysis),
        stages=sorted(st for w in works for st in w.per_stage),
    )


def _ipu_time(w: _IpuWork, micro: int, steps: int, run: float, training: bool) -> IpuTime:
    parts = {
        "compute": micro * w.passes.compute,
        "exchange": micro * w.passes.exchange,
        "ipu_copies": micro * w.copies,
        "host_io": micro * w.host_io,
        "sync": micro * w.passes.sync,
        "weight_update": steps * w.update if training else 0.0,
        "all_reduce": steps * w.all_reduce if training else 0.0,
    }
    idle = max(0.0, run - sum(parts.values()))
    return IpuTime(ipu=w.ipu, stages=w.stages, idle=idle, **parts)


def _bottleneck(ipus: list[IpuTime]) -> str:
    busiest = max(ipus, key=lambda t: t.busy)
    category = max(
        ("compute", "exchange", "ipu_copies", "host_io", "sync", "weight_update", "all_reduce"),
        key=lambda c: getattr(busiest, c),
    )
    return f"IPU {busiest.ipu} ({category})"


def _unknown_ops(analysis: ProgramAnalysis) -> list[str]:
    names: dict[str, None] = {}
    for act in analysis.activations:
        if act.ops is not None:
            names.update(dict.fromkeys(act.ops.unknown))
    for name in names:
        warning_once(
            f"time estimate: the cost model does not know op {name}; it is counted as a "
            "memory-bound op by the bytes of its inputs and outputs (poptorch_sim.time_report "
            "lists such ops)"
        )
    return list(names)


def _uncounted(analysis: ProgramAnalysis) -> list[str]:
    """A note (and a warning) for stages whose forward could not be counted: never a silent 0."""
    missing = [a for a in analysis.activations if a.ops is None]
    if not missing:
        return []
    note = (
        f"the ops of stage(s) {[a.stage for a in missing]} could not be counted ({missing[0].method}"
        "): their compute is missing from this estimate"
    )
    warning_once(f"time estimate: {note}")
    return [note]


def _summary(settings: TimeSettings, analysis: ProgramAnalysis) -> dict[str, Any]:
    return {
        "training": settings.training,
        "device_iterations": settings.device_iterations,
        "gradient_accumulation": settings.gradient_accumulation,
        "replicas": settings.replicas,
        "instances": settings.instances,
        "recomputation": settings.recompute,
        "offload": settings.off_chip,
        "RTS": settings.rts,
        "io_tiles": settings.io_tiles,
        "micro_batch_size": analysis.micro_batch_size,
    }


def _notes(settings: TimeSettings, unknown: list[str]) -> list[str]:
    notes = ["a prediction from a cost model calibrated on four MLPerf rows (benchmarks/"
             "ipu_time.py), not a measurement"]  # fmt: skip
    if settings.io_tiles:
        notes.append(f"host IO overlapped with compute on {settings.io_tiles} IO tiles")
    if unknown:
        notes.append(
            f"ops unknown to the cost model, counted as memory-bound: {', '.join(unknown)}"
        )
    return notes
