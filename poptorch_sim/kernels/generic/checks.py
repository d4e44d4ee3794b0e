"""Argument checks of the generic optimizer kernels: the C++ kernels' TORCH_CHECKs, same words.

Beyond the C++ checks, each state tensor may live on its parameter's device or, off-chip, in
host memory (see [Note: generic off-chip streaming]); params and grads share a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["TILE", "check_buffer", "check_common", "check_lists", "check_steps"]

TILE = 1024  # chunk_elements must be whole C++ tiles
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_buffer(t: Tensor | None, what: str, i: int, param: Tensor, host_ok: bool) -> None:
    if t is None:
        raise RuntimeError(f"{what}[{i}] is undefined")
    if t.dtype not in _FLOATS:
        raise RuntimeError(f"{what}[{i}] must be float32, float16 or bfloat16, got {t.dtype}")
    if t.shape != param.shape:
        raise RuntimeError(
            f"{what}[{i}] has shape {list(t.shape)} but params[{i}] has shape {list(param.shape)}"
        )
    if not t.is_contiguous():
        raise RuntimeError(f"{what}[{i}] must be contiguous (a flat buffer)")
    if t.device != param.device and not (host_ok and t.device.type == "cpu"):
        where = "the CPU (off-chip) or " if host_ok else ""
        raise RuntimeError(
            f"{what}[{i}] is on {t.device} but params[{i}] is on {param.device}; it must be on "
            f"{where}the parameter's device"
        )


def check_lists(
    params: Sequence[Tensor], grads: Sequence[Tensor], states: dict[str, Sequence[Tensor]]
) -> None:
    if len(params) != len(grads):
        raise RuntimeError(
            f"params and grads must have the same length, got {len(params)} params and "
            f"{len(grads)} grads"
        )
    for name, lst in states.items():
        if len(lst) != len(params):
            raise RuntimeError(
                f"{name} must have one tensor per param, got {len(lst)} for {len(params)} params"
            )
    for i, p in enumerate(params):
        check_buffer(p, "params", i, p, False)
        check_buffer(grads[i], "grads", i, p, False)
        for name, lst in states.items():
            check_buffer(lst[i], name, i, p, True)


def check_common(loss_scaling: float, clip_coef: float, chunk_elements: int) -> None:
    if not (loss_scaling > 0.0 and math.isfinite(loss_scaling)):
        raise RuntimeError(f"loss_scaling must be a positive finite number, got {loss_scaling}")
    if not clip_coef >= 0.0:
        raise RuntimeError(f"clip_coef must be >= 0, got {clip_coef}")
    if chunk_elements < 0 or chunk_elements % TILE != 0:
        raise RuntimeError(
            f"chunk_elements must be 0 (state on-chip) or a positive multiple of {TILE}, got "
            f"{chunk_elements}"
        )


def check_steps(steps: Sequence[float], n: int) -> None:
    if len(steps) != n:
        raise RuntimeError(f"steps must have one entry per param, got {len(steps)} for {n} params")
    for i, s in enumerate(steps):
        if not s >= 1.0:
            raise RuntimeError(f"steps[{i}] must be >= 1 (the step being taken), got {s}")
