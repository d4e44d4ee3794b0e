"""``poptorch.optim.RMSprop``: torch's RMSprop plus loss scaling and a TensorFlow variant."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from .base import Optimizer, check_accum_types, explicit_args, init_torch_parent

__all__ = ["RMSprop"]

_ACCUM_ATTRS = (
    "accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
)


class RMSprop(Optimizer, torch.optim.RMSprop):
    """RMSprop with optional L2 penalty and loss scaling (PopTorch's ``poptorch.optim.RMSprop``).

    Numerically the same as ``torch.optim.RMSprop``, unless ``use_tf_variant=True`` selects
    TensorFlow's formulation: the mean-square buffer starts at ones, ``eps`` is added inside the
    square root, and with momentum the learning rate is folded into the momentum buffer.
    Every parameter group must use the same ``centered`` value.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (default 1e-2).
        alpha: smoothing constant (default 0.99).
        eps: denominator term (default 1e-8).
        weight_decay: L2 penalty (default 0).
        momentum: momentum factor (default 0).
        centered: normalise by an estimate of the gradient's variance (default False).
        foreach, maximize, differentiable: passed to ``torch.optim.RMSprop``.
        loss_scaling: loss multiplier undone on the gradients before the update (default 1.0).
        accum_type: dtype of the gradient accumulators (torch.float32 or torch.float16).
        first_order_momentum_accum_type: dtype of the first-order buffers.
        second_order_momentum_accum_type: dtype of the mean-square buffer.
        use_tf_variant: use TensorFlow's RMSprop (default False).

    Raises:
        AssertionError: an accumulation type other than torch.float32 / torch.float16.

    >>> opt = RMSprop(model.parameters(), lr=0.01, centered=True)
    """

    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    _child_only: ClassVar[list[str]] = ["loss_scaling", *_ACCUM_ATTRS, "use_tf_variant"]
    _group_vars: ClassVar[list[str]] = [
        "lr",
        "momentum",
        "weight_decay",
        "alpha",
        "eps",
        "centered",
    ]
    _saved_attrs: ClassVar[tuple[str, ...]] = ("loss_scaling", *_ACCUM_ATTRS, "use_tf_variant")
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.RMSprop

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        alpha: float | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        momentum: float | None = None,
        centered: bool | None = None,
        foreach: bool | None = None,
        maximize: bool | None = None,
        differentiable: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        use_tf_variant: bool | None = None,
    ) -> None:
        explicit = explicit_args(locals())
        parent_args = {k: v for k, v in explicit.items() if k not in RMSprop._child_only}
        Optimizer.__init__(self)
        init_torch_parent(torch.optim.RMSprop, self, params, parent_args)
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        types = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)
        resolved = [torch.float32 if t is None else t for t in types]
        check_accum_types(*resolved)
        for name, dtype in zip(_ACCUM_ATTRS, resolved):
            setattr(self, name, dtype)
        self.use_tf_variant = bool(use_tf_variant)
        self._track_variables(explicit)
