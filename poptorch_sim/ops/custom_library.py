"""PopTorch's own custom ops (domain ``poptorch.custom_ops``), registered for ``custom_op``.

PopTorch builds these PopART ops into its own library, so a program reaches them with
``poptorch.custom_op([...], "FastGatherLastDim", "poptorch.custom_ops", 1, example_outputs=...)``
without loading a library of its own. Here each is a registered Python implementation (see
[Note: custom ops in the simulator] in custom.py), with the shape checks of its PopART ``setup``.
"""

from __future__ import annotations

import torch

from ..errors import Error
from .custom import register_custom_op

__all__ = ["DOMAIN", "fast_gather_last_dim"]

DOMAIN = "poptorch.custom_ops"


def fast_gather_last_dim(data: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``FastGatherLastDim``: ``torch.gather(data, -1, index)``, differentiable in ``data``.

    Args:
        data: the values (float or half).
        index: positions in ``data``'s last dimension (int32 or int16 on an IPU); the same
            shape as ``data`` but for the last dimension.

    Returns:
        ``out[..., i] = data[..., index[..., i]]``, of ``index``'s shape and ``data``'s dtype.

    Raises:
        poptorch.Error: the ranks differ, or a dimension other than the last does (PopART's
            ``FastGatherLastDimOp::setup`` messages).

    >>> fast_gather_last_dim(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[2, 0]]))
    tensor([[3., 1.]])
    """
    if data.dim() != index.dim():
        raise Error(
            "FastGatherLastDimOp::setup(), Input and Index tensors do not have same rank in Op "
            f"fast_gather_last_dim: input {tuple(data.shape)}, index {tuple(index.shape)}",
            type="popart_exception",
        )
    if data.shape[:-1] != index.shape[:-1]:
        raise Error(
            "FastGatherLastDimOp::setup(), Index tensor must have same dimensions as Input "
            f"except for last dim. Op fast_gather_last_dim: input {tuple(data.shape)}, index "
            f"{tuple(index.shape)}",
            type="popart_exception",
        )
    return torch.gather(data, -1, index.long())


register_custom_op("FastGatherLastDim", DOMAIN, fast_gather_last_dim)
