"""The executor: what ``trainingModel``/``inferenceModel``/``load`` return, and how it is made.

Public here besides PopTorch's names: ``batch_layout`` (how a model's host batch splits into
micro-batches) and the read-outs ``placement``, ``allreduce_stats`` and ``staged_parts`` of a
compiled model.
"""

from __future__ import annotations

from .executor import PoplarExecutor, allreduce_stats, placement, staged_parts
from .hooks import registerPostCompileHook, registerPreCompileHook
from .inspection import AllReduceStats, Placement, StagedParts
from .layout import Layout, batch_layout
from .wrap import inferenceModel, load, trainingModel

__all__ = [
    "AllReduceStats",
    "Layout",
    "Placement",
    "PoplarExecutor",
    "StagedParts",
    "allreduce_stats",
    "batch_layout",
    "inferenceModel",
    "load",
    "placement",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "staged_parts",
    "trainingModel",
]
