"""``CPU``: a host call-back in the middle of an (inference) IPU graph.

On an IPU the op streams its inputs to the host, calls the Python function there and streams the
results back. In the simulator everything already runs on the host, so the call is direct; the
wrapper keeps PopTorch's surface (``ID``, ``in_shapes``/``out_shapes``, a single tensor returned
as such, several as a list).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CPU"]


class CPU:
    """Run ``layer_to_call`` on the host when the model calls this object.

    A module passed as ``layer_to_call`` has its parameters frozen (``requires_grad_(False)``):
    host ops are inference-only in PopTorch.

    >>> double = CPU(lambda x: x * 2.0, "Double")
    >>> double(torch.ones(2))
    tensor([2., 2.])
    """

    def __init__(self, layer_to_call: Callable[..., Any], ID: str):
        """Args: layer_to_call: the host function or module. ID: the name of the op."""
        self._layer_to_call = layer_to_call
        if isinstance(layer_to_call, torch.nn.Module):
            layer_to_call.requires_grad_(False)
        self._ID = ID
        self.in_shapes: list[torch.Size] | None = None
        self.out_shapes: list[torch.Size] | None = None

    @property
    def ID(self) -> str:
        """The name given to the op."""
        return self._ID

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        """Call the host function on ``inputs``.

        Returns:
            Its single tensor as is, or its several outputs as a list.
        """
        outputs = self._layer_to_call(*inputs, **kwargs)
        single = not isinstance(outputs, (list, tuple))
        outputs_list = [outputs] if single else list(outputs)
        self.in_shapes = [getattr(i, "shape", None) for i in inputs]
        self.out_shapes = [getattr(o, "shape", None) for o in outputs_list]
        return outputs_list[0] if single else outputs_list

    def __repr__(self) -> str:
        return f"CPU(ID={self._ID!r}, layer={self._layer_to_call!r})"
