"""The options that decide how long a call takes on IPUs, read once from ``poptorch.Options``.

==========================================  ==================================================
option                                      effect on the estimate
==========================================  ==================================================
``useOfflineIpuTarget(ipu_version)``        the IPU's constants (``hardware.py``); else
                                            ``POPTORCH_SIM_IPU_VERSION``, else Mk2
``deviceIterations`` (DI)                   steps per call (each a GA loop and an update)
``Training.gradientAccumulation`` (GA)      micro-batches per step (pipeline cycles
                                            GA + 2(N - 1))
``replicationFactor`` (R) and               replicas whose gradients are all-reduced, and
``Distributed.numProcesses`` (instances)    that multiply samples per second
``setOptimizerLocation``                    off chip: the update streams its state from
                                            streaming memory; RTS: each replica updates
                                            1/R of each tensor
``_Popart.set("autoRecomputation", ...)``   a second forward per micro-batch in backward;
                                            unset, PopTorch recomputes pipelined training
                                            over several IPUs (as the IPU does; the
                                            simulator's own choice, which the memory
                                            estimate follows, is not used here)
``TensorLocations.numIOTiles``              host IO overlapped with compute (IO tiles)
==========================================  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import env
from ..memory.settings import chosen_recomputation, memory_settings
from .hardware import IpuHardware, ipu_hardware

__all__ = ["TimeSettings", "ipu_version_of", "time_settings"]


@dataclass(frozen=True)
class TimeSettings:
    """What ``Options`` say about time (see the module table)."""

    hardware: IpuHardware
    training: bool
    device_iterations: int
    gradient_accumulation: int
    replicas: int
    instances: int
    off_chip: bool
    rts: bool
    recompute: bool
    io_tiles: int

    @property
    def total_replicas(self) -> int:
        """Replicas of every instance (the all-reduce's ring)."""
        return self.replicas * self.instances


def ipu_version_of(options: Any) -> int:
    """The IPU version a model is timed on: ``useOfflineIpuTarget``'s, else
    ``POPTORCH_SIM_IPU_VERSION``'s, else 2 (Mk2)."""
    if options.exists("ipu_version"):
        return int(options.ipu_version)
    version = env.ipu_version()
    return 2 if version is None else version


def _recomputes(options: Any, mode: str, training: bool, num_ipus: int) -> bool:
    """The user's ``autoRecomputation``, else PopTorch's default: pipelined training over
    several IPUs recomputes."""
    chosen = chosen_recomputation(options, mode, training)
    if chosen is not None:
        return chosen
    return training and mode == "pipelined" and num_ipus > 1


def time_settings(options: Any, training: bool, mode: str, num_ipus: int) -> TimeSettings:
    """Read the time-related options of ``options`` (a ``poptorch.Options``).

    Raises:
        Error: an unknown IPU version.
    """
    memory = memory_settings(options, training, mode, recompute=False)
    instances = options.Distributed.numProcesses if options.Distributed.exists(
        "num_distributed_processes") else 1  # fmt: skip
    return TimeSettings(
        hardware=ipu_hardware(ipu_version_of(options)),
        training=training,
        device_iterations=options.device_iterations,
        gradient_accumulation=options.Training.gradient_accumulation if training else 1,
        replicas=options.replication_factor,
        instances=max(1, int(instances)),
        off_chip=memory.off_chip,
        rts=memory.rts,
        recompute=_recomputes(options, mode, training, num_ipus),
        io_tiles=int(options.TensorLocations._values.get("numIOTiles", 0)),
    )
