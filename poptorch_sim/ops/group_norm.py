"""``groupNormStridedChannelGrouping``: group norms whose groups take every G-th channel.

PopART's option (``opts._Popart.set("groupNormStridedChannelGrouping", True)``) makes the IPU's
group norm put channel ``c`` in group ``c % G`` instead of PyTorch's ``c // (C / G)``: faster on
an IPU, and numerically a different normalisation. The device copy of each ``nn.GroupNorm``
does the same: the channels are reordered so that strided groups are contiguous, normalised by
PyTorch's own group norm, and put back before the affine weight and bias.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["stride_group_norms", "strided_group_norm"]


def strided_group_norm(
    x: torch.Tensor,
    groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Group norm of ``x`` (N, C, ...) with channel ``c`` in group ``c % groups``."""
    channels = x.shape[1]
    per_group = channels // groups
    order = torch.arange(channels, device=x.device).view(per_group, groups).t().reshape(-1)
    y = nn.functional.group_norm(x[:, order], groups, None, None, eps)
    y = y[:, torch.argsort(order)]
    shape = [1, channels] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y


class _Strided(nn.GroupNorm):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return strided_group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


def stride_group_norms(model: nn.Module) -> list[str]:
    """Make each ``nn.GroupNorm`` of ``model`` (exactly that class) group channels with a
    stride; return their names."""
    names = []
    for name, module in model.named_modules():
        if type(module) is nn.GroupNorm:
            module.__class__ = _Strided
            names.append(name)
    return names
