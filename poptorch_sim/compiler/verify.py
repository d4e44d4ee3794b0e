"""The checks PopTorch makes when it compiles a multi-IPU model, with PopTorch's messages (§2.9).

pipelined, training    gradientAccumulation >= 2F - 1   (F: forward pipeline stages)
pipelined, inference   deviceIterations >= F
sharded / phased       no depth constraint
every strategy         IPUs = max(#used, highest id + 1) * replicas; at most 64; a power of
                       two unless autoRoundNumIPUs(True) or offline (as on hardware); checked
                       before the pipeline depth (PopTorch acquires the device first)
parallel phases        even phases on even IPUs, odd on odd
"""

from __future__ import annotations

from typing import Any

from ..enums import ConnectionType, Liveness
from ..errors import Error
from ..logger import logger
from ..options.strategies import Placement, _IExecutionStrategy

__all__ = [
    "check_pipeline_depth",
    "check_ipu_count",
    "check_max_ipus",
    "check_phases",
    "pipeline_stages",
    "MAX_IPUS",
]

MAX_IPUS = 64


def _cpp_error(message: str) -> Error:
    """An error PopTorch raises from its C++ compiler: ``str`` carries its type, as there."""
    err = Error(f"'poptorch_cpp_error': {message}", type="poptorch_cpp_error")
    err.message = message
    return err


def pipeline_stages(forward_stages: int, training: bool) -> int:
    """PopTorch's pipeline depth: ``2F - 1`` when training (backward stages), else ``F``."""
    return 2 * forward_stages - 1 if training else forward_stages


def check_pipeline_depth(forward_stages: int, options: Any, training: bool) -> None:
    """Enough micro-batches to fill a pipeline of ``forward_stages`` stages.

    Raises:
        poptorch.Error: too few gradient accumulation steps (training) or device iterations.
    """
    depth = pipeline_stages(forward_stages, training)
    if training:
        accumulation = options.Training.gradient_accumulation
        if accumulation < depth:
            raise _cpp_error(
                "poptorch.Options().Training.gradientAccumulation must be greater than or equal "
                f"to the number of pipeline stages ({depth}) when using "
                f"poptorch.PipelinedExecution. Please note that a model with {forward_stages} "
                f"pipeline stages in PopTorch will have an additional {forward_stages - 1} "
                f"stages when training. (gradientAccumulation is {accumulation}.)"
            )
    elif options.device_iterations < depth:
        raise _cpp_error(
            "poptorch.Options().deviceIterations must be greater than or equal to the number of "
            f"pipeline stages ({depth}) when using PopTorch.PipelinedExecution. "
            f"(deviceIterations is {options.device_iterations}.)"
        )


def _round_up_power_of_two(n: int) -> int:
    rounded = 1
    while rounded < n:
        rounded *= 2
    return rounded


def check_max_ipus(num_ipus: int) -> None:
    """PopTorch's limit of 64 IPUs per process (checked before any device is acquired)."""
    if num_ipus > MAX_IPUS:
        raise _cpp_error(
            f"Too many IPUs requested ({num_ipus}). Experiments that need more than "
            f"{MAX_IPUS} IPUs require distributed execution."
        )


def check_ipu_count(used_ipus: set[int], options: Any) -> int:
    """How many IPUs the model reserves, checked the way PopTorch checks hardware.

    Args:
        used_ipus: the IPU ids the model's stages run on (one replica).
        options: the model's ``Options``.

    Returns:
        The IPUs reserved: ``max(len(used), max(used) + 1) * replicas``, rounded up to a power
        of two when ``autoRoundNumIPUs(True)``.

    Raises:
        poptorch.Error: more than 64 IPUs, or not a power of two without ``autoRoundNumIPUs``
            (an offline target, ``useOfflineIpuTarget``, is not rounded).
    """
    used = used_ipus or {0}
    num_ipus = max(len(used), max(used) + 1) * options.replication_factor
    check_max_ipus(num_ipus)
    rounded = _round_up_power_of_two(num_ipus)
    # An offline target is made with exactly the IPUs the model uses: nothing is reserved.
    if rounded == num_ipus or options.connection_type == ConnectionType.Never:
        return num_ipus
    reason = ", because PopTorch must reserve a power of 2 or maximum of 64 IPUs per process"
    if not options.auto_round_num_ipus:
        raise _cpp_error(
            f"The model specifies the use of {num_ipus} IPUs, however PopTorch must reserve a "
            f"minimum of {rounded} in order to allow the model to run{reason}. Please "
            "reconfigure your model to use a different number of IPUs or set "
            "poptorch.Options().autoRoundNumIPUs(True)."
        )
    logger.warning(
        "Reserving %d IPUs when the model specifies the use of only %d%s. %d will be reserved "
        "but not used.",
        rounded,
        num_ipus,
        reason,
        rounded - num_ipus,
    )
    check_max_ipus(rounded)
    return rounded


_PHASE_STRIDE = {Liveness.OffChipAfterEachPhase: 4, Liveness.OffChipAfterFwdNoOverlap: 2}


def check_phases(strategy: _IExecutionStrategy, placements: list[Placement]) -> None:
    """PopTorch's phase rules for each block entry of a phased strategy.

    Raises:
        poptorch.Error: a serial-only liveness with parallel phases, or a parallel phase on an
            IPU of the wrong parity.
    """
    if strategy.mode != "phased":
        return
    serial = getattr(strategy, "serial", True)
    liveness = getattr(strategy, "_tensors_liveness", Liveness.AlwaysLive)
    stride = _PHASE_STRIDE.get(liveness, 1)
    if stride > 1 and not serial:
        raise Error("This is only supported for serial phase execution")
    if serial:
        return
    for placement in placements:
        if (placement.phase * stride) % 2 != placement.ipu % 2:
            raise Error(
                "When phases are executed in parallel: even phases must run on even IPUs and "
                f"odd phases on odd IPUs (phase {placement.phase} is on IPU {placement.ipu})"
            )
