"""``poptorch.optim.SGD``: torch's SGD with loss/velocity scaling and accumulation types."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from ..logger import logger
from .base import Optimizer, check_accum_types, explicit_args, init_torch_parent

__all__ = ["SGD"]


class SGD(Optimizer, torch.optim.SGD):
    """Stochastic gradient descent with optional momentum (PopTorch's ``poptorch.optim.SGD``).

    Numerically the same as ``torch.optim.SGD``. On an IPU PopTorch offers two variants that
    differ only in numerical stability and memory: separate accumulator and velocity tensors
    (``use_combined_accum=False``, the default) or one combined tensor. Arguments left as
    ``None`` take torch's defaults and stay *constant* after compilation; arguments passed
    explicitly are *variable* (see ``variable_attrs``).

    Simulated: both variants run the same (torch) update; ``accum_type``,
    ``velocity_accum_type`` and ``velocity_scaling`` are recorded but do not change the numbers.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (required, as in PopTorch).
        momentum: momentum factor (default 0).
        dampening: dampening for momentum (default 0).
        weight_decay: L2 penalty (default 0).
        nesterov: Nesterov momentum (default False).
        maximize, foreach, differentiable: passed to ``torch.optim.SGD``.
        loss_scaling: the loss is multiplied by this before the backward pass and gradients
            divided by it before the update (default 1.0).
        velocity_scaling: velocity scale, used by the combined variant only (default 1.0).
        use_combined_accum: use the combined-tensor variant (default False).
        accum_type: dtype of the gradient accumulators (torch.float32 or torch.float16).
        velocity_accum_type: dtype of the velocity tensors (torch.float32 or torch.float16).
        max_grad_norm: clip gradients to this global norm before the update (default inf).

    Raises:
        AssertionError: an accumulation type other than torch.float32 / torch.float16.

    >>> opt = SGD(model.parameters(), lr=0.01, momentum=0.9, loss_scaling=128.0)
    """

    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    _child_only: ClassVar[list[str]] = [
        "loss_scaling",
        "velocity_scaling",
        "use_combined_accum",
        "accum_type",
        "velocity_accum_type",
        "max_grad_norm",
    ]
    _group_vars: ClassVar[list[str]] = [
        "lr",
        "momentum",
        "dampening",
        "weight_decay",
        "nesterov",
        "velocity_scaling",
    ]
    _saved_attrs: ClassVar[tuple[str, ...]] = (
        "loss_scaling",
        "use_combined_accum",
        "accum_type",
        "velocity_accum_type",
        "max_grad_norm",
    )
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.SGD

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float | None = None,
        dampening: float | None = None,
        weight_decay: float | None = None,
        nesterov: bool | None = None,
        maximize: bool | None = None,
        foreach: bool | None = None,
        differentiable: bool | None = None,
        loss_scaling: float | None = None,
        velocity_scaling: float | None = None,
        use_combined_accum: bool | None = None,
        accum_type: torch.dtype | None = None,
        velocity_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        explicit = explicit_args(locals())
        parent_args = {k: v for k, v in explicit.items() if k not in SGD._child_only}
        Optimizer.__init__(self)
        init_torch_parent(torch.optim.SGD, self, params, parent_args)

        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.use_combined_accum = bool(use_combined_accum)
        self.accum_type = torch.float32 if accum_type is None else accum_type
        self.velocity_accum_type = (
            torch.float32 if velocity_accum_type is None else velocity_accum_type
        )
        check_accum_types(self.accum_type, self.velocity_accum_type)
        self.max_grad_norm = float("inf") if max_grad_norm is None else max_grad_norm
        self._register_velocity_scaling(velocity_scaling)
        self._track_variables(explicit)

    def _register_velocity_scaling(self, velocity_scaling: float | None) -> None:
        """Velocity scaling is per group, and exists only in the combined variant."""
        if velocity_scaling is not None and not self.use_combined_accum:
            logger.warning(
                "velocity_scaling value ignored when using the separate variant "
                "(use_combined_accum=False). In future, this will lead to an error. "
                "Please update your code."
            )
        if self.use_combined_accum:
            value = 1.0 if velocity_scaling is None else velocity_scaling
            self.defaults["velocity_scaling"] = value
            for group in self.param_groups:
                group.setdefault("velocity_scaling", value)
