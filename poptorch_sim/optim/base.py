"""The common base of ``poptorch.optim`` optimizers: explicit-argument tracking and IPU state.

[Note: optimizer state on the device]
PopTorch never runs an optimizer's Python ``step()`` during training: the executor keeps its own
optimizer state "on the device". A ``poptorch.optim`` optimizer's ``state_dict()`` therefore
returns the device state under two extra keys, next to torch's own ``state``/``param_groups``:
``ipu_state`` (state tensors, e.g. ``Accl1___lin.weight``) and ``ipu_param`` (hyper-parameter
tensors, e.g. ``learningRate___specific___lin.weight``). Both are ``None`` until an executor
has compiled a model with the optimizer.

Two flags tell the executor which side holds the newest copy:

======================  ============================================================
``host_state_is_dirty``  the device has stepped since the host copy was taken; the next
                         ``state_dict()`` reads the state back (through the reader the
                         executor installed with ``_set_state_reader``).
``ipu_state_is_dirty``   ``load_state_dict()`` put a state on the host that the executor
                         must write to the device before the next run.
======================  ============================================================

Executor protocol (the hooks are private: user code never calls them):

* after compiling / on attach: ``opt._set_state_reader(reader)`` where ``reader()`` returns
  ``(ipu_state, ipu_param)`` dicts of tensors; set ``opt.host_state_is_dirty = True`` after every
  run that stepped the optimizer.
* before a run: if ``opt.ipu_state_is_dirty`` and ``opt.has_state()``, write
  ``opt.get_state_dict()["ipu_state"]`` / ``["ipu_param"]`` to the device, then set
  ``opt.ipu_state_is_dirty = False``.
* when the optimizer is replaced by ``setOptimizer`` with another object, or the executor is
  destroyed: call ``opt.state_dict()`` once (to read the last state back), then
  ``opt._set_state_reader(None)``.
* ``opt._set_ipu_state(ipu_state, ipu_param)`` stores a state read from the device directly
  and leaves both flags clean.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from ..logger import logger
from .attributes import VariableAttributes

__all__ = ["Optimizer", "ACCUM_TYPE_ERROR", "StateReader"]

ACCUM_TYPE_ERROR = "Accumulation types must be either torch.float32 or torch.float16"
_SUPPORTED_ACCUM_TYPES = (torch.float32, torch.float16)

StateReader = Callable[[], "tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]"]


def explicit_args(local_vars: dict[str, Any]) -> dict[str, Any]:
    """Return the constructor arguments the caller passed explicitly (those that are not None).

    Args:
        local_vars: ``locals()`` taken on the first line of an optimizer's ``__init__``.
    """
    skip = ("self", "__class__")
    return {k: v for k, v in local_vars.items() if k not in skip and v is not None}


def check_accum_types(*dtypes: torch.dtype) -> None:
    """Raise PopTorch's AssertionError unless every dtype is torch.float32 or torch.float16."""
    for dtype in dtypes:
        if dtype not in _SUPPORTED_ACCUM_TYPES:
            raise AssertionError(f"{ACCUM_TYPE_ERROR} (got {dtype})")


def init_torch_parent(
    parent: type[torch.optim.Optimizer],
    optimizer: torch.optim.Optimizer,
    params: Iterable[Any],
    args: dict[str, Any],
) -> None:
    """Call ``parent.__init__`` with the explicitly passed arguments it accepts.

    PopTorch's signatures mirror torch 2.0; arguments that the installed torch no longer
    accepts are dropped (with a debug message) instead of failing.
    """
    accepted = inspect.signature(parent.__init__).parameters
    kwargs = {k: v for k, v in args.items() if k in accepted and k != "params"}
    dropped = sorted(set(args) - set(kwargs) - {"params"})
    if dropped:
        logger.debug("%s: torch %s ignores %s", parent.__name__, torch.__version__, dropped)
    parent.__init__(optimizer, params, **kwargs)  # type: ignore[misc]


class Optimizer:
    """The mixin every ``poptorch.optim`` optimizer inherits first (``poptorch.optim.Optimizer``).

    It redirects ``state_dict()``/``load_state_dict()`` to the optimizer state kept on the
    device (see [Note: optimizer state on the device]) and holds the flags the executor uses.
    """

    # Attributes that the torch parent class does not have and that are global (one value
    # for all groups, stored on the optimizer object).
    _child_vars: ClassVar[list[str]] = ["loss_scaling"]
    # Every attribute that the torch parent class does not have.
    _child_only: ClassVar[list[str]] = ["loss_scaling"]
    # Attributes (from the torch parent or PopTorch) that may differ between groups.
    _group_vars: ClassVar[list[str]] = ["lr"]
    # Plain attributes saved by pickling / copy.deepcopy besides torch's own.
    _saved_attrs: ClassVar[tuple[str, ...]] = ("loss_scaling",)
    # The torch class that holds the algorithm (torch.optim.Optimizer for LAMB).
    _torch_base: ClassVar[type[torch.optim.Optimizer]] = torch.optim.Optimizer

    variable_attrs: VariableAttributes

    def __init__(self) -> None:
        self._state_dict: dict[str, Any] = {"ipu_state": None, "ipu_param": None}
        # True: a state loaded on the host must be written to the device before the next run.
        self.ipu_state_is_dirty = False
        # True: the device has stepped since the host copy was read.
        self.host_state_is_dirty = False
        self._state_reader: StateReader | None = None

    def _track_variables(self, explicit: dict[str, Any]) -> None:
        """Create ``variable_attrs``: explicitly passed attributes are variable."""
        allowed = list(self.defaults) + list(type(self)._child_vars)  # type: ignore[attr-defined]
        variables = [k for k in explicit if k != "params"]
        self.variable_attrs = VariableAttributes(variables, allowed)

    def state_dict(self) -> dict[str, Any]:
        """Return torch's state dict plus ``ipu_state`` and ``ipu_param`` (the device state).

        The device state is read back first when the device has stepped since the last read.

        >>> opt.state_dict()["ipu_state"] is None  # before compilation
        True
        """
        if self._state_reader is not None:
            if self.host_state_is_dirty:
                self._set_ipu_state(*self._state_reader())
            else:
                logger.debug("Using cached optimiser state dict")
        return self.get_state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state dict produced by a ``poptorch.optim`` optimizer's ``state_dict()``.

        torch's part is loaded into the optimizer (so LR schedulers keep working) and the
        device part is written to the device before the next run.

        Raises:
            RuntimeError: ``state`` is empty, or it has no ``ipu_state``/``ipu_param`` keys
                (a plain torch optimizer's state dict).
        """
        _check_ipu_state_dict(state)
        if "param_groups" in state:
            torch.optim.Optimizer.load_state_dict(self, state)  # type: ignore[arg-type]
        self.set_state_dict(state)

    def get_state_dict(self) -> dict[str, Any]:
        """Return the cached device state and torch's state dict, without reading the device."""
        return {**self._state_dict, **torch.optim.Optimizer.state_dict(self)}  # type: ignore[arg-type]

    def set_state_dict(self, state: dict[str, Any]) -> None:
        """Store ``state``'s device part on the host and mark it for writing to the device.

        Raises:
            RuntimeError: ``state`` is empty or has no ``ipu_state``/``ipu_param`` keys.
        """
        _check_ipu_state_dict(state)
        self._state_dict = {"ipu_state": state["ipu_state"], "ipu_param": state["ipu_param"]}
        self.ipu_state_is_dirty = True
        self.host_state_is_dirty = False

    def has_state(self) -> bool:
        """Return True once a device state is known (after compilation or a load)."""
        return (
            self._state_dict.get("ipu_state") is not None
            and self._state_dict.get("ipu_param") is not None
        )

    def _set_state_reader(self, reader: StateReader | None) -> None:
        """Install (or remove, with None) the executor's device-state reader.

        ``reader()`` returns ``(ipu_state, ipu_param)``; ``state_dict()`` calls it when
        ``host_state_is_dirty`` is set. See [Note: optimizer state on the device].
        """
        self._state_reader = reader

    def _set_ipu_state(
        self, ipu_state: dict[str, torch.Tensor], ipu_param: dict[str, torch.Tensor]
    ) -> None:
        """Store a device state just read from the device; both sides are then in sync."""
        self._state_dict = {"ipu_state": dict(ipu_state), "ipu_param": dict(ipu_param)}
        self.host_state_is_dirty = False
        self.ipu_state_is_dirty = False

    def __getstate__(self) -> dict[str, Any]:
        if self._state_reader is not None and self.host_state_is_dirty:
            self._set_ipu_state(*self._state_reader())  # a copy carries the device's latest
        state = type(self)._torch_base.__getstate__(self)  # type: ignore[arg-type]
        for name in type(self)._saved_attrs:
            state[name] = getattr(self, name)
        state["variable_attrs"] = self.variable_attrs
        state["_state_dict"] = self._state_dict
        # A copy has no executor: a device state it carries must be written by the next one.
        state["ipu_state_is_dirty"] = self.has_state()
        state["host_state_is_dirty"] = False
        state["_state_reader"] = None
        return state


def _check_ipu_state_dict(state: dict[str, Any]) -> None:
    if not state:
        raise RuntimeError("Cannot load optimizer state dictionary because it is empty.")
    if not ("ipu_state" in state and "ipu_param" in state):
        raise RuntimeError(
            "Only IPU optimizer states can be loaded onto the IPU. "
            f"(got a state dict with keys {sorted(state)}; expected 'ipu_state' and 'ipu_param' "
            "as returned by a poptorch.optim optimizer's state_dict())"
        )
