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
    an op mixing a tensor made in forward by a    Expected an IPU tensor but got
      legacy constructor (torch.LongTensor(..))     tensor(device=cpu, shape=[2], dtype=Long)
      with the model's tensors

[Note: host tensors made in forward]
PopTorch puts every tensor that ``forward`` makes with a factory function (``torch.tensor``,
``torch.zeros`` ...) on the IPU, but a legacy typed constructor (``torch.LongTensor([1, 0])``,
``torch.FloatTensor`` ...) always makes a CPU tensor, and an op that mixes it with IPU tensors
fails to compile. Here every tensor is a host tensor, so while the first micro-batch runs the
typed constructors are wrapped to mark what they make; ops among marked tensors only stay on
the host (their results are marked), ``.to``/``.copy_`` move a marked tensor to the device, and
any other op mixing a marked tensor of one or more dimensions with an unmarked one raises
PopTorch's error. 0-dim tensors may mix, as CPU scalars may in PyTorch.

Simulated: checked on the first micro-batch of a model that runs as one program (compile
time); the stages of a pipelined or sharded program are not checked, and ``torch.Tensor(..)``
(the untyped legacy constructor, which is also every tensor's class) is not wrapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from ..compat.overwrite import SharedPatch
from ..errors import Error

__all__ = ["PopTorchRefusals"]

_UPSAMPLE_OPS = {"linear": "upsample_linear1d", "trilinear": "upsample_trilinear3d"}

_TYPED_CONSTRUCTORS = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "ByteTensor",
    "CharTensor",
    "ShortTensor",
    "IntTensor",
    "LongTensor",
    "BoolTensor",
)
_HOST_MARK = "_poptorch_sim_host_tensor"
_MOVES = {"to", "copy_"}  # ops that take a host tensor to the device


class _HostConstructor:
    """A typed legacy constructor (``torch.LongTensor`` ...) whose tensors are marked as host
    tensors; ``isinstance`` and attributes answer as the real type's."""

    def __init__(self, real: Any) -> None:
        self.wrapped = real

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        tensor = self.wrapped(*args, **kwargs)
        setattr(tensor, _HOST_MARK, True)
        return tensor

    def __instancecheck__(self, obj: object) -> bool:
        return isinstance(obj, self.wrapped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return repr(self.wrapped)


def _wrap_constructors() -> Callable[[], None]:
    originals = {name: getattr(torch, name) for name in _TYPED_CONSTRUCTORS}
    for name, real in originals.items():
        setattr(torch, name, _HostConstructor(real))

    def unwrap() -> None:
        for name, real in originals.items():
            if isinstance(getattr(torch, name), _HostConstructor):
                setattr(torch, name, real)

    return unwrap


_HOST_CONSTRUCTORS = SharedPatch(_wrap_constructors)


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, _HOST_MARK, False)


def _dtype_name(tensor: torch.Tensor) -> str:
    return tensor.type().removeprefix("torch.").removesuffix("Tensor")  # c10's: Long, Float ...


def _check_host_tensors(
    name: str, leaves: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Raise for an op mixing host and device tensors; whether the op runs on the host."""
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    hosts = [t for t in tensors if _is_host(t)]
    if not hosts:
        return False
    if name in _MOVES:
        return name == "to" and len(tensors) == 1 and not _names_device(args, kwargs)
    if len(hosts) == len(tensors):
        return True
    host = next((t for t in hosts if t.dim() > 0), None)
    if host is None:
        return False
    shape = ", ".join(str(d) for d in host.shape)
    raise _cpp_error(
        f"Expected an IPU tensor but got tensor(device=cpu, shape=[{shape}], "
        f"dtype={_dtype_name(host)})"
    )


def _names_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    values = list(args[1:]) + list(kwargs.values())
    return any(isinstance(v, (str, torch.device)) for v in values)


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

    def __enter__(self) -> PopTorchRefusals:
        _HOST_CONSTRUCTORS.__enter__()
        try:
            return super().__enter__()  # type: ignore[no-any-return]
        except BaseException:
            _HOST_CONSTRUCTORS.__exit__()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _HOST_CONSTRUCTORS.__exit__()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        leaves = tree_flatten((args, kwargs))[0]
        if any(isinstance(v, _HostConstructor) for v in leaves):  # x.type(torch.LongTensor)
            args, kwargs = tree_map(_real_type, (args, kwargs))
            leaves = tree_flatten((args, kwargs))[0]
        on_host = _check_host_tensors(name, leaves, args, kwargs)
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
        out = func(*args, **kwargs)
        if name == "to" and not on_host and _is_host(out):
            out = out.view_as(out)  # moved to the device: a new tensor, as PopTorch's
        if on_host:
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor):
                    setattr(value, _HOST_MARK, True)
        return out


def _real_type(value: Any) -> Any:
    return value.wrapped if isinstance(value, _HostConstructor) else value
