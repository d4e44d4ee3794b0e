"""PopTorch's out-of-memory behaviour at compile: a warning, or ``poptorch.Error``.

On an IPU a graph that does not fit fails to compile (``popart::memory_allocation_err``)
unless the engine option ``debug.allowOutOfMemory`` is set, which ``opts.enableProfiling()``
does so that the profile of what did not fit can be looked at. The simulator runs whatever
fits in the host's memory, so by default it only warns; ``POPTORCH_SIM_OUT_OF_MEMORY=error``
makes it fail at compile as an IPU would.
"""

from __future__ import annotations

from typing import Any

from .. import env
from ..errors import Error
from ..logger import logger
from .report import IpuMemory, MemoryReport, format_bytes

__all__ = ["allows_out_of_memory", "check_limits", "out_of_memory_message"]


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def allows_out_of_memory(options: Any) -> bool:
    """Whether ``debug.allowOutOfMemory`` is set in ``POPLAR_ENGINE_OPTIONS`` or the options'
    ``engineOptions`` (``opts.enableProfiling()`` sets it)."""
    engine = dict(options._Popart.options.get("engineOptions") or {})
    engine.update(env.engine_options())
    return _truthy(engine.get("debug.allowOutOfMemory", "false"))


def out_of_memory_message(ipu: IpuMemory, profile_dir: str | None = None) -> str:
    """``Out of memory on IPU 1: 1.2 GiB needed, 918.5 MiB available (largest: ...)``."""
    largest = ", ".join(f"{c.replace('_', ' ')} {format_bytes(b)}" for c, b in ipu.largest(3))
    where = f" The memory report is in {profile_dir}." if profile_dir else ""
    return (
        f"Out of memory on IPU {ipu.ipu}: the estimate is {format_bytes(ipu.total)} "
        f"({ipu.total} bytes) against a limit of {format_bytes(ipu.limit)} ({ipu.limit} bytes); "
        f"largest: {largest}. Move BeginBlocks to balance the IPUs, keep the optimizer state "
        "off chip (TensorLocations.setOptimizerLocation), shard it across replicas "
        "(useReplicatedTensorSharding), recompute activations (autoRecomputation) or use "
        f"fewer micro-batches in flight.{where}"
    )


def check_limits(report: MemoryReport, options: Any) -> None:
    """Warn about (or, with ``POPTORCH_SIM_OUT_OF_MEMORY=error``, raise for) IPUs over the limit.

    Raises:
        Error: an IPU does not fit, the mode is ``error`` and out-of-memory is not allowed.
        ValueError: a bad ``POPTORCH_SIM_OUT_OF_MEMORY``.
    """
    mode = env.out_of_memory()
    over = report.over_limit
    if not over:
        return
    profile_dir = options.profile_dir
    if mode == "error" and not allows_out_of_memory(options):
        raise Error(
            "\n".join(out_of_memory_message(m, profile_dir) for m in over)
            + "\n(set POPTORCH_SIM_OUT_OF_MEMORY=warn, or the engine option "
            "debug.allowOutOfMemory, to run it anyway)"
        )
    for m in over:
        logger.warning("%s", out_of_memory_message(m, profile_dir))
