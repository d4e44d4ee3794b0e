"""Ops PopTorch refuses when it compiles a model, refused at the same point here.

PopTorch compiles a static graph, so an op whose output size depends on its input values, or a
mode its lowering does not implement, stops compilation with an error. poptorch_sim runs the
op fine on the host; refusing it too keeps a program that runs here one that compiles there.

    call                                          PopTorch's error (a poptorch.Error)
    F.one_hot(x, num_classes=-1)                  OneHot num classes must be specified ...
    torch.bincount(x) (no minlength)              Bincount `minlength` must be specified ...
    F.interpolate / nn.Upsample, linear or        Unsupported upsample mode aten::upsample_...:
      trilinear mode                                currently only 'nearest' is supported
    x[mask] (a bool / uint8 tensor index)         torch's DynamicOutputShapeException (aten.index)

Simulated: checked on the first micro-batch of a model that runs as one program (compile
time); the stages of a pipelined or sharded program are not checked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.overrides import TorchFunctionMode

from ..errors import Error

__all__ = ["PopTorchRefusals"]

_UPSAMPLE_OPS = {"linear": "upsample_linear1d", "trilinear": "upsample_trilinear3d"}


def _cpp_error(message: str) -> Error:
    err = Error(f"'poptorch_cpp_error': {message}", type="poptorch_cpp_error")
    err.message = message
    return err


def _arg(
    args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any
) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _mask_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) and i.dim() > 0
        for i in items
    )


class PopTorchRefusals(TorchFunctionMode):
    """Raise PopTorch's compile error for the calls listed in the module docstring."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "one_hot" and _arg(args, kwargs, 1, "num_classes", -1) == -1:
            raise _cpp_error("OneHot num classes must be specified and must be constant.")
        if name == "bincount" and _arg(args, kwargs, 2, "minlength", 0) <= 0:
            raise _cpp_error(
                "Bincount `minlength` must be specified and must be a constant. On the IPU MK2 "
                "platform the minimum length is also the maximum length"
            )
        if name == "interpolate":
            mode = _arg(args, kwargs, 3, "mode", "nearest")
            if mode in _UPSAMPLE_OPS:
                raise _cpp_error(
                    f"Unsupported upsample mode aten::{_UPSAMPLE_OPS[mode]}: currently only "
                    "'nearest' is supported"
                )
        if name == "__getitem__" and _mask_index(args[1] if len(args) > 1 else None):
            err = DynamicOutputShapeException(torch.ops.aten.index.Tensor)
            err.add_note(
                "Indexing with a boolean mask gives an output whose size depends on the mask's "
                "values, which a static IPU graph cannot hold: use torch.where or masked_fill."
            )
            raise err
        return func(*args, **kwargs)
