"""``poptorch.optim.LAMB``: layer-wise adaptive moments, with a working CPU ``step()``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from .base import Optimizer, check_accum_types, explicit_args
from .variants import per_parameter_step

__all__ = ["LAMB"]

_ACCUM_ATTRS = (
    "accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
)


class LAMB(Optimizer, torch.optim.Optimizer):
    """Layer-wise Adaptive Moments (LAMB), PopTorch's ``poptorch.optim.LAMB``.

    From "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
    (arXiv:1904.00962), with the scaling function fixed as ``phi(z) = min(z, max_weight_norm)``.
    For each parameter ``w`` with gradient ``g`` at step ``t``::

        m = beta1 * m + (1 - beta1) * g          v = beta2 * v + (1 - beta2) * g * g
        r = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + weight_decay * w
        trust = min(||w||, max_weight_norm) / ||r||   (1 if either norm is 0)
        w = w - lr * trust * r

    with ``bc1 = 1 - beta1**t``, ``bc2 = 1 - beta2**t`` (both 1 when ``bias_correction`` is
    False). ``max_weight_norm`` is read from each parameter group.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default ``(0.9, 0.999)``).
        eps: denominator term (default 1e-8).
        weight_decay: decoupled weight decay (default 1e-2).
        bias_correction: apply Adam's bias correction to the moments (default True).
        loss_scaling: loss multiplier undone on the gradients before the update (default 1.0).
        max_weight_norm: upper bound of the weight norm in the trust ratio (default 65500.0,
            float16's largest value; None means the default).
        accum_type: dtype of the gradient accumulators (torch.float32 or torch.float16).
        first_order_momentum_accum_type: dtype of the first moment.
        second_order_momentum_accum_type: dtype of the second moment.

    Raises:
        AssertionError: an accumulation type other than torch.float32 / torch.float16.

    >>> opt = LAMB(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    _child_only: ClassVar[list[str]] = ["loss_scaling", "bias_correction", *_ACCUM_ATTRS]
    _group_vars: ClassVar[list[str]] = ["lr", "weight_decay", "betas", "eps", "max_weight_norm"]
    _saved_attrs: ClassVar[tuple[str, ...]] = (
        "loss_scaling",
        "bias_correction",
        "max_weight_norm",
        *_ACCUM_ATTRS,
    )
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.Optimizer

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        bias_correction: bool | None = None,
        loss_scaling: float | None = None,
        max_weight_norm: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
    ) -> None:
        explicit = explicit_args(locals())
        self.max_weight_norm = 65500.0 if max_weight_norm is None else max_weight_norm
        defaults = {
            "lr": 1e-3 if lr is None else lr,
            "betas": (0.9, 0.999) if betas is None else betas,
            "eps": 1e-8 if eps is None else eps,
            "weight_decay": 1e-2 if weight_decay is None else weight_decay,
            "max_weight_norm": self.max_weight_norm,
        }
        Optimizer.__init__(self)
        torch.optim.Optimizer.__init__(self, params, defaults)
        types = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)
        resolved = [torch.float32 if t is None else t for t in types]
        check_accum_types(*resolved)
        for name, dtype in zip(_ACCUM_ATTRS, resolved):
            setattr(self, name, dtype)
        self.bias_correction = True if bias_correction is None else bias_correction
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self._track_variables(explicit)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Update every parameter that has a gradient; return ``closure()``'s loss if given.

        >>> loss = model(x).sum(); loss.backward(); opt.step()
        """
        return per_parameter_step(self, closure, self._update)

    def _update(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        bc1, bc2 = 1.0, 1.0
        if self.bias_correction:
            bc1, bc2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]

        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(bc2)).add_(group["eps"])
        update = (exp_avg / bc1) / denom + group["weight_decay"] * p

        weight_norm = p.pow(2).sum().sqrt().clamp(max=group["max_weight_norm"])
        update_norm = update.pow(2).sum().sqrt()
        # Tensor arithmetic, not .item(): no device synchronisation per parameter.
        degenerate = (weight_norm == 0) | (update_norm == 0)
        trust = torch.where(degenerate, torch.ones_like(weight_norm), weight_norm / update_norm)
        p.add_(update * (trust * -group["lr"]))
