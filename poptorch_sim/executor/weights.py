"""Host ↔ device weights: the device copy of a model and PopTorch's lazy host synchronisation.

[Note: lazy weight sync]
A simulated IPU holds its own copy of the weights (the *device copy* of the parameters and
buffers, made at compile time; see [Note: what the device copies] in ``device_tree.py``). As
in PopTorch, after a training call the host weights are stale until something on the host touches
them: the first access to the user's model (its
``_parameters``, ``_buffers``, ``forward``, ...) or to one of its parameters or buffers triggers one
``copyWeightsToHost()``, later accesses none. To see those accesses, ``trainingModel`` swaps the
class of the user's model, of each submodule and of each parameter/buffer to a generated subclass
whose attribute hooks ask their owner (the executor's ``DeviceLink``) to sync. ``destroy()`` swaps
them back. Host changes never reach the device by themselves: ``copyWeightsToDevice()`` does that.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import Error
from ..logger import logger
from ..ops.batchnorm import adapt_mixed_batch_norms
from .device_tree import device_tree
from .precision import weights_follow_activations
from .rebind import rebind_to_copies

__all__ = [
    "DeviceCopy",
    "HostSync",
    "WeightsOwner",
    "is_wrapped",
    "owner_of",
    "set_tensors_wrapped",
    "unwrap_tree",
]

_OWNER_ATTR = "_poptorch_sim_owner"
_state = threading.local()

# Module attributes whose access means "the user is looking at the weights".
_SYNC_ATTRS = frozenset(
    {
        "_parameters",
        "_buffers",
        "forward",
        "state_dict",
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "__call__",
        "__getstate__",
    }
)


class WeightsOwner(Protocol):
    """What the hooks of a training-wrapped model ask of its owner (``device_link.DeviceLink``)."""

    dirty_host_weights: bool
    host_weights_version: int

    def implicit_copy_to_host(self) -> None: ...

    def copy_to_host_if_needed(self) -> bool: ...

    def destroy(self) -> None: ...


def _syncing() -> bool:
    return getattr(_state, "syncing", False)


class _NoSync:
    """Suppress the sync hooks while the executor itself moves weights."""

    def __enter__(self) -> None:
        self._old = _syncing()
        _state.syncing = True

    def __exit__(self, *exc: object) -> None:
        _state.syncing = self._old


def _sync_owner(obj: object) -> None:
    if _syncing():
        return
    ref = object.__getattribute__(obj, "__dict__").get(_OWNER_ATTR)
    owner = ref() if ref is not None else None
    if owner is not None and owner.dirty_host_weights:
        with _NoSync():
            owner.implicit_copy_to_host()


def _module_getattribute(self: nn.Module, name: str) -> Any:
    if name in _SYNC_ATTRS:
        _sync_owner(self)
    return object.__getattribute__(self, name)


def _module_reduce_ex(self: nn.Module, proto: int) -> tuple[Any, ...]:
    # Copies and saved files hold the user's own class, never the generated wrapper.
    _sync_owner(self)
    state = dict(object.__getattribute__(self, "__dict__"))
    state.pop(_OWNER_ATTR, None)
    return (_rebuild_module, (_unwrapped_class(type(self)), state))


def _module_destroy(self: nn.Module) -> None:
    # PopTorch's wrapped model has destroy(): it destroys the executor and unwraps the model.
    owner = owner_of(self)
    if owner is not None:
        owner.destroy()
    unwrap_tree(self)  # also when the executor itself is gone


def _rebuild_module(cls: type, state: dict[str, Any]) -> nn.Module:
    module = cls.__new__(cls)
    if type(module) is not cls:  # fx's GraphModule.__new__ makes a class (without forward)
        module.__class__ = cls
    module.__dict__.update(state)
    return module


class _HostTensorMixin:
    """Parameters/buffers of a training-wrapped model: any use syncs them first."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        for arg in args:
            if isinstance(arg, _HostTensorMixin):
                _sync_owner(arg)
                break
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    def _plain(self, clone: bool) -> torch.Tensor:
        _sync_owner(self)
        with torch._C.DisableTorchFunctionSubclass():
            plain = self.detach().clone() if clone else self.detach()
            if isinstance(self, nn.Parameter):
                plain = nn.Parameter(plain, self.requires_grad)
        return plain

    def __reduce_ex__(self, proto):  # type: ignore[no-untyped-def]
        # Saved files must load without poptorch_sim: pickle a plain tensor.
        return self._plain(clone=False).__reduce_ex__(proto)

    def __deepcopy__(self, memo):  # type: ignore[no-untyped-def]
        # Copies of a wrapped model are the user's plain model.
        plain = self._plain(clone=True)
        memo[id(self)] = plain
        return plain


_wrapped_classes: dict[type, type] = {}


def _wrapped_class(cls: type) -> type:
    if cls not in _wrapped_classes:
        if issubclass(cls, nn.Module):
            body: dict[str, Any] = {
                "__getattribute__": _module_getattribute,
                "__reduce_ex__": _module_reduce_ex,
                "destroy": _module_destroy,
            }
            bases: tuple[type, ...] = (cls,)
        else:
            body, bases = {}, (_HostTensorMixin, cls)
        wrapped = type(f"Poptorch{cls.__name__}", bases, body)
        wrapped._poptorch_sim_base = cls  # type: ignore[attr-defined]
        _wrapped_classes[cls] = wrapped
    return _wrapped_classes[cls]


def _unwrapped_class(cls: type) -> type:
    return getattr(cls, "_poptorch_sim_base", cls)


def unwrap_tree(model: nn.Module) -> None:
    """Restore the user's classes on ``model``, its submodules, parameters and buffers."""
    for obj in list(_objects(model)):
        if obj is not None:
            obj.__dict__.pop(_OWNER_ATTR, None)
            if is_wrapped(obj):
                obj.__class__ = _unwrapped_class(type(obj))


def set_tensors_wrapped(model: nn.Module, wrapped: bool) -> None:
    """Take off (``wrapped=False``) or put back the host-sync classes of ``model``'s parameters
    and buffers, leaving the modules and the owning executor as they are.

    Taking them off first brings the host weights up to date, as any access would.
    """
    tensors = list(model.buffers()) + list(model.parameters())  # syncs a training model
    for t in tensors:
        if _OWNER_ATTR not in t.__dict__:
            continue
        if wrapped and not is_wrapped(t):
            t.__class__ = _wrapped_class(type(t))
        elif not wrapped and is_wrapped(t):
            t.__class__ = _unwrapped_class(type(t))


def is_wrapped(obj: object) -> bool:
    """Whether ``obj`` (module or tensor) is currently wrapped by a training executor."""
    return "_poptorch_sim_base" in type(obj).__dict__


def owner_of(module: nn.Module) -> WeightsOwner | None:
    """The owner of the training executor that wraps ``module``, or ``None``."""
    ref = module.__dict__.get(_OWNER_ATTR)
    return ref() if ref is not None else None


def _objects(model: nn.Module) -> Iterator[nn.Module | torch.Tensor]:
    with _NoSync():
        for module in model.modules():
            yield module
            yield from module._parameters.values()
            yield from (b for b in module._buffers.values() if b is not None)


class HostSync:
    """Swaps the classes of a user model's modules and tensors so that host access syncs."""

    def __init__(self, model: nn.Module, owner: WeightsOwner) -> None:
        self._model = model
        self._ref = weakref.ref(owner)

    def wrap(self) -> None:
        """Install the hooks."""
        for obj in list(_objects(self._model)):
            if obj is None or is_wrapped(obj):
                continue
            if isinstance(obj, torch.Tensor) and type(obj) not in (nn.Parameter, torch.Tensor):
                if not isinstance(obj, nn.Parameter):
                    raise Error(
                        f"All buffers must be an instance of torch.Tensor (Got {type(obj)})"
                    )
            obj.__class__ = _wrapped_class(type(obj))
            obj.__dict__[_OWNER_ATTR] = self._ref

    def unwrap(self) -> None:
        """Remove the hooks, restoring the user's classes."""
        unwrap_tree(self._model)


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    with _NoSync():
        named = list(model.named_parameters(remove_duplicate=False))
        named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False) if b is not None]
    return named


class DeviceCopy:
    """The simulated IPU's copy of a model's weights and buffers.

    Args:
        host: the user's model (PopTorch's shallow copy of it, made at wrap time).
        device: where the device copy lives (``cpu`` or a CUDA device).
    """

    def __init__(self, host: nn.Module, device: torch.device | None = None) -> None:
        with _NoSync():
            self.model, memo = device_tree(host)
        weights_follow_activations(self.model)
        adapt_mixed_batch_norms(self.model)  # half weights, float running statistics
        rebuilt = rebind_to_copies(self.model, memo)
        if rebuilt:
            logger.debug(
                "Methods that reach the model's modules outside self now use the device copy: %s",
                ", ".join(rebuilt),
            )
        if device is not None:
            self.model.to(device)
        self._host = host
        self.pairs = _pair_tensors(host, self.model)
        self.grouped: dict[str, Any] = {}  # name → GroupedVariable (see replica_groups.py)

    def upload(self, only: Callable[[str], bool] | None = None) -> None:
        """Copy host values into the device copy (``copyWeightsToDevice``)."""
        with _NoSync(), torch.no_grad():
            for name, host_t, dev_t in self.pairs:
                if only is None or only(name):
                    value = host_t.detach()
                    if name in self.grouped:
                        value = self.grouped[name].from_host(value)
                    dev_t.copy_(value)

    def download(self) -> None:
        """Copy device values into the host model (``copyWeightsToHost``)."""
        with _NoSync(), torch.no_grad():
            for name, host_t, dev_t in self.pairs:
                value = dev_t.detach()
                if name in self.grouped:
                    value = self.grouped[name].to_host(value)
                    if value.shape != host_t.shape:  # AllReplicas: one value per replica
                        host_t.data = value.clone()
                        continue
                host_t.copy_(value)

    def check_unchanged(self) -> None:
        """Raise PopTorch's errors if ``forward`` reassigned or removed a buffer or parameter."""
        current = {n: t for n, t in _named_tensors(self.model)}
        for name, _, dev_t in self.pairs:
            if name not in current:
                raise Error(
                    f"Buffer {name} is removed from the model when calling the forward method."
                )
            if current[name] is not dev_t:
                raise Error(
                    f"Buffer {name} is reassigned within the model when calling the forward "
                    f"method. This is not supported. Consider using self.{name}.copy_(src) to "
                    "copy data from a source tensor, where src is the name of the source tensor."
                )


def _pair_tensors(
    host: nn.Module, device: nn.Module
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    host_named = _named_tensors(host)
    device_named = dict(_named_tensors(device))
    seen: set[int] = set()
    pairs = []
    for name, host_t in host_named:
        if id(host_t) in seen:
            continue
        seen.add(id(host_t))
        pairs.append((name, host_t, device_named[name]))
    return pairs
