"""Snapshots of an optimizer's hyper-parameters, taken when a model is wrapped or ``setOptimizer``.

PopTorch never runs an optimizer's Python code: it reads the hyper-parameters once (when the
model is wrapped, and again at each ``setOptimizer``) and hands them to the device's own
optimizer. Editing ``optimizer.param_groups[0]["lr"]`` therefore has no effect until
``setOptimizer(optimizer)`` takes a new snapshot. An ``OptimizerSnapshot`` is that frozen
record: the algorithm (``kind`` and PopTorch's ``variant``), each group's hyper-parameters with
the group's parameters as indices, the global extras, and which values are constant.

[Note: constant and variable hyper-parameters]
A constant hyper-parameter is compiled into the model; a variable one can be changed later.
For ``poptorch.optim`` optimizers ``optimizer.variable_attrs`` decides (explicitly passed
constructor arguments are variable). For ``torch.optim`` optimizers a value equal to torch's
default is constant (``weight_decay`` 0, or 1e-2 for AdamW; ``momentum``/``dampening`` 0;
``eps`` 1e-8; ``loss_scaling``/``velocity_scaling`` 1; ``max_weight_norm`` 65500), ``lr`` is
always variable and ``alpha``/``nesterov``/``betas`` always constant. Automatic loss scaling
makes ``loss_scaling`` variable.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from ...errors import Error
from ...logger import logger
from ..adam import Adam, AdamW
from ..attributes import VariableAttributes
from ..base import Optimizer
from ..lamb import LAMB
from ..rmsprop import RMSprop
from ..sgd import SGD
from .attribute_checks import known_attrs, report_unexpected
from .hyperparameters import KINDS

__all__ = ["GroupSnapshot", "OptimizerSnapshot", "snapshot", "KINDS", "SUPPORTED_TYPES"]

SUPPORTED_TYPES: tuple[type[torch.optim.Optimizer], ...] = (
    SGD,
    Adam,
    AdamW,
    RMSprop,
    LAMB,
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.RMSprop,
)

# Hyper-parameters read from each group, per kind (PopTorch's ``_group_vars`` less amsgrad).
_GROUP_VARS = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "velocity_scaling"),
    "adam": ("lr", "betas", "eps", "weight_decay"),
    "adamw": ("lr", "betas", "eps", "weight_decay"),
    "rmsprop": ("lr", "momentum", "weight_decay", "alpha", "eps", "centered"),
    "lamb": ("lr", "weight_decay", "betas", "eps", "max_weight_norm"),
}
_GROUP_DEFAULTS = {"velocity_scaling": 1.0}
# Global attributes each kind reads from the optimizer object (the others take defaults).
_ACCUM = ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type")
_OPTIMIZER_ATTRS = {
    "sgd": ("use_combined_accum", "accum_type", "velocity_accum_type", "max_grad_norm"),
    "adam": (*_ACCUM, "max_grad_norm"),
    "adamw": ("bias_correction", *_ACCUM, "max_grad_norm"),
    "rmsprop": (*_ACCUM, "use_tf_variant"),
    "lamb": ("bias_correction", *_ACCUM),
}
_OPTIMIZER_DEFAULTS: dict[str, Any] = {
    "use_combined_accum": False,
    "bias_correction": True,
    "use_tf_variant": False,
    "max_grad_norm": math.inf,
    "accum_type": torch.float32,
    "velocity_accum_type": torch.float32,
    "first_order_momentum_accum_type": torch.float32,
    "second_order_momentum_accum_type": torch.float32,
}
# torch.optim optimizers: when is a value constant? See [Note: constant and variable ...].
_ALWAYS = ("alpha", "nesterov", "betas", "centered")
_CONSTANT_VALUE = {
    "momentum": 0.0,
    "velocity_scaling": 1.0,
    "dampening": 0.0,
    "eps": 1e-08,
    "max_weight_norm": 65500.0,
}


@dataclass(frozen=True, repr=False)
class GroupSnapshot:
    """One parameter group: its parameters (indices) and hyper-parameters (values, constness)."""

    params: tuple[int, ...]
    values: Mapping[str, Any]
    constant: frozenset[str]

    def __repr__(self) -> str:
        items = ", ".join(
            f"{k}={v!r}{' (const)' if k in self.constant else ''}" for k, v in self.values.items()
        )
        return f"GroupSnapshot(params={list(self.params)}, {items})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A read-only mapping does not pickle: a pickled training model keeps a plain dict.
        return (_group_snapshot, (self.params, dict(self.values), self.constant))


def _group_snapshot(
    params: tuple[int, ...], values: dict[str, Any], constant: frozenset[str]
) -> GroupSnapshot:
    return GroupSnapshot(params, MappingProxyType(values), constant)


@dataclass(frozen=True)
class OptimizerSnapshot:
    """Everything the device optimizer needs, frozen at wrap / ``setOptimizer`` time.

    Attributes:
        kind: the algorithm: ``'sgd'``, ``'adam'``, ``'adamw'``, ``'rmsprop'`` or ``'lamb'``.
        variant: PopTorch's backend optimizer type, e.g. ``'SGD2'``, ``'ADAMW_NO_BIAS'``.
        type_name: the class name of the user's optimizer (for messages).
        defaults: the optimizer's defaults, as a group without parameters.
        groups: one ``GroupSnapshot`` per parameter group, in order.
        num_params: how many parameters the optimizer holds (all groups).
        loss_scaling, loss_scaling_is_constant: the global loss scaling and its constness.
        max_grad_norm: global gradient-norm clip (``inf``: none).
        accum_type, velocity_accum_type, first_order_momentum_accum_type,
            second_order_momentum_accum_type: dtypes of the device buffers.
        use_combined_accum, bias_correction, use_tf_variant: algorithm switches.
        known_group_attrs, known_optimizer_attrs: attribute names seen by the first snapshot;
            later snapshots warn about names outside them.
    """

    kind: str
    variant: str
    type_name: str
    defaults: GroupSnapshot
    groups: tuple[GroupSnapshot, ...]
    num_params: int
    loss_scaling: float
    loss_scaling_is_constant: bool
    max_grad_norm: float
    accum_type: torch.dtype
    velocity_accum_type: torch.dtype
    first_order_momentum_accum_type: torch.dtype
    second_order_momentum_accum_type: torch.dtype
    use_combined_accum: bool
    bias_correction: bool
    use_tf_variant: bool
    known_group_attrs: frozenset[str]
    known_optimizer_attrs: frozenset[str]

    @property
    def requires_running_mean_reduction(self) -> bool:
        """True when PopTorch switches the mean reduction to ``Running`` (float16 accumulators)."""
        return self.accum_type == torch.float16 and not self.use_combined_accum

    def is_constant(self, name: str, group: int | None = None) -> bool:
        """Return whether hyper-parameter ``name`` (of ``group``, or the defaults) is constant."""
        if name == "loss_scaling":
            return self.loss_scaling_is_constant
        source = self.defaults if group is None else self.groups[group]
        return name in source.constant


def snapshot(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor] | None = None,
    *,
    previous: OptimizerSnapshot | None = None,
    auto_loss_scaling: bool = False,
    relax_checks: bool = False,
    reported: set[str] | None = None,
) -> OptimizerSnapshot:
    """Freeze ``optimizer``'s hyper-parameters into an ``OptimizerSnapshot``.

    Args:
        optimizer: a ``poptorch.optim`` optimizer or a plain ``torch.optim`` SGD, Adam, AdamW
            or RMSprop.
        params: the list the group indices refer to (the model's parameters, matched by
            identity). Default None: the optimizer's own parameters, group after group.
        previous: the snapshot this one replaces (``setOptimizer``): attributes it did not know
            are reported as ignored.
        auto_loss_scaling: automatic loss scaling is on (makes ``loss_scaling`` variable).
        relax_checks: report unexpected attributes at debug level instead of as warnings
            (``Options.relaxOptimizerAttributesChecks``).
        reported: the unexpected-attribute messages already given for this model (each is
            given once; the set is updated).

    Raises:
        AssertionError: unsupported optimizer type; RMSprop groups that disagree on
            ``centered``; a hyper-parameter that is missing or not a number.
        ValueError: ``amsgrad=True``; an accumulation dtype other than float16 / float32;
            ``max_grad_norm`` is NaN.
        Error: an optimizer parameter that is not in ``params``.

    >>> snap = snapshot(torch.optim.SGD(model.parameters(), lr=0.1), list(model.parameters()))
    >>> snap.kind, snap.groups[0].values["lr"]
    ('sgd', 0.1)
    """
    kind = _kind_of(optimizer)
    variable_attrs: VariableAttributes | None = getattr(optimizer, "variable_attrs", None)
    if variable_attrs is not None and auto_loss_scaling:
        variable_attrs.markAsVariable("loss_scaling")
    is_const = _constness_rule(optimizer, kind, variable_attrs)
    indices = _group_indices(optimizer, params)
    defaults = _read_group(optimizer.defaults, kind, (), is_const)
    groups = tuple(
        _read_group(g, kind, idx, is_const) for g, idx in zip(optimizer.param_groups, indices)
    )
    if previous is not None and len(previous.groups) == len(groups):
        known = previous.known_group_attrs
        defaults = _ignore_unexpected(defaults, previous.defaults, optimizer.defaults, known)
        groups = tuple(
            _ignore_unexpected(new, old, raw, known)
            for new, old, raw in zip(groups, previous.groups, optimizer.param_groups)
        )
    extras = _read_optimizer_attrs(optimizer, kind)
    loss_scaling = _number(getattr(optimizer, "loss_scaling", 1.0), "loss_scaling")
    if variable_attrs is not None:
        ls_const = variable_attrs.isConstant("loss_scaling")
    else:
        ls_const = loss_scaling == 1.0 and not auto_loss_scaling
    snap = OptimizerSnapshot(
        kind=kind,
        variant=_variant(optimizer, kind, extras),
        type_name=type(optimizer).__name__,
        defaults=defaults,
        groups=groups,
        num_params=sum(len(i) for i in indices),
        loss_scaling=loss_scaling,
        loss_scaling_is_constant=ls_const,
        **extras,
        **_known_attrs(optimizer, previous),
    )
    if previous is not None:
        report_unexpected(optimizer, snap.variant, snap.known_group_attrs,
                          snap.known_optimizer_attrs, relax_checks, reported)  # fmt: skip
    logger.debug("Optimizer snapshot %s", snap)
    return snap


def _kind_of(optimizer: torch.optim.Optimizer) -> str:
    if isinstance(optimizer, SUPPORTED_TYPES) and type(optimizer) not in SUPPORTED_TYPES:
        logger.warning(
            "Optimizer `%s` subclassed from classes in poptorch.optim or torch.optim are "
            "unlikely to behave as intended. Poptorch does not run Python optimizer code "
            "directly; but instead uses IPU native optimisers implemented in PopART. "
            "(Simulated: poptorch_sim runs its own %s update with the hyper-parameters read "
            "from the optimizer.)",
            type(optimizer).__name__,
            next(t for t in type(optimizer).__mro__ if t in SUPPORTED_TYPES).__name__,
        )
    if isinstance(optimizer, LAMB):
        return "lamb"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    # torch >= 2.5 makes AdamW a subclass of Adam: test AdamW first.
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adamw" if optimizer.defaults.get("decoupled_weight_decay") else "adam"
    if isinstance(optimizer, torch.optim.RMSprop):
        return "rmsprop"
    names = ", ".join(
        f"{'poptorch' if issubclass(t, Optimizer) else 'torch'}.optim.{t.__name__}"
        for t in SUPPORTED_TYPES
    )
    raise AssertionError(
        f"Unsupported optimizer type. Types supported: {names} "
        f"(got {type(optimizer).__module__}.{type(optimizer).__name__})"
    )


def _constness_rule(
    optimizer: torch.optim.Optimizer, kind: str, variable_attrs: VariableAttributes | None
) -> Callable[[str, Any], bool]:
    """Return ``is_const(name, value)`` (see [Note: constant and variable hyper-parameters])."""
    if variable_attrs is not None:
        # ``centered`` selects the variant; it is never a tunable value.
        return lambda name, _value: name == "centered" or variable_attrs.isConstant(name)
    decay_default = 1e-2 if isinstance(optimizer, torch.optim.AdamW) else 0.0

    def torch_rule(name: str, value: Any) -> bool:
        if name == "lr":
            return False
        if name in _ALWAYS:
            return True
        if name == "weight_decay":
            return bool(value == decay_default)
        return bool(value == _CONSTANT_VALUE[name])

    return torch_rule


def _group_indices(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor] | None
) -> list[tuple[int, ...]]:
    if params is None:
        sizes = [len(g["params"]) for g in optimizer.param_groups]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [tuple(range(s, s + n)) for s, n in zip(starts, sizes)]
    position = {id(p): i for i, p in enumerate(params)}
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        missing = [tuple(p.shape) for p in group["params"] if id(p) not in position]
        if missing:
            raise Error(
                f"The optimizer's group {gi} holds {len(missing)} tensor(s) that are not "
                f"parameters of the model (shapes {missing[:4]}): build the optimizer from "
                "model.parameters() of the model you wrap."
            )
        out.append(tuple(position[id(p)] for p in group["params"]))
    return out


def _read_group(
    group: Mapping[str, Any],
    kind: str,
    params: tuple[int, ...],
    is_const: Callable[[str, Any], bool],
) -> GroupSnapshot:
    if kind in ("adam", "adamw") and group.get("amsgrad"):
        raise ValueError("Only non-amsgrad Adam/AdamW optimizers are supported.")
    values: dict[str, Any] = {}
    for name in _GROUP_VARS[kind]:
        value = group.get(name, _GROUP_DEFAULTS.get(name))
        if value is None:
            raise AssertionError(f"Mandatory attribute {name} not found in optimizer group")
        values[name] = _pair(value, name) if name == "betas" else _number(value, name)
    constant = frozenset(k for k, v in values.items() if is_const(k, v))
    return GroupSnapshot(params, MappingProxyType(values), constant)


def _ignore_unexpected(
    new: GroupSnapshot, old: GroupSnapshot, raw: Mapping[str, Any], known: frozenset[str]
) -> GroupSnapshot:
    """``new`` with the values of the attributes the first snapshot did not know (reported as
    "Ignoring unexpected group i attribute") as ``old`` had them: the device ignores them."""
    ignored = [name for name in new.values if name in raw and name not in known]
    if not ignored:
        return new
    values = {**new.values, **{name: old.values[name] for name in ignored}}
    constant = (new.constant - set(ignored)) | (old.constant & set(ignored))
    return GroupSnapshot(new.params, MappingProxyType(values), frozenset(constant))


def _number(value: Any, name: str) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if not isinstance(value, numbers.Number):
        raise AssertionError(f"Expected a number for {name} but got {value!r} instead")
    return value


def _pair(value: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise AssertionError(f"Expected a pair for {name} but got {value!r} instead")
    return (_number(value[0], f"{name}[0]"), _number(value[1], f"{name}[1]"))


def _read_optimizer_attrs(optimizer: torch.optim.Optimizer, kind: str) -> dict[str, Any]:
    out = dict(_OPTIMIZER_DEFAULTS)
    for name in _OPTIMIZER_ATTRS[kind]:
        value = getattr(optimizer, name, _OPTIMIZER_DEFAULTS[name])
        if value is None:
            raise AssertionError(f"Mandatory attribute {name} not found in optimizer attributes")
        if name.endswith("accum_type") and value not in (torch.float16, torch.float32):
            raise ValueError(
                f"{name} must be set to either torch.float16 or torch.float32 not {value}"
            )
        if name == "max_grad_norm" and math.isnan(_number(value, name)):
            raise ValueError("max_grad_norm must not be NaN")
        out[name] = value
    return out


def _variant(optimizer: torch.optim.Optimizer, kind: str, extras: dict[str, Any]) -> str:
    if kind == "sgd":
        return "SGD1" if extras["use_combined_accum"] else "SGD2"
    if kind == "rmsprop":
        centered = optimizer.param_groups[0]["centered"]
        for i, group in enumerate(optimizer.param_groups):
            if group["centered"] != centered:
                raise AssertionError(
                    "All parameter groups must have the same value for the 'centered' "
                    f"attribute (Group 0: {centered} / Group {i}: {group['centered']})"
                )
        return "RMSPROP_CENTERED" if centered else "RMSPROP"
    suffix = "" if extras["bias_correction"] else "_NO_BIAS"
    return {"adam": "ADAM", "adamw": "ADAMW", "lamb": "LAMB"}[kind] + (
        suffix if kind != "adam" else ""
    )


def _known_attrs(
    optimizer: torch.optim.Optimizer, previous: OptimizerSnapshot | None
) -> dict[str, frozenset[str]]:
    if previous is not None:
        return {
            "known_group_attrs": previous.known_group_attrs,
            "known_optimizer_attrs": previous.known_optimizer_attrs,
        }
    group, optimizer_attrs = known_attrs(optimizer)
    return {"known_group_attrs": group, "known_optimizer_attrs": optimizer_attrs}
