"""Generic gradient accumulation (``accumulate_``/``accumulate_many_``) and ``stream_sum``.

Both follow their C++ kernels' arithmetic exactly: ``accum + scale * grad`` in float32,
rounded once into the accumulator (two separate ops, so no fused multiply-add on any device);
``stream_sum`` adds the micro-batches of each replica one after another, in the order they
arrived, in the dtype's op-math type (float32 for float16/bfloat16), and rounds once.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["accumulate_", "accumulate_many_", "stream_sum"]

_ACCUM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SUMMABLE = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
)  # fmt: skip


def _check_pair(accum: Tensor, grad: Tensor, where: str) -> None:
    for name, t in (("accum", accum), ("grad", grad)):
        if t.dtype not in _ACCUM_DTYPES:
            raise RuntimeError(
                f"accumulate_: {name}{where} must be float32, float16 or bfloat16, got {t.dtype}"
            )
    if accum.device != grad.device:
        raise RuntimeError(
            f"accumulate_: accum{where} is on {accum.device} but grad{where} is on {grad.device}"
        )
    if accum.numel() != grad.numel():
        raise RuntimeError(
            f"accumulate_: accum{where} has {accum.numel()} elements (shape "
            f"{list(accum.shape)}) but grad{where} has {grad.numel()} (shape {list(grad.shape)})"
        )
    if not accum.is_contiguous():
        raise RuntimeError(f"accumulate_: accum{where} must be contiguous (a flat buffer)")


def _accumulate_into(accum: Tensor, grad: Tensor, scale: float) -> None:
    step = grad.float().reshape(accum.shape) * scale
    if accum.dtype == torch.float32:
        accum.add_(step)
    else:
        accum.copy_(accum.float() + step)


def accumulate_(accum: Tensor, grad: Tensor, scale: float) -> None:
    """``poptorch_sim::accumulate_``: ``accum += grad * scale`` (float32 arithmetic)."""
    _check_pair(accum, grad, "")
    _accumulate_into(accum, grad, scale)


def accumulate_many_(accums: list[Tensor], grads: list[Tensor], scale: float) -> None:
    """``poptorch_sim::accumulate_many_``: :func:`accumulate_` over paired lists."""
    if len(accums) != len(grads):
        raise RuntimeError(
            f"accumulate_many_: accums and grads must have the same length, got {len(accums)} "
            f"and {len(grads)}"
        )
    for i, (a, g) in enumerate(zip(accums, grads)):
        _check_pair(a, g, f"[{i}]")
    for a, g in zip(accums, grads):
        _accumulate_into(a, g, scale)


def _check_micro_batches(mbs: list[Tensor], replicas: int) -> None:
    if not mbs:
        raise RuntimeError("stream_sum: needs at least one micro-batch output")
    if replicas < 1:
        raise RuntimeError(f"stream_sum: replicas must be >= 1, got {replicas}")
    if len(mbs) % replicas != 0:
        raise RuntimeError(
            f"stream_sum: {len(mbs)} micro-batch outputs is not a multiple of replicas={replicas}"
        )
    first = mbs[0]
    for i, t in enumerate(mbs[1:], start=1):
        for what, mine, theirs in (("shape", list(t.shape), list(first.shape)),
                                   ("dtype", t.dtype, first.dtype),
                                   ("device", t.device, first.device)):  # fmt: skip
            if mine != theirs:
                raise RuntimeError(
                    f"stream_sum: micro_batches[{i}] has {what} {mine} but micro_batches[0] "
                    f"has {theirs}"
                )
    if first.dtype not in _SUMMABLE:
        raise RuntimeError(f'"stream_sum" not implemented for {first.dtype}')


def stream_sum(micro_batches: list[Tensor], replicas: int) -> Tensor:
    """``poptorch_sim::stream_sum``: ``[replicas, *S]``, replica r the sum of every R-th output.

    The sum runs over device iterations and accumulation steps in arrival order, as the C++
    kernel does, so the result is the same bit for bit.
    """
    _check_micro_batches(micro_batches, replicas)
    first = micro_batches[0]
    reduced = first.dtype in (torch.float16, torch.bfloat16)
    acc_dtype = torch.float32 if reduced else first.dtype
    acc = torch.zeros((replicas, *first.shape), dtype=acc_dtype, device=first.device)
    for i, t in enumerate(micro_batches):
        acc[i % replicas].add_(t.to(acc_dtype))
    return acc.to(first.dtype)
