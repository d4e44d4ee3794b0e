"""Batch norms whose running statistics are float while their weights are half.

A model made half with ``model.half()`` and its running statistics set back to float (to keep
them precise) compiles with PopTorch: the IPU's batch norm takes its statistics in the input's
type and keeps them in their own. Eager PyTorch on a CPU refuses the mix ("expected scalar type
Half but found Float"), so the device copy of such a module normalises with its statistics
cast to the input's type, and in training writes the updated statistics back, in float.

Only modules with that mix are touched (their class on the device copy); every other
batch norm runs PyTorch's own code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["adapt_mixed_batch_norms"]


def _mixed(module: nn.Module) -> bool:
    if not isinstance(module, _BatchNorm) or module.running_mean is None:
        return False
    weight = module.weight
    stats = module.running_mean.dtype
    return weight is not None and weight.dtype != stats and stats == torch.float32


class _StatsInInputType:
    """Mixed into a batch norm's class on the device copy (survives the copies of replicas)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        mean, var = self.running_mean, self.running_var  # type: ignore[attr-defined]
        if input.dtype == mean.dtype:
            return super().forward(input)  # type: ignore[misc]
        self.running_mean = mean.to(input.dtype)
        self.running_var = var.to(input.dtype)
        try:
            out = super().forward(input)  # type: ignore[misc]
            if self.training:  # type: ignore[attr-defined]
                with torch.no_grad():
                    mean.copy_(self.running_mean)
                    var.copy_(self.running_var)
        finally:
            self.running_mean, self.running_var = mean, var
        return out


_classes: dict[type, type] = {}


def _with_stats_in_input_type(cls: type) -> type:
    if cls not in _classes:
        _classes[cls] = type(
            cls.__name__, (_StatsInInputType, cls), {"__module__": cls.__module__}
        )
    return _classes[cls]


def adapt_mixed_batch_norms(model: nn.Module) -> list[str]:
    """Let each batch norm of ``model`` with half weights and float statistics run (see the
    module docstring); return the names of those modules."""
    names = []
    for name, module in model.named_modules():
        if _mixed(module):
            module.__class__ = _with_stats_in_input_type(type(module))
            names.append(name)
    return names
