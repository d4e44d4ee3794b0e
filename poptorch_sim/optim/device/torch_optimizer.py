"""A snapshot's device param groups, and the plain torch optimizer built from them.

The torch optimizer runs the algorithms the fused kernels do not cover; ``device_groups`` and
``restore_groups_`` serve ``FusedOptimizer`` (:mod:`.fused`) too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import Error
from ..lamb import LAMB
from ..variants import AdamWNoBias, RMSpropTF
from .snapshot import OptimizerSnapshot

__all__ = [
    "device_groups",
    "device_optimizer",
    "apply_hyperparameters",
    "prepare_gradients_",
    "restore_groups_",
]

# The hyper-parameters each device optimizer takes (velocity_scaling changes no numbers).
_DEVICE_KEYS = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
    "adam": ("lr", "betas", "eps", "weight_decay"),
    "adamw": ("lr", "betas", "eps", "weight_decay"),
    "rmsprop": ("lr", "momentum", "weight_decay", "alpha", "eps", "centered"),
    "lamb": ("lr", "weight_decay", "betas", "eps", "max_weight_norm"),
}


def device_optimizer(
    snap: OptimizerSnapshot, params: Sequence[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """Build the optimizer that updates the device copies of the parameters.

    The result is a plain torch optimizer (``foreach=False``) whose groups hold
    ``params[i]`` for the snapshot's indices, with the snapshot's hyper-parameters: torch's
    SGD / Adam / AdamW / RMSprop, ``LAMB``, or, where torch has no such variant,
    ``AdamWNoBias`` / ``RMSpropTF``. Its ``step()`` expects gradients already reduced, divided
    by the loss scaling and clipped: see ``prepare_gradients_``.

    Simulated: ``maximize``, ``foreach``, ``fused`` and the accumulation dtypes of the user's
    optimizer are not carried over, as PopTorch's device optimizers ignore them too.

    Args:
        snap: the hyper-parameters.
        params: the tensors the snapshot's group indices refer to (device copies).

    Returns:
        A torch optimizer over ``params``.

    Raises:
        Error: ``params`` is shorter than the snapshot's largest index.

    >>> opt = device_optimizer(snapshot(user_opt, host_params), device_params)
    """
    groups, defaults = device_groups(snap, params)
    return _construct(snap, groups, defaults)


def device_groups(
    snap: OptimizerSnapshot, params: Sequence[torch.nn.Parameter]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The param groups (``params[i]`` for the snapshot's indices) and defaults of ``snap``.

    Raises:
        Error: ``params`` is shorter than the snapshot's largest index.
    """
    highest = max((max(g.params) for g in snap.groups if g.params), default=-1)
    if highest >= len(params):
        raise Error(
            f"The optimizer snapshot refers to parameter index {highest} but only "
            f"{len(params)} device parameters were given."
        )
    keys = _DEVICE_KEYS[snap.kind]
    groups = [
        {"params": [params[i] for i in g.params], **{k: g.values[k] for k in keys}}
        for g in snap.groups
    ]
    return groups, {k: snap.defaults.values[k] for k in keys}


def _construct(
    snap: OptimizerSnapshot, groups: list[dict[str, Any]], defaults: dict[str, Any]
) -> torch.optim.Optimizer:
    kind = snap.kind
    if kind == "sgd":
        return torch.optim.SGD(groups, **defaults, foreach=False)
    if kind == "adam":
        return torch.optim.Adam(groups, **defaults, foreach=False)
    if kind == "adamw":
        if snap.bias_correction:
            return torch.optim.AdamW(groups, **defaults, foreach=False)
        return AdamWNoBias(groups, **defaults)
    if kind == "rmsprop":
        if snap.use_tf_variant:
            return RMSpropTF(groups, **defaults)
        return torch.optim.RMSprop(groups, **defaults, foreach=False)
    return LAMB(groups, **defaults, bias_correction=snap.bias_correction)


def apply_hyperparameters(optimizer: torch.optim.Optimizer, snap: OptimizerSnapshot) -> None:
    """Write ``snap``'s hyper-parameters into a device optimizer, keeping its state.

    Call it after ``check_update`` accepted ``snap`` (``setOptimizer`` on a compiled model).

    Args:
        optimizer: an optimizer made by ``device_optimizer`` from a snapshot of the same kind.
        snap: the new hyper-parameters.

    Raises:
        Error: the number of groups differs.

    >>> apply_hyperparameters(device_opt, new_snap)
    """
    if len(optimizer.param_groups) != len(snap.groups):
        raise Error(
            f"Cannot apply an optimizer snapshot with {len(snap.groups)} group(s) to a device "
            f"optimizer with {len(optimizer.param_groups)} group(s)."
        )
    keys = _DEVICE_KEYS[snap.kind]
    for group, new in zip(optimizer.param_groups, snap.groups):
        group.update({k: new.values[k] for k in keys})
    optimizer.defaults.update({k: snap.defaults.values[k] for k in keys})


def restore_groups_(optimizer: Any, snap: OptimizerSnapshot) -> None:
    """Make the device groups the snapshot's again, undoing ``import_state``'s splits.

    ``import_state`` gives a parameter its own imported hyper-parameters by splitting its group
    into runs of parameters, keeping their order (see [Note: per-parameter hyper-parameters] in
    ``ipu_state.py``). ``setOptimizer`` writes every value again, so it joins the runs first;
    their hyper-parameters are then overwritten by ``apply_hyperparameters`` (or
    ``FusedOptimizer.set_hyperparameters``).

    Args:
        optimizer: a device optimizer (torch's or a ``FusedOptimizer``) made from a snapshot
            with the same groups as ``snap``.
        snap: the snapshot whose groups to restore.

    >>> restore_groups_(device_opt, new_snap); apply_hyperparameters(device_opt, new_snap)
    """
    if len(optimizer.param_groups) == len(snap.groups):
        return
    flat = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    groups, start = [], 0
    for g in snap.groups:
        run = flat[start : start + len(g.params)]
        start += len(g.params)
        template = run[0][1] if run else optimizer.param_groups[0]
        groups.append({**template, "params": [p for p, _ in run]})
    optimizer.param_groups[:] = groups


@torch.no_grad()
def prepare_gradients_(params: Sequence[torch.Tensor], snap: OptimizerSnapshot) -> None:
    """Undo the loss scaling on ``params``' gradients and clip them to ``max_grad_norm``.

    PopTorch multiplies the loss by ``loss_scaling`` before the backward pass and divides the
    (reduced) gradients by it before the update; ``max_grad_norm`` then clips the global norm
    of all gradients, as ``torch.nn.utils.clip_grad_norm_`` does. All of a model's parameters
    must be passed together so that the norm is global.

    Args:
        params: the parameters whose ``.grad`` will be used by the update.
        snap: supplies ``loss_scaling`` and ``max_grad_norm``.

    >>> prepare_gradients_(device_params, snap); device_opt.step()
    """
    grads = [p.grad for p in params if p.grad is not None]
    if snap.loss_scaling != 1.0:
        for grad in grads:
            grad.div_(snap.loss_scaling)
    if math.isfinite(snap.max_grad_norm) and grads:
        torch.nn.utils.clip_grad_norm_(
            [p for p in params if p.grad is not None], snap.max_grad_norm, foreach=False
        )
