"""The C++ tile kernels (``torch.ops.poptorch_sim.*``) and their typed Python wrappers.

Importing this package loads ``poptorch_sim._C`` (the CPU kernels) and registers the generic
torch implementations of :mod:`.generic` as the ops' CUDA kernels. Sorting family and tile
engine: this package's :mod:`.sorting` and :mod:`.engine`; accumulation, fused optimizer
updates and off-chip state streaming: :mod:`.optim`.
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
from .simd_choice import simd_report
from .sorting import argsort, batched_nms, nms, sort, topk

generic.register("cuda")

__all__ = [
    "KernelCounters",
    "argsort",
    "batched_nms",
    "counters",
    "engine",
    "generic",
    "nms",
    "num_tiles",
    "reset_counters",
    "set_num_tiles",
    "set_simd_level",
    "simd",
    "simd_choice",
    "simd_level",
    "simd_report",
    "sort",
    "supported_simd_level",
    "tiles",
    "topk",
]

try:
    from . import optim as _optim
except ModuleNotFoundError as error:  # optim.py not written yet in this checkout
    if error.name != f"{__name__}.optim":
        raise
    _optim = None

if _optim is not None:
    from .optim import (
        KINDS,
        TILE_ELEMENTS,
        FusedOptimizer,
        accumulate_,
        accumulate_many_,
        adam_step_,
        grad_norm,
        lamb_step_,
        offload_reset_stats,
        offload_stats,
        rmsprop_step_,
        sgd_step_,
    )

    __all__ += [
        "KINDS",
        "TILE_ELEMENTS",
        "FusedOptimizer",
        "accumulate_",
        "accumulate_many_",
        "adam_step_",
        "grad_norm",
        "lamb_step_",
        "offload_reset_stats",
        "offload_stats",
        "rmsprop_step_",
        "sgd_step_",
    ]

simd_choice.apply()  # each family's fastest SIMD variant here: measured once, then cached
