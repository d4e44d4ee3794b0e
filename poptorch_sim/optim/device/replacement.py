"""Whether a new optimizer snapshot may replace the one a model was compiled with."""

from __future__ import annotations

from typing import Any

from ...errors import Error
from .snapshot import GroupSnapshot, OptimizerSnapshot

__all__ = ["check_update"]

# Global attributes fixed at compilation (PopTorch's "optimizer attributes").
_FIXED_ATTRS = (
    "max_grad_norm",
    "accum_type",
    "velocity_accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
    "use_tf_variant",
)
_CONSTANT_ERROR = "Trying to modify a constant attribute after the model has been compiled"
_HOW_TO_FIX = (
    "Only variable attributes may change after compilation. An attribute is variable when it "
    "was passed explicitly to the poptorch.optim constructor (or, for a torch.optim optimizer, "
    "when it differs from torch's default; lr is always variable). Mark it before the model "
    "is compiled with optimizer.variable_attrs.markAsVariable({name!r}), or wrap the model "
    "again to recompile."
)


def check_update(old: OptimizerSnapshot, new: OptimizerSnapshot) -> None:
    """Raise unless ``new`` can replace ``old`` in an already compiled model (``setOptimizer``).

    Variable hyper-parameters may change freely. Changing a constant one, turning a constant
    into a variable one or back, changing the algorithm (including SGD's combined/separate
    variant, RMSprop's ``centered`` or ``bias_correction``), the accumulation dtypes,
    ``max_grad_norm``, ``use_tf_variant``, or which parameters the groups hold is an error.

    Args:
        old: the snapshot the model was compiled with (or last updated to).
        new: the snapshot of the optimizer passed to ``setOptimizer``.

    Raises:
        Error: ``new`` is not a valid replacement; the message names the attribute, the group
            and the old and new values.

    >>> check_update(snapshot(opt), snapshot(opt))  # unchanged: fine
    """
    _check_structure(old, new)
    for name in _FIXED_ATTRS:
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            raise Error(
                f"{_CONSTANT_ERROR}: the optimizer attribute {name!r} changed from {before} to "
                f"{after}; it is fixed when the model is compiled. Wrap the model again to "
                "use the new value."
            )
    _check_value(
        "loss_scaling",
        "",
        (old.loss_scaling, old.loss_scaling_is_constant),
        (new.loss_scaling, new.loss_scaling_is_constant),
    )
    _check_group(old.defaults, new.defaults, " of the optimizer's defaults")
    for i, (before, after) in enumerate(zip(old.groups, new.groups)):
        _check_group(before, after, f" of group {i}")


def _check_structure(old: OptimizerSnapshot, new: OptimizerSnapshot) -> None:
    if old.variant != new.variant:
        raise Error(
            f"Cannot change the optimizer's type after the model has been compiled: it was "
            f"compiled with {old.type_name} ({old.variant}) and the new optimizer is "
            f"{new.type_name} ({new.variant}). Wrap the model again with the new optimizer."
        )
    if [g.params for g in old.groups] != [g.params for g in new.groups]:
        raise Error(
            "Cannot change the optimizer's parameter groups after the model has been compiled: "
            f"it was compiled with {len(old.groups)} group(s) of sizes "
            f"{[len(g.params) for g in old.groups]} ({old.num_params} parameters) and the new "
            f"optimizer has {len(new.groups)} group(s) of sizes "
            f"{[len(g.params) for g in new.groups]} ({new.num_params} parameters), or holds "
            "other parameters. Build the new optimizer over the same parameter groups."
        )


def _check_group(old: GroupSnapshot, new: GroupSnapshot, where: str) -> None:
    for name, before in old.values.items():
        after = new.values[name]
        _check_value(name, where, (before, name in old.constant), (after, name in new.constant))


def _check_value(name: str, where: str, old: tuple[Any, bool], new: tuple[Any, bool]) -> None:
    (before, was_const), (after, is_const) = old, new
    fix = _HOW_TO_FIX.format(name=name)
    if was_const and not is_const:
        raise Error(
            f"{_CONSTANT_ERROR}: {name!r}{where} was constant ({before}) when the model was "
            f"compiled and is variable ({after}) in the new optimizer. {fix}"
        )
    if is_const and not was_const:
        raise Error(
            f"{_CONSTANT_ERROR}: {name!r}{where} was variable ({before}) when the model was "
            f"compiled and is constant ({after}) in the new optimizer; a variable attribute "
            f"cannot become constant. Pass {name!r} explicitly to the new optimizer's "
            "constructor, or call optimizer.variable_attrs.markAsVariable("
            f"{name!r}) before setOptimizer."
        )
    if was_const and before != after:
        raise Error(f"{_CONSTANT_ERROR}: {name!r}{where} changed from {before} to {after}. {fix}")
