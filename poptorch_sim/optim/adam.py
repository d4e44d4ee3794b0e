"""``poptorch.optim.Adam`` and ``poptorch.optim.AdamW``: torch's Adam family plus loss scaling."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from .base import Optimizer, check_accum_types, explicit_args, init_torch_parent
from .variants import adamw_no_bias_update, per_parameter_step

__all__ = ["Adam", "AdamW"]

_ACCUM_ATTRS = [
    "accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
]


def _set_adam_extras(
    optimizer: Optimizer,
    loss_scaling: float | None,
    accum_types: tuple[torch.dtype | None, ...],
    max_grad_norm: float | None,
) -> None:
    """Store the global PopTorch-only attributes shared by Adam and AdamW, with defaults."""
    optimizer.loss_scaling = 1.0 if loss_scaling is None else loss_scaling  # type: ignore[attr-defined]
    resolved = [torch.float32 if t is None else t for t in accum_types]
    check_accum_types(*resolved)
    for name, dtype in zip(_ACCUM_ATTRS, resolved):
        setattr(optimizer, name, dtype)
    optimizer.max_grad_norm = float("inf") if max_grad_norm is None else max_grad_norm  # type: ignore[attr-defined]


class Adam(Optimizer, torch.optim.Adam):
    """Adam with optional loss scaling (PopTorch's ``poptorch.optim.Adam``).

    Numerically the same as ``torch.optim.Adam`` (L2 weight decay added to the gradient).
    AMSGrad is not supported: a model wrapped with ``amsgrad=True`` raises ValueError.

    Simulated: the accumulation dtypes are recorded but do not change the numbers.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default ``(0.9, 0.999)``).
        eps: denominator term (default 1e-8).
        weight_decay: L2 penalty (default 0).
        amsgrad: must be False on the IPU.
        foreach, maximize, capturable, differentiable, fused: passed to ``torch.optim.Adam``.
        loss_scaling: loss multiplier undone on the gradients before the update (default 1.0).
        accum_type: dtype of the gradient accumulators (torch.float32 or torch.float16).
        first_order_momentum_accum_type: dtype of the first moment.
        second_order_momentum_accum_type: dtype of the second moment.
        max_grad_norm: clip gradients to this global norm before the update (default inf).

    Raises:
        AssertionError: an accumulation type other than torch.float32 / torch.float16.

    >>> opt = Adam(model.parameters(), lr=1e-3, loss_scaling=1024.0)
    """

    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    _child_only: ClassVar[list[str]] = ["loss_scaling", *_ACCUM_ATTRS, "max_grad_norm"]
    _group_vars: ClassVar[list[str]] = ["lr", "betas", "eps", "weight_decay", "amsgrad"]
    _saved_attrs: ClassVar[tuple[str, ...]] = ("loss_scaling", *_ACCUM_ATTRS, "max_grad_norm")
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.Adam

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        foreach: bool | None = None,
        maximize: bool | None = None,
        capturable: bool | None = None,
        differentiable: bool | None = None,
        fused: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        explicit = explicit_args(locals())
        parent_args = {k: v for k, v in explicit.items() if k not in Adam._child_only}
        Optimizer.__init__(self)
        init_torch_parent(torch.optim.Adam, self, params, parent_args)
        accum = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)
        _set_adam_extras(self, loss_scaling, accum, max_grad_norm)
        self._track_variables(explicit)


class AdamW(Optimizer, torch.optim.AdamW):
    """Adam with decoupled weight decay (PopTorch's ``poptorch.optim.AdamW``).

    Numerically the same as ``torch.optim.AdamW`` when ``bias_correction=True`` (the default);
    with ``bias_correction=False`` the moments are used without bias correction. torch's
    default ``weight_decay`` of 1e-2 is the value that counts as "constant".

    Simulated: ``step()`` on the host honours ``bias_correction=False`` too, so a model
    trained on the CPU with this optimizer follows the same numbers as the IPU; PopTorch's
    host ``step()`` is torch's and always corrects the bias.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default ``(0.9, 0.999)``).
        eps: denominator term (default 1e-8).
        weight_decay: decoupled weight decay (default 1e-2).
        amsgrad: must be False on the IPU.
        maximize, foreach, capturable, differentiable, fused: passed to ``torch.optim.AdamW``.
        loss_scaling: loss multiplier undone on the gradients before the update (default 1.0).
        bias_correction: apply Adam's bias correction (default True).
        accum_type: dtype of the gradient accumulators (torch.float32 or torch.float16).
        first_order_momentum_accum_type: dtype of the first moment.
        second_order_momentum_accum_type: dtype of the second moment.
        max_grad_norm: clip gradients to this global norm before the update (default inf).

    Raises:
        AssertionError: an accumulation type other than torch.float32 / torch.float16.

    >>> opt = AdamW(model.parameters(), lr=1e-3, accum_type=torch.float16, loss_scaling=1024)
    """

    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    _child_only: ClassVar[list[str]] = [
        "loss_scaling",
        "bias_correction",
        *_ACCUM_ATTRS,
        "max_grad_norm",
    ]
    _group_vars: ClassVar[list[str]] = ["lr", "betas", "weight_decay", "eps", "amsgrad"]
    _saved_attrs: ClassVar[tuple[str, ...]] = (
        "loss_scaling",
        "bias_correction",
        *_ACCUM_ATTRS,
        "max_grad_norm",
    )
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.AdamW

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        maximize: bool | None = None,
        foreach: bool | None = None,
        capturable: bool | None = None,
        differentiable: bool | None = None,
        fused: bool | None = None,
        loss_scaling: float | None = None,
        bias_correction: bool | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        explicit = explicit_args(locals())
        parent_args = {k: v for k, v in explicit.items() if k not in AdamW._child_only}
        Optimizer.__init__(self)
        init_torch_parent(torch.optim.AdamW, self, params, parent_args)
        self.bias_correction = True if bias_correction is None else bias_correction
        accum = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)
        _set_adam_extras(self, loss_scaling, accum, max_grad_norm)
        self._track_variables(explicit)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One host update: torch's AdamW, or without bias correction when it is disabled."""
        if self.bias_correction:
            return torch.optim.AdamW.step(self, closure)
        return per_parameter_step(self, closure, adamw_no_bias_update)
