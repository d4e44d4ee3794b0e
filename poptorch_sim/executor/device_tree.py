"""The device's module tree: the user's modules with their own parameters and buffers, all else shared.

[Note: what the device copies]
PopTorch wraps ``copy.copy(model)``: a shallow copy made when ``trainingModel`` /
``inferenceModel`` is called, so the top-level module's plain attributes (``training`` above all)
are a snapshot of that moment, while submodules, loss functions, a Lightning module's trainer and
every other attribute object stay the user's. Only what the IPU owns, the parameters and buffers,
becomes device state, uploaded at attach time and read back lazily (see [Note: lazy weight sync]
in weights.py).

The simulator needs somewhere to keep the device's values while the host keeps its own, so at
compile time it copies the *containers* of device state, nothing else: each module of the tree
becomes a new object of the same class whose ``__dict__`` holds the same values as the user's
module (the same hooks, the same trainer, the same closures) except for its own ``_modules``,
``_parameters`` and ``_buffers``, which hold the device copies. Nothing is pickled or deep-copied,
so objects that cannot be (a ``mappingproxy``, a lock, a live trainer) are simply shared, and no
``__getstate__`` drops attributes. Where a plain attribute, a closure cell or a global refers to a
module or tensor of the tree, the device's copy of that module or tensor takes its place, so the
device computes with and trains its own weights (see [Note: modules reached outside self] in
rebind.py).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from .rebind import rebound_function

__all__ = ["device_tree", "shallow_copy"]

# The containers nn.Module keeps per instance (hooks, ...): copied, so that a hook the user adds to
# the host model later does not run on the device, as it would not on an IPU (traced once).
_MODULE_INTERNALS = frozenset(nn.Module().__dict__)


def _base_class(cls: type) -> type:
    # Host-sync wrapping (weights.py) swaps classes; copies hold the user's own class.
    return getattr(cls, "_poptorch_sim_base", cls)


def _new_instance(cls: type) -> Any:
    """An uninitialised instance of exactly ``cls``."""
    new = cls.__new__(cls)
    if type(new) is not cls:  # fx's GraphModule.__new__ makes a class (without forward) per call
        new.__class__ = cls
    return new


def _own_dict(obj: object) -> dict[str, Any]:
    return object.__getattribute__(obj, "__dict__")


def shallow_copy(model: nn.Module) -> nn.Module:
    """``copy.copy(model)`` as PopTorch makes it at wrap time, without pickling hooks.

    The copy has its own ``__dict__`` (a snapshot of the plain attributes, e.g. ``training``)
    whose values are the model's own objects: same submodules, same parameters.

    Args:
        model: the user's model.

    Returns:
        The shallow copy.
    """
    new = _new_instance(_base_class(type(model)))
    state = dict(_own_dict(model))
    state.pop("_poptorch_sim_owner", None)
    _own_dict(new).update(state)
    return new


def _copy_tensor(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        if type(t) in (torch.Tensor, nn.Parameter) or hasattr(type(t), "_poptorch_sim_base"):
            plain = t.detach().clone()
            return nn.Parameter(plain, t.requires_grad) if isinstance(t, nn.Parameter) else plain
        return copy.deepcopy(t) if t.is_leaf else t.detach().clone()


def _tensor(t: torch.Tensor | None, memo: dict[int, Any]) -> Any:
    if t is None:
        return None
    if id(t) not in memo:  # a tensor shared by several modules (tied weights) is copied once
        memo[id(t)] = _copy_tensor(t)
    return memo[id(t)]


def _copy_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    new = _new_instance(_base_class(type(module)))
    state = dict(_own_dict(module))
    state.pop("_poptorch_sim_owner", None)
    for name in _MODULE_INTERNALS:
        if isinstance(state.get(name), dict) and name not in ("_modules", "_parameters"):
            state[name] = copy.copy(state[name])
    _own_dict(new).update(state)
    memo[id(module)] = new
    return new


def _copy_tree(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    if id(module) in memo:
        return memo[id(module)]
    new = _copy_module(module, memo)
    new._parameters = {name: _tensor(p, memo) for name, p in module._parameters.items()}
    new._buffers = {name: _tensor(b, memo) for name, b in module._buffers.items()}
    new._modules = {
        name: None if child is None else _copy_tree(child, memo)
        for name, child in module._modules.items()
    }
    return new


def _rebound_value(value: Any, memo: dict[int, Any]) -> Any:
    """The device's counterpart of an attribute value, or ``value`` itself."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        return memo.get(id(value), value)
    if isinstance(value, types.MethodType) and id(value.__self__) in memo:
        return types.MethodType(value.__func__, memo[id(value.__self__)])
    if isinstance(value, types.FunctionType):  # e.g. a loss function closing over a module
        return rebound_function(value, memo) or value
    return value


def device_tree(
    model: nn.Module, shared: Iterable[torch.Tensor] = ()
) -> tuple[nn.Module, dict[int, Any]]:
    """Copy ``model``'s module tree with device copies of its parameters and buffers.

    See [Note: what the device copies].

    Args:
        model: the (shallow copy of the) user's model.
        shared: tensors the copy holds as they are, not copied (a replica's parameters, see
            [Note: replicas on threads] in replica_threads.py).

    Returns:
        The device's tree and the map from the id of each host module and tensor to its copy.

    >>> net = nn.Linear(2, 2)
    >>> tree, memo = device_tree(net, shared=[net.weight])
    >>> tree.weight is net.weight, tree.bias is net.bias
    (True, False)
    """
    memo: dict[int, Any] = {id(t): t for t in shared}
    root = _copy_tree(model, memo)
    for module in root.modules():
        state = _own_dict(module)
        for name, value in state.items():
            if name not in _MODULE_INTERNALS:
                state[name] = _rebound_value(value, memo)
    return root, memo
