"""Device-side algorithms torch lacks: AdamW without bias correction and TensorFlow's RMSprop."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["AdamWNoBias", "RMSpropTF", "adamw_no_bias_update", "per_parameter_step"]

Update = Callable[[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]], None]


@torch.no_grad()
def per_parameter_step(
    optimizer: torch.optim.Optimizer, closure: Callable[[], float] | None, update: Update
) -> float | None:
    """``optimizer.step()`` for algorithms written per parameter.

    Calls ``update(p, p.grad, state, group)`` for each parameter that has a gradient and
    returns ``closure()``'s loss when a closure is given.
    """
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                update(p, p.grad, optimizer.state[p], group)
    return loss


class _PerParameter(torch.optim.Optimizer):
    """A plain optimizer whose ``step()`` updates each parameter that has a gradient."""

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return per_parameter_step(self, closure, self._update)

    def _update(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        raise NotImplementedError


class AdamWNoBias(_PerParameter):
    """AdamW whose moments are used without bias correction (PopTorch's ADAMW_NO_BIAS).

    ``w = w - lr * (m / (sqrt(v) + eps) + weight_decay * w)``, with ``m`` and ``v`` torch's
    AdamW moments.

    Args:
        params: parameters or parameter groups.
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.

    >>> opt = AdamWNoBias(model.parameters(), lr=1e-3)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _update(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        adamw_no_bias_update(p, grad, state, group)


def adamw_no_bias_update(
    p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
) -> None:
    """One AdamW update of ``p`` in place, its moments used without bias correction.

    ``state`` holds torch's AdamW keys (``step``, ``exp_avg``, ``exp_avg_sq``; created when
    empty); ``group`` gives ``lr``, ``betas``, ``eps``, ``weight_decay`` and optionally
    ``maximize``.
    """
    if not state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if group.get("maximize", False):
        grad = -grad
    state["step"] += 1
    beta1, beta2 = group["betas"]
    p.mul_(1 - group["lr"] * group["weight_decay"])
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = state["exp_avg_sq"].sqrt().add_(group["eps"])
    p.addcdiv_(state["exp_avg"], denom, value=-group["lr"])


class RMSpropTF(_PerParameter):
    """TensorFlow's RMSprop (PopTorch's ``use_tf_variant=True``).

    It differs from torch's in three ways: the mean-square buffer starts at ones, ``eps`` is
    added inside the square root, and with momentum the learning rate is folded into the
    momentum buffer (``buf = momentum * buf + lr * g / denom; w -= buf``).

    Args:
        params: parameters or parameter groups.
        lr, alpha, eps, weight_decay, momentum, centered: as in ``torch.optim.RMSprop``.

    >>> opt = RMSpropTF(model.parameters(), lr=1e-2, momentum=0.9)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": centered,
        }
        super().__init__(params, defaults)

    def _update(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        if not state:
            state["step"] = 0
            state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        alpha = group["alpha"]
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        state["square_avg"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            state["grad_avg"].lerp_(grad, 1 - alpha)
            variance = state["square_avg"].addcmul(state["grad_avg"], state["grad_avg"], value=-1)
            denom = variance.add_(group["eps"]).sqrt_()
        else:
            denom = state["square_avg"].add(group["eps"]).sqrt_()
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, denom, value=group["lr"])
            p.sub_(buf)
        else:
            p.addcdiv_(grad, denom, value=-group["lr"])
