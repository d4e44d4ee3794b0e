"""Binding ``forward``'s arguments and flattening their tensors into the program's named inputs.

The program's inputs are the tensor leaves of the arguments, in ``forward``'s signature order
(positional parameters, then keyword-only ones; ``*args`` items in order; ``**kwargs`` items in
call order). A leaf nested in a tuple, list or dict gets the name ``<param>_<i>`` (``i``: its
index among that argument's leaves). Everything that is not a tensor is a constant of the
compiled program, as in PopTorch, which traces ``forward`` once.

    forward(self, x, mask=None, *extra, scale=1.0, **named)
    model(a, (b, c), d, scale=2.0, w=e)   ->  inputs x=a, mask_0=b, mask_1=c, extra_0=d, w=e
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import Error

__all__ = ["bind_arguments", "map_tensor_inputs", "flatten_inputs"]

TensorFn = Callable[[str, torch.Tensor], Any]


def bind_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> inspect.BoundArguments:
    """Bind a call's arguments to ``forward``'s signature.

    Raises:
        poptorch.Error: the arguments do not fit the signature.
    """
    try:
        return signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise Error(
            f"The inputs do not match the model's forward{signature}: {exc} "
            f"(got {len(args)} positional and keyword arguments {sorted(kwargs)})"
        ) from None


def _map_value(name: str, value: Any, fn: TensorFn) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(name, value)
    leaves, spec = pytree.tree_flatten(value)
    if not any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return value
    mapped = [
        fn(f"{name}_{i}", leaf) if isinstance(leaf, torch.Tensor) else leaf
        for i, leaf in enumerate(leaves)
    ]
    return pytree.tree_unflatten(mapped, spec)


def map_tensor_inputs(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any], fn: TensorFn
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace every tensor leaf of a call's arguments by ``fn(name, tensor)``, in input order.

    Returns:
        The new ``(args, kwargs)`` to call ``forward`` with.
    """
    bound = bind_arguments(signature, args, kwargs)
    for pname, value in list(bound.arguments.items()):
        kind = signature.parameters[pname].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            new: Any = tuple(_map_value(f"{pname}_{i}", v, fn) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            new = {k: _map_value(k, v, fn) for k, v in value.items()}
        else:
            new = _map_value(pname, value, fn)
        bound.arguments[pname] = new
    return bound.args, bound.kwargs


def flatten_inputs(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The tensor inputs of a call, in the order of ``StagedProgram.input_names``.

    >>> def forward(x, labels=None): ...
    >>> flatten_inputs(inspect.signature(forward), (torch.ones(1),), {"labels": torch.zeros(1)})
    [tensor([1.]), tensor([0.])]
    """
    found: list[torch.Tensor] = []

    def collect(name: str, tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensor_inputs(signature, args, kwargs, collect)
    return found
