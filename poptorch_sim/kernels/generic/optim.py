"""Generic fused optimizer steps (SGD, Adam/AdamW, RMSprop, LAMB) and ``grad_norm``.

Each step follows its C++ kernel (``csrc/optim/optimizer.cpp``) operation for operation: operands
are widened to float32, the gradient is divided by the loss scaling, multiplied by the clip
coefficient and negated when maximising, then the element formula runs in the kernel's order
with the same float32 constants (computed in double, rounded once, as the C++ code does), and
param and states are rounded once back into their storage dtypes. Where the C++ code calls
``fmaf`` (``add(self, other, alpha)``, ``lerp``) the generic code calls ``torch.add(..., alpha=)``
and ``torch.lerp``, which fuse the same multiply-add on CPU and CUDA; divisions by a constant
divide by a 0-d tensor on the device (CUDA would otherwise multiply by the reciprocal). Results
therefore agree with the CPU kernel to float32 rounding (most elements bit for bit). Off-chip
state streams through :func:`.offload.chunks`; see [Note: generic off-chip streaming].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_buffer, check_common, check_lists, check_steps
from .offload import Chunk, chunks

__all__ = ["adam_step_", "grad_norm", "lamb_step_", "rmsprop_step_", "sgd_step_"]


class GradPrep(NamedTuple):
    """How the update sees the gradient: unscaled, clipped, negated when maximising."""

    loss_scaling: float
    clip_coef: float
    maximize: bool


def _const(value: float, like: Tensor) -> Tensor:
    """A float32 0-d tensor on ``like``'s device: a divisor CUDA divides by exactly."""
    return torch.full((), value, dtype=torch.float32, device=like.device)


def _prep(grad: Tensor, gp: GradPrep) -> Tensor:
    g = grad.float() / _const(gp.loss_scaling, grad)
    if gp.clip_coef != 1.0:
        g = g * gp.clip_coef
    return g.neg() if gp.maximize else g


def _sqrt(x: Tensor) -> Tensor:
    """Correctly rounded float32 square root, as the C++ kernels' SSE/AVX ``sqrt``.

    CUDA's float32 ``sqrt`` is IEEE-rounded; torch's CPU one is not always (vectorised
    approximations), so on the CPU it is taken in double, which rounds to the same float.
    """
    return x.double().sqrt().float() if x.device.type == "cpu" else x.sqrt()


def _store(dst: Tensor, value: Tensor) -> None:
    if value is not dst:
        dst.copy_(value)


def _per_param(params: Sequence[Tensor], *lists: Sequence[Tensor]) -> list[list[Tensor]]:
    """The state tensors of each param, taken from one list per state kind."""
    return [[lst[i] for lst in lists] for i in range(len(params))]


# ---------------------------------------------------------------------------- SGD


class _Sgd(NamedTuple):
    gp: GradPrep
    neg_lr: float
    momentum: float
    one_minus_dampening: float
    weight_decay: float
    nesterov: bool
    first_step: bool


def _sgd_chunk(c: Chunk, h: _Sgd) -> None:
    p = c.param.float()
    g = _prep(c.grad, h.gp)
    if h.weight_decay != 0.0:
        g = torch.add(g, p, alpha=h.weight_decay)
    if c.states:
        buf = c.states[0]
        b = g if h.first_step else torch.add(buf.float() * h.momentum, g,
                                             alpha=h.one_minus_dampening)  # fmt: skip
        _store(buf, b)
        g = torch.add(g, b, alpha=h.momentum) if h.nesterov else b
    _store(c.param, torch.add(p, g, alpha=h.neg_lr))


def sgd_step_(params: list[Tensor], grads: list[Tensor], momentum_buffers: list[Tensor], *,
              lr: float, momentum: float, dampening: float, weight_decay: float,
              nesterov: bool, maximize: bool, first_step: bool, loss_scaling: float,
              clip_coef: float, chunk_elements: int) -> None:  # fmt: skip
    """``poptorch_sim::sgd_step_`` in torch ops (see the module docstring)."""
    check_common(loss_scaling, clip_coef, chunk_elements)
    has_momentum = momentum != 0.0
    if not has_momentum and momentum_buffers:
        raise RuntimeError(
            f"momentum_buffers must be empty when momentum is 0, got {len(momentum_buffers)}"
        )
    if nesterov and not (has_momentum and dampening == 0.0):
        raise RuntimeError(
            f"Nesterov momentum requires a momentum and zero dampening, got "
            f"momentum={momentum} dampening={dampening}"
        )
    states = {"momentum_buffers": momentum_buffers} if has_momentum else {}
    check_lists(params, grads, states)
    h = _Sgd(GradPrep(loss_scaling, clip_coef, maximize), -lr, momentum, 1.0 - dampening,
             weight_decay, nesterov, first_step)  # fmt: skip
    for p, g, st in zip(params, grads, _per_param(params, *states.values())):
        for c in chunks(p, g, st, chunk_elements, True):
            _sgd_chunk(c, h)


# ---------------------------------------------------------------------------- Adam / AdamW


class _Adam(NamedTuple):
    gp: GradPrep
    weight_decay: float
    decay_factor: float
    lerp_w: float
    beta2: float
    one_minus_beta2: float
    bc2_sqrt: float
    eps: float
    neg_step: float
    decoupled: bool


def _adam_chunk(c: Chunk, h: _Adam) -> None:
    p = c.param.float()
    g = _prep(c.grad, h.gp)
    if h.weight_decay != 0.0:
        if h.decoupled:
            p = p * h.decay_factor
        else:
            g = torch.add(g, p, alpha=h.weight_decay)
    m = torch.lerp(c.states[0].float(), g, h.lerp_w)
    s = c.states[1].float() * h.beta2 + (g * h.one_minus_beta2) * g
    denom = _sqrt(s) / _const(h.bc2_sqrt, s) + h.eps
    p = p + (m / denom) * h.neg_step
    _store(c.states[0], m)
    _store(c.states[1], s)
    _store(c.param, p)


def adam_step_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], steps: list[float], *, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, decoupled_weight_decay: bool,
               bias_correction: bool, maximize: bool, loss_scaling: float, clip_coef: float,
               chunk_elements: int) -> None:  # fmt: skip
    """``poptorch_sim::adam_step_`` in torch ops (see the module docstring)."""
    check_common(loss_scaling, clip_coef, chunk_elements)
    check_lists(params, grads, {"exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs})
    check_steps(steps, len(params))
    gp = GradPrep(loss_scaling, clip_coef, maximize)
    for i, (p, g) in enumerate(zip(params, grads)):
        bc1 = 1.0 - math.pow(beta1, steps[i]) if bias_correction else 1.0
        bc2 = 1.0 - math.pow(beta2, steps[i]) if bias_correction else 1.0
        h = _Adam(gp, weight_decay, 1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2,
                  math.sqrt(bc2), eps, -(lr / bc1), decoupled_weight_decay)  # fmt: skip
        for c in chunks(p, g, [exp_avgs[i], exp_avg_sqs[i]], chunk_elements, True):
            _adam_chunk(c, h)


# ---------------------------------------------------------------------------- RMSprop


class _Rmsprop(NamedTuple):
    gp: GradPrep
    neg_lr: float
    alpha: float
    one_minus_alpha: float
    eps: float
    weight_decay: float
    momentum: float
    has_momentum: bool
    centered: bool
    tf_variant: bool


def _rmsprop_chunk(c: Chunk, h: _Rmsprop) -> None:
    p = c.param.float()
    g = _prep(c.grad, h.gp)
    if h.weight_decay != 0.0:
        g = torch.add(g, p, alpha=h.weight_decay)
    sq = c.states[0].float() * h.alpha + (g * h.one_minus_alpha) * g
    _store(c.states[0], sq)
    var = sq
    if h.centered:
        ga = torch.lerp(c.states[-1].float(), g, h.one_minus_alpha)
        _store(c.states[-1], ga)
        var = sq - ga * ga
    avg = _sqrt(var + h.eps) if h.tf_variant else _sqrt(var) + h.eps
    if h.has_momentum:
        b = c.states[1].float() * h.momentum + g / avg
        _store(c.states[1], b)
        p = torch.add(p, b, alpha=h.neg_lr)
    else:
        p = p + (g / avg) * h.neg_lr
    _store(c.param, p)


def rmsprop_step_(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor],
                  momentum_buffers: list[Tensor], grad_avgs: list[Tensor], *, lr: float,
                  alpha: float, eps: float, weight_decay: float, momentum: float,
                  centered: bool, maximize: bool, use_tf_variant: bool, loss_scaling: float,
                  clip_coef: float, chunk_elements: int) -> None:  # fmt: skip
    """``poptorch_sim::rmsprop_step_`` in torch ops (see the module docstring)."""
    check_common(loss_scaling, clip_coef, chunk_elements)
    has_momentum = momentum > 0.0
    if not has_momentum and momentum_buffers:
        raise RuntimeError(
            f"momentum_buffers must be empty when momentum is 0, got {len(momentum_buffers)}"
        )
    if not centered and grad_avgs:
        raise RuntimeError(f"grad_avgs must be empty when centered=False, got {len(grad_avgs)}")
    states: dict[str, Sequence[Tensor]] = {"square_avgs": square_avgs}
    if has_momentum:
        states["momentum_buffers"] = momentum_buffers
    if centered:
        states["grad_avgs"] = grad_avgs
    check_lists(params, grads, states)
    h = _Rmsprop(GradPrep(loss_scaling, clip_coef, maximize), -lr, alpha, 1.0 - alpha, eps,
                 weight_decay, momentum, has_momentum, centered, use_tf_variant)  # fmt: skip
    for p, g, st in zip(params, grads, _per_param(params, *states.values())):
        for c in chunks(p, g, st, chunk_elements, True):
            _rmsprop_chunk(c, h)


# ---------------------------------------------------------------------------- LAMB


class _Lamb(NamedTuple):
    gp: GradPrep
    beta1: float
    one_minus_beta1: float
    beta2: float
    one_minus_beta2: float
    bc1: float
    bc2_sqrt: float
    eps: float
    weight_decay: float


def _as_stored(x: Tensor, like: Tensor) -> Tensor:
    """``x`` rounded to ``like``'s storage dtype and widened back (pass 2 reads it so)."""
    return x if like.dtype == torch.float32 else x.to(like.dtype).float()


def _lamb_r(p: Tensor, m: Tensor, s: Tensor, h: _Lamb) -> Tensor:
    denom = _sqrt(s) / _const(h.bc2_sqrt, s) + h.eps
    return (m / _const(h.bc1, m)) / denom + p * h.weight_decay


def _lamb_moments(c: Chunk, h: _Lamb) -> tuple[Tensor, Tensor]:
    """Pass 1 on a chunk: updates m and v; returns the chunk's (||w||^2, ||r||^2) in double."""
    p = c.param.float()
    g = _prep(c.grad, h.gp)
    m = _as_stored(torch.add(c.states[0].float() * h.beta1, g, alpha=h.one_minus_beta1),
                   c.states[0])  # fmt: skip
    s = _as_stored(c.states[1].float() * h.beta2 + (g * h.one_minus_beta2) * g, c.states[1])
    _store(c.states[0], m)
    _store(c.states[1], s)
    r = _lamb_r(p, m, s, h)
    return p.double().square().sum(), r.double().square().sum()


def _trust_alpha(w_sq: float, r_sq: float, lr: float, max_weight_norm: float) -> float:
    """``-lr * min(||w||, max_weight_norm) / ||r||`` in the C++ kernel's float32 arithmetic."""
    f32 = torch.float32
    w_norm = torch.minimum(torch.tensor(math.sqrt(w_sq), dtype=f32),
                           torch.tensor(max_weight_norm, dtype=f32))  # fmt: skip
    r_norm = torch.tensor(math.sqrt(r_sq), dtype=f32)
    neg_lr = torch.tensor(-lr, dtype=f32)
    if float(w_norm) == 0.0 or float(r_norm) == 0.0:
        return float(neg_lr)
    return float(neg_lr * (w_norm / r_norm))


def lamb_step_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], steps: list[float], *, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, max_weight_norm: float,
               bias_correction: bool, loss_scaling: float, clip_coef: float,
               chunk_elements: int) -> None:  # fmt: skip
    """``poptorch_sim::lamb_step_`` in torch ops: two passes per param, as the C++ kernel."""
    check_common(loss_scaling, clip_coef, chunk_elements)
    check_lists(params, grads, {"exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs})
    check_steps(steps, len(params))
    gp = GradPrep(loss_scaling, clip_coef, False)
    for i, (p, g) in enumerate(zip(params, grads)):
        bc1 = 1.0 - math.pow(beta1, steps[i]) if bias_correction else 1.0
        bc2 = 1.0 - math.pow(beta2, steps[i]) if bias_correction else 1.0
        h = _Lamb(gp, beta1, 1.0 - beta1, beta2, 1.0 - beta2, bc1, math.sqrt(bc2), eps,
                  weight_decay)  # fmt: skip
        states = [exp_avgs[i], exp_avg_sqs[i]]
        w_sq = r_sq = torch.zeros((), dtype=torch.float64, device=p.device)
        for c in chunks(p, g, states, chunk_elements, True):
            w_part, r_part = _lamb_moments(c, h)
            w_sq, r_sq = w_sq + w_part, r_sq + r_part
        alpha = _trust_alpha(float(w_sq), float(r_sq), lr, max_weight_norm)
        for c in chunks(p, g, states, chunk_elements, False):
            r = _lamb_r(c.param.float(), c.states[0].float(), c.states[1].float(), h)
            _store(c.param, torch.add(c.param.float(), r, alpha=alpha))


# ---------------------------------------------------------------------------- grad_norm


def grad_norm(grads: list[Tensor], loss_scaling: float) -> Tensor:
    """``poptorch_sim::grad_norm``: ``||grads / loss_scaling||`` (squares summed in double).

    Returns:
        A 0-d float32 tensor on the first gradient's device.
    """
    if not loss_scaling > 0.0:
        raise RuntimeError(f"loss_scaling must be > 0, got {loss_scaling}")
    for i, g in enumerate(grads):
        check_buffer(g, "grads", i, g, False)
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    device = grads[0].device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        unscaled = g.float() / _const(loss_scaling, g)
        total = total + unscaled.double().square().sum().to(device)
    return total.sqrt().float()


def increment_steps_(steps: list[Tensor]) -> list[float]:
    """``poptorch_sim::increment_steps_``: add one to each one-element step tensor, in place.

    Returns:
        The new steps, as floats.
    """
    out = []
    for i, t in enumerate(steps):
        if t.numel() != 1:
            raise RuntimeError(f"steps[{i}] must be a one-element tensor, got {tuple(t.shape)}")
        t.add_(1)
        out.append(float(t.item()))
    return out
