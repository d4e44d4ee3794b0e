"""Typed wrappers of the accumulation and fused-optimizer tile kernels.

Each op runs the C++ kernel on CPU tensors and its generic torch implementation
(:mod:`.generic`) when any operand is on CUDA. The optimizer that calls them, state and all,
is :mod:`poptorch_sim.optim.device`.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import Tensor

from . import simd_choice
from .engine import load_library
from .generic import offload as generic_offload

__all__ = [
    "TILE_ELEMENTS",
    "accumulate_",
    "accumulate_many_",
    "adam_step_",
    "grad_norm",
    "increment_steps_",
    "lamb_step_",
    "offload_reset_stats",
    "offload_stats",
    "rmsprop_step_",
    "sgd_step_",
]

# Elements per tile of the C++ kernels; off-chip chunks are whole tiles (csrc/optim/optimizer.h).
TILE_ELEMENTS = 1024


load_library()
_ops = torch.ops.poptorch_sim
# The same C++ functions bound by pybind11 (csrc/module.cpp, generated from the table in
# csrc/optim/ops.h): `direct=True` calls them without the dispatcher, whose argument
# conversion costs ~1 us per tensor of each list.
_direct = importlib.import_module("poptorch_sim._C")


def _call(name: str, direct: bool, lists: tuple, hyper: dict[str, Any]) -> Any:
    """Runs op ``name``; ``hyper`` is in schema order (the bindings take it positionally)."""
    if name != "increment_steps_" and lists[0]:  # the steps' SIMD family (simd_choice)
        simd_choice.first_use("optimizer", lists[0][0])
    if direct and not torch.compiler.is_compiling():
        return getattr(_direct, name)(*lists, *hyper.values())
    return getattr(_ops, name)(*lists, **hyper)


def accumulate_(accum: Tensor, grad: Tensor, scale: float = 1.0) -> Tensor:
    """Adds ``grad * scale`` into the flat accumulator ``accum`` in place.

    Args:
        accum: contiguous float32/float16/bfloat16 accumulator (the optimizer's ``accum_type``),
            on the CPU or a CUDA device.
        grad: gradient with the same number of elements, float32/float16/bfloat16, on
            ``accum``'s device.
        scale: 1/(GA*R) for Mean reduction, 1.0 for Sum.

    Returns:
        ``accum``.

    >>> acc = torch.zeros(4); accumulate_(acc, torch.ones(4), 0.5)
    tensor([0.5000, 0.5000, 0.5000, 0.5000])
    """
    simd_choice.first_use("accumulate", accum, grad)
    _ops.accumulate_(accum, grad, scale)
    return accum


def accumulate_many_(accums: list[Tensor], grads: list[Tensor], scale: float = 1.0) -> None:
    """``accumulate_`` over lists of accumulators and gradients (one call for all params)."""
    if accums and grads:
        simd_choice.first_use("accumulate", accums[0], grads[0])
    _ops.accumulate_many_(accums, grads, scale)


def grad_norm(grads: list[Tensor], loss_scaling: float = 1.0) -> Tensor:
    """Global L2 norm of ``grads / loss_scaling`` (as ``clip_grad_norm_`` computes it).

    Returns:
        A 0-d float32 tensor, on the CPU for CPU gradients, else on the first one's device.
    """
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    simd_choice.first_use("optimizer", grads[0])  # its sum of squares
    return _ops.grad_norm(grads, loss_scaling)


def increment_steps_(steps: list[Tensor], direct: bool = False) -> list[float]:
    """Adds 1 to each 0-d ``step`` tensor in place (one call for all params).

    Returns:
        The incremented values, as ``float(step)`` would read them.

    >>> increment_steps_([torch.tensor(0.0), torch.tensor(4.0)])
    [1.0, 5.0]
    """
    if not steps:
        return []
    return _call("increment_steps_", direct, (steps,), {})


def sgd_step_(params: list[Tensor], grads: list[Tensor], momentum_buffers: list[Tensor], *,
              lr: float, momentum: float, dampening: float, weight_decay: float,
              nesterov: bool, maximize: bool, first_step: bool, loss_scaling: float = 1.0,
              clip_coef: float = 1.0, chunk_elements: int = 0,
              direct: bool = False) -> None:  # fmt: skip
    """Fused ``torch.optim.SGD`` step; ``first_step`` initialises the momentum buffers.

    ``direct`` (all step wrappers): call the C++ function without the dispatcher, for eager
    CPU tensors only (no fake or meta tensors); ignored while torch.compile traces.
    """
    hyper = dict(
        lr=lr,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        maximize=maximize,
        first_step=first_step,
        loss_scaling=loss_scaling,
        clip_coef=clip_coef,
        chunk_elements=chunk_elements,
    )
    _call("sgd_step_", direct, (params, grads, momentum_buffers), hyper)


def adam_step_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], steps: list[float], *, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, decoupled_weight_decay: bool,
               bias_correction: bool = True, maximize: bool = False, loss_scaling: float = 1.0,
               clip_coef: float = 1.0, chunk_elements: int = 0,
               direct: bool = False) -> None:  # fmt: skip
    """Fused ``torch.optim.Adam`` (or ``AdamW`` with ``decoupled_weight_decay``) step.

    ``steps`` are the step numbers being taken (already incremented, >= 1).
    """
    hyper = dict(
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        decoupled_weight_decay=decoupled_weight_decay,
        bias_correction=bias_correction,
        maximize=maximize,
        loss_scaling=loss_scaling,
        clip_coef=clip_coef,
        chunk_elements=chunk_elements,
    )
    _call("adam_step_", direct, (params, grads, exp_avgs, exp_avg_sqs, steps), hyper)


def rmsprop_step_(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor],
                  momentum_buffers: list[Tensor], grad_avgs: list[Tensor], *, lr: float,
                  alpha: float, eps: float, weight_decay: float, momentum: float,
                  centered: bool, maximize: bool = False, use_tf_variant: bool = False,
                  loss_scaling: float = 1.0, clip_coef: float = 1.0,
                  chunk_elements: int = 0, direct: bool = False) -> None:  # fmt: skip
    """Fused ``torch.optim.RMSprop`` step (``use_tf_variant``: eps inside the square root)."""
    hyper = dict(
        lr=lr,
        alpha=alpha,
        eps=eps,
        weight_decay=weight_decay,
        momentum=momentum,
        centered=centered,
        maximize=maximize,
        use_tf_variant=use_tf_variant,
        loss_scaling=loss_scaling,
        clip_coef=clip_coef,
        chunk_elements=chunk_elements,
    )
    lists = (params, grads, square_avgs, momentum_buffers, grad_avgs)
    _call("rmsprop_step_", direct, lists, hyper)


def lamb_step_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], steps: list[float], *, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, max_weight_norm: float,
               bias_correction: bool = True, loss_scaling: float = 1.0, clip_coef: float = 1.0,
               chunk_elements: int = 0, direct: bool = False) -> None:  # fmt: skip
    """Fused PopTorch LAMB step (trust ratio min(||w||, max_weight_norm) / ||r|| per param)."""
    hyper = dict(
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        max_weight_norm=max_weight_norm,
        bias_correction=bias_correction,
        loss_scaling=loss_scaling,
        clip_coef=clip_coef,
        chunk_elements=chunk_elements,
    )
    _call("lamb_step_", direct, (params, grads, exp_avgs, exp_avg_sqs, steps), hyper)


def offload_stats() -> dict[str, int]:
    """Off-chip streaming counters since the last reset, C++ (CPU) and generic (CUDA) kernels.

    Returns:
        ``{"chunks": ..., "bytes_to_device": ..., "bytes_to_host": ...}``.
    """
    cpp = _ops.offload_stats()
    chunks, to_device, to_host = (a + b for a, b in zip(cpp, generic_offload.stats()))
    return {"chunks": chunks, "bytes_to_device": to_device, "bytes_to_host": to_host}


def offload_reset_stats() -> None:
    """Zeroes the off-chip streaming counters (of the C++ and of the generic kernels)."""
    _ops.offload_reset_stats()
    generic_offload.reset_stats()


def _register_fakes() -> None:
    def _none(*args: Any, **kwargs: Any) -> None:
        return None

    @torch.library.register_fake("poptorch_sim::increment_steps_")
    def _increment_steps_fake(steps: list[Tensor]) -> list[float]:
        return [0.0] * len(steps)

    for name in ("sgd_step_", "adam_step_", "rmsprop_step_", "lamb_step_", "accumulate_",
                 "accumulate_many_"):  # fmt: skip
        torch.library.register_fake(f"poptorch_sim::{name}")(_none)

    @torch.library.register_fake("poptorch_sim::grad_norm")
    def _grad_norm_fake(grads: list[Tensor], loss_scaling: float) -> Tensor:
        return grads[0].new_empty((), dtype=torch.float32)


_register_fakes()
