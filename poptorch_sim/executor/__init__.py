"""The executor: what ``trainingModel``/``inferenceModel`` return, and how they are made."""

from __future__ import annotations

from .executor import PoplarExecutor
from .hooks import registerPostCompileHook, registerPreCompileHook
from .wrap import inferenceModel, trainingModel

__all__ = [
    "PoplarExecutor",
    "inferenceModel",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "trainingModel",
]
