"""Rebinding of the device copy's methods from the host's modules and tensors to their copies.

[Note: modules reached outside self]
A ``forward`` may reach a module or tensor through a closure cell or a module-level global
instead of through ``self``, as in PopTorch's own tests::

    base = nn.Linear(10, 10)

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = base           # registered, so its weights are the model's

        def forward(self, x, y):
            out = base(x)              # ...but called through the closure
            return out, loss_fn(out, y)

PopTorch traces the user's own module, so ``base`` there *is* ``self.base``. The device copy has
its own module objects (see [Note: what the device copies] in device_tree.py), and a function's
closure and globals belong to the function, which the copy shares with the host's class: the copy
would call the host's ``base``, computing with the host's (stale) weights and never training the
device's. So after the copy, every device module whose class
(or a base class outside torch) has a method that refers to a copied host module or tensor gets
a generated subclass of its class, with those methods rebuilt from the same code but closure cells
and globals pointing to the copies. Objects the copy did not reach (a module that is not part
of the model) are left alone: as for PopTorch, they are not the model's weights.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

__all__ = ["rebind_to_copies", "rebound_function"]


def _copied(value: object, memo: dict[int, Any]) -> Any:
    """The device copy's replacement of ``value`` if it is a module or tensor it copied, else None."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        copy = memo.get(id(value))
        if copy is not None and copy is not value:
            return copy
    return None


def _rebound_cells(fn: types.FunctionType, memo: dict[int, Any]) -> tuple[Any, ...] | None:
    cells = fn.__closure__ or ()
    rebound, changed = [], False
    for cell in cells:
        try:
            copy = _copied(cell.cell_contents, memo)
        except ValueError:  # an empty cell (a name assigned later in the enclosing scope)
            copy = None
        rebound.append(cell if copy is None else types.CellType(copy))
        changed |= copy is not None
    return tuple(rebound) if changed else None


def _rebound_globals(fn: types.FunctionType, memo: dict[int, Any]) -> dict[str, Any] | None:
    names = fn.__code__.co_names
    updates = {
        name: copy
        for name in names
        if name in fn.__globals__ and (copy := _copied(fn.__globals__[name], memo)) is not None
    }
    return {**fn.__globals__, **updates} if updates else None


def rebound_function(fn: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType | None:
    """``fn`` rebuilt over the copies, or None when it refers to no copied object."""
    cells, fn_globals = _rebound_cells(fn, memo), _rebound_globals(fn, memo)
    if cells is None and fn_globals is None:
        return None
    new = types.FunctionType(
        fn.__code__,
        fn_globals if fn_globals is not None else fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        cells if cells is not None else fn.__closure__,
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new


def _rebound_methods(cls: type, memo: dict[int, Any]) -> dict[str, types.FunctionType]:
    methods: dict[str, types.FunctionType] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("torch."):
            continue
        for name, attr in vars(klass).items():
            if name in seen or not isinstance(attr, types.FunctionType):
                continue
            seen.add(name)  # the first definition along the MRO is the one that runs
            new = rebound_function(attr, memo)
            if new is not None:
                methods[name] = new
    return methods


def rebind_to_copies(model: nn.Module, memo: dict[int, Any]) -> list[str]:
    """Point the methods of ``model``'s modules at the device copy's objects, not the host's.

    See [Note: modules reached outside self].

    Args:
        model: the device's module tree.
        memo: host module/tensor id -> its copy in that tree.

    Returns:
        ``Class.method`` of every method that was rebuilt (for the debug log).
    """
    subclasses: dict[type, type | None] = {}
    rebuilt: list[str] = []
    for module in model.modules():
        cls = type(module)
        if cls not in subclasses:
            methods = _rebound_methods(cls, memo)
            subclasses[cls] = None
            if methods:
                namespace = {"__qualname__": cls.__qualname__, "__module__": cls.__module__}
                subclasses[cls] = type(cls)(cls.__name__, (cls,), {**namespace, **methods})
                rebuilt += [f"{cls.__qualname__}.{name}" for name in methods]
        if subclasses[cls] is not None:
            module.__class__ = subclasses[cls]  # type: ignore[assignment]
    return rebuilt
