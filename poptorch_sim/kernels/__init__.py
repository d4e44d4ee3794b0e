"""The C++ tile kernels (``torch.ops.poptorch_sim.*``) and their typed Python wrappers.

Importing this package loads ``poptorch_sim._C`` (the CPU kernels) and registers the generic
torch implementations of :mod:`.generic` as the ops' CUDA kernels. Sorting family and tile
engine: this package's :mod:`.sorting` and :mod:`.engine`; accumulation, fused optimizer
updates and off-chip state streaming: :mod:`.optim` (the optimizer built on them is
:mod:`poptorch_sim.optim.device`).
"""

from __future__ import annotations

from . import engine, generic, simd_choice
from .engine import (
    KernelCounters,
    counters,
    num_tiles,
    reset_counters,
    set_num_tiles,
    set_simd_level,
    simd,
    simd_level,
    supported_simd_level,
    tiles,
)
from .optim import (
    TILE_ELEMENTS,
    accumulate_,
    accumulate_many_,
    adam_step_,
    grad_norm,
    increment_steps_,
    lamb_step_,
    offload_reset_stats,
    offload_stats,
    rmsprop_step_,
    sgd_step_,
)
from .simd_choice import simd_report
from .sorting import argsort, batched_nms, nms, sort, topk

generic.register("cuda")

__all__ = [
    "TILE_ELEMENTS",
    "KernelCounters",
    "accumulate_",
    "accumulate_many_",
    "adam_step_",
    "argsort",
    "batched_nms",
    "counters",
    "engine",
    "generic",
    "grad_norm",
    "increment_steps_",
    "lamb_step_",
    "nms",
    "num_tiles",
    "offload_reset_stats",
    "offload_stats",
    "reset_counters",
    "rmsprop_step_",
    "set_num_tiles",
    "set_simd_level",
    "sgd_step_",
    "simd",
    "simd_choice",
    "simd_level",
    "simd_report",
    "sort",
    "supported_simd_level",
    "tiles",
    "topk",
]

simd_choice.load()  # the cached SIMD choices; families the cache lacks are measured on first use
