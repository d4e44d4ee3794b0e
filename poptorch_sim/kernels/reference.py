"""Pure-PyTorch references of the accumulation, optimizer and stream kernels (the test oracle)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "accumulate_ref",
    "adam_no_bias_correction_ref",
    "assemble_ref",
    "lamb_step_ref",
    "rmsprop_tf_ref",
    "unscale_and_clip_ref",
]


def accumulate_ref(accum: Tensor, grad: Tensor, scale: float) -> Tensor:
    """``accum += grad * scale`` computed in float32 and rounded once into ``accum``."""
    total = accum.float() + grad.float().reshape(accum.shape) * scale
    return accum.copy_(total)


def unscale_and_clip_ref(grads: list[Tensor], loss_scaling: float, max_norm: float) -> None:
    """What a PopTorch step does to gradients first: divide by the loss scale, then clip."""
    for g in grads:
        g.div_(loss_scaling)
    if not math.isinf(max_norm):
        params = [torch.nn.Parameter(torch.empty_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, max_norm)


@torch.no_grad()
def lamb_step_ref(
    params: list[Tensor],
    grads: list[Tensor],
    state: dict[int, dict[str, Tensor]],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    max_weight_norm: float,
    bias_correction: bool,
) -> None:
    """One step of PopTorch 3.4's LAMB (its CPU ``LAMB.step``), per parameter.

    ``m, v`` are Adam moments; ``r = m_hat / (sqrt(v_hat) + eps) + wd * w``; the trust ratio
    is ``min(||w||, max_weight_norm) / ||r||`` (1 when either norm is 0); ``w -= lr * trust * r``.
    """
    beta1, beta2 = betas
    for i, (p, g) in enumerate(zip(params, grads)):
        st = state.setdefault(i, {})
        if not st:
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
        st["step"] += 1
        step = float(st["step"])
        bc1 = 1 - beta1**step if bias_correction else 1.0
        bc2 = 1 - beta2**step if bias_correction else 1.0
        m, v = st["exp_avg"], st["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        r = (m / bc1) / denom + weight_decay * p
        w_norm = p.pow(2).sum().sqrt().clamp(max=max_weight_norm)
        r_norm = r.pow(2).sum().sqrt()
        trust = 1.0 if w_norm == 0 or r_norm == 0 else float(w_norm / r_norm)
        p.add_(r, alpha=-lr * trust)


@torch.no_grad()
def adam_no_bias_correction_ref(
    params: list[Tensor],
    grads: list[Tensor],
    state: dict[int, dict[str, Tensor]],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool,
) -> None:
    """Adam/AdamW without bias correction (PopTorch's ``AdamW(bias_correction=False)``)."""
    beta1, beta2 = betas
    for i, (p, g) in enumerate(zip(params, grads)):
        st = state.setdefault(i, {})
        if not st:
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
        if decoupled:
            p.mul_(1 - lr * weight_decay)
        else:
            g = g.add(p, alpha=weight_decay)
        st["exp_avg"].lerp_(g, 1 - beta1)
        st["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p.addcdiv_(st["exp_avg"], st["exp_avg_sq"].sqrt().add_(eps), value=-lr)


@torch.no_grad()
def rmsprop_tf_ref(
    params: list[Tensor],
    grads: list[Tensor],
    state: dict[int, dict[str, Tensor]],
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
) -> None:
    """RMSprop with the TensorFlow placement of eps: ``sqrt(mean_square + eps)``."""
    for i, (p, g) in enumerate(zip(params, grads)):
        st = state.setdefault(i, {})
        if not st:
            st["square_avg"] = torch.zeros_like(p)
            st["momentum_buffer"] = torch.zeros_like(p)
            st["grad_avg"] = torch.zeros_like(p)
        g = g.add(p, alpha=weight_decay) if weight_decay else g
        sq = st["square_avg"].mul_(alpha).addcmul_(g, g, value=1 - alpha)
        var = sq
        if centered:
            ga = st["grad_avg"].lerp_(g, 1 - alpha)
            var = sq.addcmul(ga, ga, value=-1)
        avg = (var + eps).sqrt()
        if momentum > 0:
            buf = st["momentum_buffer"].mul_(momentum).addcdiv_(g, avg)
            p.add_(buf, alpha=-lr)
        else:
            p.addcdiv_(g, avg, value=-lr)


def assemble_ref(
    outputs: list[Tensor], mode: str, period: int, di: int, ga: int, r: int
) -> Tensor:
    """Output of one call for an OutputMode, built with plain ``torch.cat``/``stack``.

    ``outputs`` are the per-micro-batch outputs in ``[DI, GA, R]`` order; ``mode`` is
    ``"all"``, ``"everyn"``, ``"final"`` or ``"sum"``.
    """
    grid = [[[outputs[(d * ga + a) * r + k] for k in range(r)] for a in range(ga)]
            for d in range(di)]  # fmt: skip
    if mode == "all":
        picked = outputs
    elif mode == "everyn":
        picked = [t for d in range(period - 1, di, period) for row in grid[d] for t in row]
    elif mode == "final":
        picked = grid[-1][-1]
    else:
        picked = [torch.stack([grid[d][a][k] for d in range(di) for a in range(ga)]).sum(0)
                  for k in range(r)]  # fmt: skip
    if len(picked) == 1:
        return picked[0]
    if outputs[0].dim() == 0:
        return torch.stack(picked)
    return torch.cat(picked)
