"""Generic (any-device) implementations of every ``torch.ops.poptorch_sim`` kernel.

The C++ tile kernels (``csrc/``) serve CPU tensors. This package implements each op with
plain torch operations (``torch.sort``, ``torchvision.ops.nms``, element-wise tensor math in
the C++ kernels' operation order) and registers it as the op's CUDA kernel, so a simulated IPU
mapped onto ``cuda:i`` (see ``poptorch_sim.runtime.default_devices``) runs on torch's CUDA
kernels with the same contracts and, for the optimizer updates, the same numbers to float32
rounding. A call with tensors on both CPU and CUDA (off-chip optimizer state in host memory
beside CUDA parameters) dispatches here too. The tile-engine counters
(:func:`poptorch_sim.kernels.counters`) count only the C++ kernels; off-chip streaming is
counted by both (see [Note: generic off-chip streaming]).

Simulated: these CUDA kernels are torch's, not tile kernels, and they have not been run on a
GPU in this project's CI (the CPU tests compare each function with its C++ kernel directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..engine import load_library
from . import offload
from .accumulation import accumulate_, accumulate_many_, stream_sum
from .optim import (
    adam_step_,
    grad_norm,
    increment_steps_,
    lamb_step_,
    rmsprop_step_,
    sgd_step_,
)
from .sorting import argsort, batched_nms, nms, sort, topk

__all__ = [
    "KERNELS",
    "accumulate_",
    "accumulate_many_",
    "adam_step_",
    "argsort",
    "batched_nms",
    "grad_norm",
    "increment_steps_",
    "lamb_step_",
    "nms",
    "offload",
    "register",
    "rmsprop_step_",
    "sgd_step_",
    "sort",
    "stream_sum",
    "topk",
]

# Op name (in the poptorch_sim namespace) -> its generic implementation. The ops without
# tensor arguments (engine_*, offload_*) have one device-independent kernel and need none.
KERNELS: dict[str, Callable[..., Any]] = {
    "sort": sort,
    "argsort": argsort,
    "topk": topk,
    "nms": nms,
    "batched_nms": batched_nms,
    "accumulate_": accumulate_,
    "accumulate_many_": accumulate_many_,
    "stream_sum": stream_sum,
    "sgd_step_": sgd_step_,
    "adam_step_": adam_step_,
    "rmsprop_step_": rmsprop_step_,
    "lamb_step_": lamb_step_,
    "grad_norm": grad_norm,
    "increment_steps_": increment_steps_,
}

_registered: set[str] = set()


def register(device_type: str = "cuda") -> None:
    """Registers every generic implementation as the ops' kernel for ``device_type``; idempotent.

    Args:
        device_type: a torch device type, ``"cuda"`` by default (the CPU has the C++ kernels).
    """
    if device_type in _registered:
        return
    load_library()
    for name, fn in KERNELS.items():
        torch.library.register_kernel(f"poptorch_sim::{name}", device_type, fn)
    _registered.add(device_type)
