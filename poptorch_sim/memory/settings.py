"""The options that decide what an IPU holds, read once from ``poptorch.Options``.

=========================================  ==================================================
option                                     effect on the estimate
=========================================  ==================================================
``Training.gradientAccumulation`` (GA)     micro-batches per step; GA > 1 needs gradient
                                           accumulators (replicas alone reduce each gradient
                                           in place, as PopART does)
``replicationFactor`` (R)                  RTS divides optimizer state by R
``TensorLocations.setOptimizerLocation``   ``useOnChipStorage(False)``: state in streaming
                                           memory (0 on chip); ``useReplicatedTensorSharding``
                                           shards it; ``minElementsFor*`` keep small tensors
                                           on chip / whole
``_Popart.set("autoRecomputation", 3|4)``  RecomputationType.Pipeline (pipelined training) or
                                           RecomputeAll: a stage keeps only its inputs (and
                                           the values marked ``recomputationCheckpoint``) per
                                           micro-batch and recomputes the rest in backward
=========================================  ==================================================

Not set, PopTorch turns on RecomputationType.Pipeline for pipelined training over more than one
IPU. Simulated: the simulator does so only when a stage marks values with
``recomputationCheckpoint``; otherwise its stages keep every activation until their backward
(no second forward), and the estimate counts what the simulator keeps (see
tests/test_footguns.py). Set ``autoRecomputation`` to 3 for PopTorch's memory, to 0 for none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..runtime.checkpoints import has_checkpoints

__all__ = ["MemorySettings", "chosen_recomputation", "memory_settings", "recomputes"]

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


def recomputes(options: Any, mode: str, training: bool, stages: Sequence[Any] = ()) -> bool:
    """Whether stages recompute their forward in backward (PopART's automatic recomputation).

    ``RecomputationType.Pipeline`` applies to pipelined training, ``RecomputeAll`` to any
    training with stages. Not set: Pipeline for pipelined training over several IPUs whose
    ``stages`` (``StageSpec``) mark values with ``recomputationCheckpoint`` (see the module
    docstring).
    """
    chosen = chosen_recomputation(options, mode, training)
    if chosen is not None:
        return chosen
    pipelined = training and mode == "pipelined" and len({s.ipu for s in stages}) > 1
    return pipelined and any(has_checkpoints(s.module, unknown=False) for s in stages)


def chosen_recomputation(options: Any, mode: str, training: bool) -> bool | None:
    """Whether ``autoRecomputation``, where the user set it, makes stages recompute; None where
    it is not set (each reader has its own default)."""
    value = options._Popart.options.get("autoRecomputation")
    if value is None:
        return None
    try:
        value = int(value)
    except (TypeError, ValueError):
        return False
    return training and (value == _RECOMPUTE_ALL or (value == _PIPELINE and mode == "pipelined"))


def memory_settings(
    options: Any, training: bool, mode: str = "pipelined", recompute: bool | None = None
) -> MemorySettings:
    """Read the memory-related options of ``options`` (a ``poptorch.Options``).

    ``recompute``: what the compiled program decided (default: read from the options).
    """
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
        recompute=recomputes(options, mode, training) if recompute is None else recompute,
    )
