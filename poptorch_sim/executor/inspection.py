"""What an executor tells about itself: tensor names, anchors, timings, RNG and placement.

Each read-out is a function of what it reads (the executable, the options, the last run's
performance record); ``PoplarExecutor`` keeps PopTorch's method names and calls these. Three are
poptorch_sim's own, for benchmarks and tools: ``Placement`` (where a compiled model's stages run),
``AllReduceStats`` (the gradient all-reduce across processes), the batch a model was compiled
for (``compiled_batch_of``) and ``StagedParts`` (what a memory measurement attaches to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import Error
from ..logger import logger, warning_once
from ..options import Options
from .executable import Executable
from .layout import check_batch
from .perf import PerfRecord, counters, latency
from .staged import StagedRunner

__all__ = [
    "AllReduceStats",
    "Placement",
    "StagedParts",
    "allreduce_stats_of",
    "anchored_tensor",
    "compiled_batch_of",
    "cycle_count",
    "latencies",
    "placement_of",
    "staged_parts_of",
    "tensor_names",
]

Latency = tuple[float, float, float]


@dataclass(frozen=True)
class Placement:
    """Where a compiled model runs.

    Attributes:
        staged: whether it is cut into stages on IPU worker threads (False: one program).
        stage_ipus: the IPU of each stage, in stage order (empty for one program).
        cores: how the host's cores are split over the IPU workers, as the runtime logs it
            (empty for one program).
        mode: how the next call computes (``split``, ``lent``, ``one thread`` or ``side by
            side``: See [Note: cores follow the work]; empty for one program).
    """

    staged: bool
    stage_ipus: tuple[int, ...]
    cores: str
    mode: str = ""


@dataclass(frozen=True)
class AllReduceStats:
    """The gradient all-reduce across processes (``popdist``) of a training model.

    Attributes:
        world_size: processes taking part.
        bucket_bytes: the most bytes one all-reduce carries.
        steps: all-reduces done so far; seconds: time spent in them so far.
        bytes_per_step: bytes of gradient this process all-reduced in the last step.
    """

    world_size: int
    bucket_bytes: int
    steps: int
    seconds: float
    bytes_per_step: int


def placement_of(exe: Executable) -> Placement:
    """The ``Placement`` of a compiled model (its core split as of now)."""
    program = exe.program
    if not isinstance(program, StagedRunner):
        return Placement(staged=False, stage_ipus=(), cores="")
    stage_ipus = tuple(stage.ipu for stage in program.program.stages)
    share = program.runtime.cores
    return Placement(True, stage_ipus, share.describe(), share.mode())


@dataclass(frozen=True)
class StagedParts:
    """What tools attach to in a compiled model cut into stages (``memory.measure``).

    Attributes:
        stages: the program's stages (``StageSpec``: index, IPU, module, inputs, outputs).
        executors: each stage's executor by stage index; its ``probe`` attribute, None between
            measurements, is where a ``memory.probe.SavedProbe`` goes.
        trainer: the device trainer (optimizer snapshot, optimizer, parameters); None for
            inference.
    """

    stages: tuple[Any, ...]
    executors: dict[int, Any]
    trainer: Any


def staged_parts_of(exe: Executable) -> StagedParts | None:
    """The ``StagedParts`` of a compiled model, or None when it runs as one program."""
    program = exe.program
    if not isinstance(program, StagedRunner):
        return None
    stages = tuple(program.program.stages)
    return StagedParts(stages, program.runtime.stage_executors(), exe.trainer)


def allreduce_stats_of(exe: Executable) -> AllReduceStats | None:
    """The all-reduce figures of a training model run by several processes, else None."""
    reducer = exe.trainer.reducer if exe.trainer is not None else None
    if reducer is None:
        return None
    return AllReduceStats(
        world_size=reducer.world_size,
        bucket_bytes=reducer.bucket_bytes,
        steps=reducer.steps,
        seconds=reducer.seconds,
        bytes_per_step=reducer.bytes_per_step,
    )


def compiled_batch_of(exe: Executable) -> int | None:
    """The batch dimension of the first input a model was compiled with (None: it has none).

    Raises:
        AssertionError: the compiled inputs do not divide into the call's micro-batches
            (PopTorch's wording).
    """
    check_batch(exe.inputs, exe.layout)
    tensors = exe.inputs.tensors()
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else None


def tensor_names(exe: Executable | None, training: bool) -> list[str]:
    """``getTensorNames``: the tensors that can be anchored (``Gradient___<param>``, ...)."""
    if exe is None:
        raise AssertionError("Model must be compiled before calling getTensorNames")
    names = []
    for name, _, _ in exe.device.pairs:
        names.append(name)
        if training:
            names += [f"Gradient___{name}", f"UpdatedVar___{name}"]
    return names


def anchored_tensor(exe: Executable | None, options: Options, short_name: str) -> torch.Tensor:
    """``getAnchoredTensor``: the latest value anchored as ``short_name`` by ``anchorTensor``."""
    if short_name not in options.anchored_tensors or exe is None:
        raise AssertionError(f"No tensor with name {short_name} found.")
    if short_name not in exe.anchored:
        raise AssertionError(f"No tensor with name {short_name} found.")
    return exe.anchored[short_name]


def cycle_count(options: Options, ran: bool, timing: Any) -> int:
    """``cycleCount``: the predicted cycles of the last call, as PopART counts them (one tile
    of the first IPU of the first replica, over the whole call: device iterations × the
    gradient-accumulation loop, the weight updates and the host copies).

    Simulated: a prediction of the time model (``poptorch_sim.time_report``); PopTorch counts
    cycles only on hardware. Every call of a compiled model is predicted to take as long.

    Raises:
        Error: PopTorch's messages: the option is off, or the model has not run yet.
    """
    if not options._Popart.options.get("instrumentWithHardwareCycleCounter"):
        raise Error(
            "Cycle count logging is disabled. Please set option logCycleCount to True to enable."
        )
    if not ran or timing is None:
        raise Error("Please run the model at least once before obtaining cycle count.")
    instances = options.Distributed.numProcesses
    if instances > 1:
        warning_once(
            f"cycleCount() predicts one instance of {instances} (Distributed.numProcesses): "
            "its first replica, with the all-reduce over instances assumed in step; read "
            "poptorch_sim.time_report(model) for every instance's throughput"
        )
    cycles = int(timing.cycles)
    logger.debug("Total number of IPU cycles: %d", cycles)
    return cycles


def latencies(perf: PerfRecord | None) -> dict[str, Latency]:
    """The (min, max, mean) seconds of PopTorch's four latencies of the last run.

    ``latency``: first input requested → last output back; ``compute``: last input
    transferred → last output ready; ``host_ipu`` and ``ipu_host``: the transfers (zero here:
    inputs are views of host memory and outputs host tensors).
    """
    c = counters(perf)
    return {
        "latency": latency(c, "input", min, "output_complete", max),
        "compute": latency(c, "input_complete", max, "output", max),
        "host_ipu": latency(c, "input", min, "input_complete", max),
        "ipu_host": latency(c, "output", min, "output_complete", max),
    }
