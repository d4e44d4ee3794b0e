"""The options that decide what an IPU holds, read once from ``poptorch.Options``.

=========================================  ==================================================
option                                     effect on the estimate
=========================================  ==================================================
``Training.gradientAccumulation`` (GA)     micro-batches per step; GA > 1 needs gradient
                                           accumulators (also replicas > 1)
``replicationFactor`` (R)                  RTS divides optimizer state by R
``TensorLocations.setOptimizerLocation``   ``useOnChipStorage(False)``: state in streaming
                                           memory (0 on chip); ``useReplicatedTensorSharding``
                                           shards it; ``minElementsFor*`` keep small tensors
                                           on chip / whole
``_Popart.set("autoRecomputation", 3|4)``  RecomputationType.Pipeline (pipelined training) or
                                           RecomputeAll: a stage keeps only its inputs per
                                           micro-batch and recomputes the rest in backward
=========================================  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MemorySettings", "memory_settings", "recomputes"]

_PIPELINE, _RECOMPUTE_ALL = 3, 4


@dataclass(frozen=True)
class MemorySettings:
    """What ``Options`` say about memory (see the module table)."""

    training: bool
    gradient_accumulation: int
    replicas: int
    off_chip: bool
    rts: bool
    min_elements_off_chip: int
    min_elements_rts: int
    recompute: bool


def recomputes(options: Any, mode: str, training: bool) -> bool:
    """Whether stages recompute their forward in backward (PopART's automatic recomputation).

    ``RecomputationType.Pipeline`` applies to pipelined training, ``RecomputeAll`` to any
    training with stages.
    """
    value = options._Popart.options.get("autoRecomputation", 0)
    try:
        value = int(value)
    except (TypeError, ValueError):
        return False
    return training and (value == _RECOMPUTE_ALL or (value == _PIPELINE and mode == "pipelined"))


def memory_settings(options: Any, training: bool, mode: str = "pipelined") -> MemorySettings:
    """Read the memory-related options of ``options`` (a ``poptorch.Options``)."""
    locations = options._tensor_locations
    where: dict[str, Any] = (
        dict(locations.location_optimizer) if locations.exists("location_optimizer") else {}
    )
    return MemorySettings(
        training=training,
        gradient_accumulation=options.Training.gradient_accumulation if training else 1,
        replicas=options.replication_factor,
        off_chip=not bool(where.get("onChip", 1)),
        rts=bool(where.get("useReplicatedTensorSharding", 0)) and options.replication_factor > 1,
        min_elements_off_chip=int(where.get("minElementsForOffChip", 0)),
        min_elements_rts=int(where.get("minElementsForReplicatedTensorSharding", 0)),
        recompute=recomputes(options, mode, training),
    )
