"""PopTorch's float16 rule for layers with weights: the weights follow the activation's dtype.

[Note: weights follow the activation]
PopTorch lets a model keep float32 weights and feed float16 activations: "the parameters will be
converted to float16 if you call an operation with a float16 input" (user guide, 16-bit float
support), so the layer computes and returns float16 while the optimizer updates float32 master
weights; with float16 weights and a float32 activation the layer computes in float32. Eager
PyTorch refuses both mixes ("mat1 and mat2 must have the same dtype"). The device copy's
``nn.Linear`` and ``nn.Conv1d/2d/3d`` therefore get a subclass whose ``forward`` casts weight and
bias to the activation's dtype when the two are float16 and float32; the casts are
differentiable, so gradients reach the weights in their own dtype. Layers whose ``forward`` a user
class overrides, and functional calls (``torch.matmul(self.w, x)``), are left as PyTorch has them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["weights_follow_activations"]

_MIXABLE = (torch.float16, torch.float32)


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return t if t is None else t.to(dtype)


def _mixed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dtype != weight.dtype and x.dtype in _MIXABLE and weight.dtype in _MIXABLE


class _Linear(nn.Linear):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if _mixed(input, self.weight):
            return F.linear(input, self.weight.to(input.dtype), _cast(self.bias, input.dtype))
        return super().forward(input)


def _conv_forward(self: nn.Conv1d, input: torch.Tensor) -> torch.Tensor:
    if _mixed(input, self.weight):
        weight, bias = self.weight.to(input.dtype), _cast(self.bias, input.dtype)
        return self._conv_forward(input, weight, bias)
    return self._conv_forward(input, self.weight, self.bias)


_FOLLOWING: dict[type, type] = {nn.Linear: _Linear}
for _conv in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
    _FOLLOWING[_conv] = type(_conv.__name__, (_conv,), {"forward": _conv_forward})
for _cls, _sub in _FOLLOWING.items():
    # Still reported, printed and treated as a leaf by torch.fx as the torch.nn class it is.
    _sub.__name__, _sub.__qualname__, _sub.__module__ = (
        _cls.__name__,
        _cls.__qualname__,
        _cls.__module__,
    )


def weights_follow_activations(model: nn.Module) -> int:
    """Give the device copy's plain Linear and Conv layers PopTorch's float16 rule.

    See [Note: weights follow the activation].

    Returns:
        How many layers were given it.
    """
    count = 0
    for module in model.modules():
        sub = _FOLLOWING.get(type(module))
        if sub is not None:
            module.__class__ = sub
            count += 1
    return count
