"""Compiling a wrapped model: from the first call's inputs to an ``Executable``.

``build_executable`` is handed everything it reads (the user's model and PopTorch's shallow copy
of it, the options, the inputs) and returns what it built; it keeps no state and never touches
the executor. The steps, in order:

    batch layout and batch check → (training) weights synchronised across processes
    → device copy of the weights → program: one eager program, or a staged program on IPU
    worker threads → IPUs acquired → (training) device trainer → the program's analysis
    → time and memory estimates → (inference with IO tiles) the IO threads
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from torch import nn

from .. import env
from ..analysis.program import analyse_program
from ..compiler import TraceFailure
from ..compiler.overlap import check_overlapped_io, num_io_tiles
from ..compiler.sharding import sharding_of
from ..compiler.verify import check_max_ipus
from ..distributed import synchronize_weights
from ..enums import ConnectionType
from ..errors import Error
from ..hardware import ipuHardwareIsAvailable
from ..logger import logger
from ..memory.build import at_compile as memory_at_compile
from ..ops.annotations import overlap_marks
from ..ops.blocks import uses_begin_block
from ..ops.group_norm import stride_group_norms
from ..options import Options
from ..profiling.trace import TraceRecorder
from ..runtime.intra_op import resolve_threads_per_ipu
from ..runtime.io_tiles import IoTiles
from ..timing.build import at_compile as time_at_compile
from ..timing.build import trace_tracks
from .anchors import log_anchors
from .eager import EagerProgram
from .executable import Executable, Program, to_traced_input
from .inputs import BoundArgs
from .layout import Layout, batch_layout, check_batch
from .meta import check_meta, on_meta
from .progress import CompilationBar
from .replica_groups import GroupedVariable, ReplicaGrouping, check_grouped_optimizer
from .replicas import ReplicaBuffers
from .staged import StagedRunner
from .training import DeviceTrainer
from .weights import DeviceCopy

__all__ = ["build_executable"]

# Simulated: a model with blocks that neither torch.fx nor torch.export can capture still runs,
# as one program.
_EAGER_FALLBACK = (
    "poptorch_sim falls back to running this model as one program on a single simulated IPU, "
    "one micro-batch at a time: outputs, gradients and weights are the same as PopTorch's and "
    "eager PyTorch's, but its blocks do not run on separate IPU threads (no pipelining or "
    "sharding), and the pipeline checks (depth, IPU count) are not applied."
)

_io_serial = itertools.count()  # names the overlapped-IO trace files of a process

TrainerFactory = Callable[[DeviceCopy, Layout], DeviceTrainer]


def build_executable(
    bound: BoundArgs,
    model: nn.Module,
    snapshot: nn.Module,
    options: Options,
    training: bool,
    make_trainer: TrainerFactory | None,
    bar: CompilationBar,
    claim_ipu: Callable[[], None],
    per_replica: dict[str, ReplicaGrouping] | None = None,
) -> Executable:
    """Compile ``snapshot`` for inputs shaped like ``bound``.

    Args:
        bound: the first call's inputs (or ``compile``'s).
        model: the user's model; a training model's weights are first made the same in every
            process (``popdist``).
        snapshot: PopTorch's shallow copy of ``model``, which the device copy is made from.
        options: the executor's (frozen) options.
        training: whether calls train.
        make_trainer: builds the device trainer of a training model (None for inference).
        bar: the compilation progress bar.
        claim_ipu: claims the model's IPU; called before the executable is made when the
            connection type is ``Always`` (PopTorch attaches at compile then).
        per_replica: ``replicaGrouping`` of parameters, by name (see replica_groups.py).

    Returns:
        The executable, with its program's worker threads running.

    Raises:
        Error: a batch that does not split into micro-batches, unknown updatable buffers, cycle
            counting without hardware, more IPUs than the machine simulates, or a model on the
            meta device that is not compiled offline.
    """
    layout = batch_layout(options, training)
    check_batch(bound, layout)
    log_anchors(options, layout.device_iterations)
    if check_meta(model, bound, options):  # See [Note: shapes-only models]
        bound = on_meta(bound)
    overlap_marks()  # forget marks left by eager runs of forward
    bar.update(10)
    # An offline executable never runs: PopTorch compiles it in each process without its
    # peers, so no process group is joined (loading it compiles again, online).
    if training and options.connection_type != ConnectionType.Never:
        synchronize_weights(model, options)
    device = DeviceCopy(snapshot)
    grouped = _grouped(per_replica or {}, device, layout, options)
    if options._Popart.options.get("groupNormStridedChannelGrouping"):
        stride_group_norms(device.model)
    _check_updatable_buffers(options, device.model)
    if (
        options._Popart.options.get("instrumentWithHardwareCycleCounter")
        and not ipuHardwareIsAvailable()
    ):
        raise Error("Cycle count logging is only supported on actual IPU hardware.")
    first = layout.micro_batch(bound.map_tensors(to_traced_input), 0, 0, 0)
    program = _build_program(device, first, layout, options, training, grouped)
    _acquire(
        program.program.meta["num_ipus"] if isinstance(program, StagedRunner) else layout.replicas
    )
    if options.connection_type == ConnectionType.Always:
        claim_ipu()  # before the executable, as PopTorch
    marked, overlapped = overlap_marks()
    bar.update(80)
    trainer = make_trainer(device, layout) if make_trainer is not None else None
    if grouped and trainer is not None:
        check_grouped_optimizer([v.name for v in grouped], trainer.snapshot)
        trainer.groups_of = {v.name: v.groups for v in grouped}
    if trainer is not None and isinstance(program, StagedRunner):
        trainer.trace = program.trace
        program.stage_step = trainer.stage_steps(program.program)
    try:
        analysis = analyse_program(program, first, training)
        timing = time_at_compile(analysis, trainer, options)
        trace = getattr(program, "trace", None)
        if trace is not None and options.profile_dir:
            trace_tracks(timing, trace)
        memory = memory_at_compile(program, trainer, options, first, training, analysis, timing)
    except BaseException:
        if isinstance(program, StagedRunner):
            program.close()
        raise
    io = None
    if overlapped or (marked and num_io_tiles(options) > 0):
        io = _io_tiles(program, overlapped, options, training)
    return Executable(bound, layout, device, program, trainer, io, memory, timing, analysis)


def _build_program(
    device: DeviceCopy,
    first: BoundArgs,
    layout: Layout,
    options: Options,
    training: bool,
    grouped: list[GroupedVariable],
) -> Program:
    eager = None
    if not uses_begin_block(device.model) and sharding_of(device.model, options) is None:
        eager = _eager_program(device, first, layout, options, training, grouped)
        if not eager.blocks_seen:
            return eager
    if grouped:
        raise Error(
            "replicaGrouping() is not supported in poptorch_sim for a model split into blocks "
            f"or shards ({', '.join(v.name for v in grouped)}): per-replica variables run only "
            "in single-IPU replicas"
        )
    try:
        return StagedRunner(device.model, options, first, training)
    except TraceFailure as failure:
        logger.warning("%s\n%s", failure, _EAGER_FALLBACK)
        return eager or _eager_program(device, first, layout, options, training)


def _eager_program(
    device: DeviceCopy,
    first: BoundArgs,
    layout: Layout,
    options: Options,
    training: bool,
    grouped: list[GroupedVariable] | None = None,
) -> EagerProgram:
    replicated = layout.replicas > 1
    broadcast = options.broadcast_buffers
    buffers = (
        ReplicaBuffers(device.model, layout.replicas) if replicated and not broadcast else None
    )
    program = EagerProgram(device.model, training, buffers, replicated and broadcast)
    program.grouped = grouped or []
    program.prepare(first, device.check_unchanged)
    checks = options._Popart.options.get("enableFloatingPointChecks", False)
    program.fp_checks = bool(checks)
    program.use_replica_threads(layout.replicas)
    return program


def _io_tiles(program: Program, overlap: bool, options: Options, training: bool) -> IoTiles | None:
    """PopTorch's overlapped-IO checks, then the IO threads of an inference program: a
    load / compute / store pipeline, or (all marks ``NoOverlap``) the same copies just in time.

    Simulated: a training model with overlapped IO runs without IO threads (see
    tests/test_footguns.py).
    """
    if overlap:
        check_overlapped_io(options)
    if training:
        return None
    report = None
    if isinstance(program, StagedRunner):
        trace = program.trace
    else:
        trace = TraceRecorder() if options.profile_dir else None
        if options.profile_dir:
            name = f"overlap_io_trace_{next(_io_serial)}.json"
            report = os.path.join(options.profile_dir, name)
    return IoTiles(
        lambda job, r: program.run_micro_batch(job[0], r, job[1]),  # (inputs, random stream)
        lambda job, fn: (job[0].map_tensors(fn), job[1]),
        program.input_device,
        num_io_tiles(options),
        resolve_threads_per_ipu(None, 1),
        depth=int(options._Popart.options.get("defaultPrefetchBufferingDepth", 1)),
        trace=trace,
        report=report,
        overlap=overlap,
    )


def _grouped(
    per_replica: dict[str, ReplicaGrouping], device: DeviceCopy, layout: Layout, options: Options
) -> list[GroupedVariable]:
    """The device copy's replica-grouped parameters (see replica_groups.py), checked."""
    if not per_replica:
        return []
    if options.Distributed.numProcesses > 1:
        raise Error(
            "replicaGrouping() is not supported in poptorch_sim with several processes "
            f"(Distributed.numProcesses = {options.Distributed.numProcesses}): run the replicas "
            "in one process (replicationFactor)"
        )
    grouped = [
        GroupedVariable(name, grouping, device.model, layout.replicas)
        for name, grouping in per_replica.items()
    ]
    device.grouped = {v.name: v for v in grouped}
    return grouped


def _acquire(needed: int) -> None:
    """Raise PopTorch's error if the model needs more IPUs than the machine simulates.

    With ``POPTORCH_SIM_NUM_IPUS=0`` (no hardware) models run as on PopTorch's IPU Model, which
    has no such limit.
    """
    check_max_ipus(needed)  # PopTorch's per-process limit comes before the machine's size
    available = env.num_ipus()
    if 0 < available < needed:
        raise Error(
            f"Failed to acquire {needed} IPU(s): this machine simulates {available} "
            f"(POPTORCH_SIM_NUM_IPUS={available}). Set POPTORCH_SIM_NUM_IPUS={needed} or more, "
            "or use fewer replicas or IPUs."
        )


def _check_updatable_buffers(options: Options, model: nn.Module) -> None:
    wanted = options._Popart.options.get("updatableNamedBuffers", [])
    known = [name for name, _ in model.named_buffers()]
    for name in wanted:
        if name not in known:
            raise Error(
                f"Invalid updatable buffer {name}: the model has no buffer of that name "
                f"(its buffers: {', '.join(known) or 'none'}). Fix the names given to "
                "Options.updatableNamedBuffers."
            )
