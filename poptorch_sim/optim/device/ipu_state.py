"""A device optimizer's state under PopART's tensor names (``ipu_state`` / ``ipu_param``).

PopTorch users read and write the device optimizer state through ``optimizer.state_dict()``
(see [Note: optimizer state on the device] in ``poptorch_sim/optim/base.py``). The keys are
PopART's tensor names:

=================  ==========================  ==============================================
kind               ``ipu_state`` (per param)   ``ipu_param`` (per param, ``___specific___``)
=================  ==========================  ==============================================
sgd                ``Accl1___`` (velocity,     ``scaledLearningRate0``, ``weightDecayScale-
                   see below; zeros before     Factor0``, ``momentum``, ``dampening``
                   the first step)
adam/adamw/lamb    ``Accl1___`` (m),           ``learningRate``, ``weightDecay``, ``beta1``,
                   ``Accl2___`` (v),           ``beta2``, ``eps`` (+ ``maxWeightNorm`` for
                   ``Step___``                 lamb)
rmsprop            ``Accl1___`` (mean square), ``learningRate``, ``weightDecay``, ``alpha``,
                   ``Accl2___`` (mean grad),   ``eps``, ``momentum``
                   ``Accl3___`` (momentum),
                   ``Step___``
=================  ==========================  ==============================================

plus the global ``lossScaling_FLOAT``. For SGD, ``scaledLearningRate0 = lr * (1 - dampening) /
loss_scaling`` and ``weightDecayScaleFactor0 = 1 - lr * (1 - dampening) * weight_decay``.

PopART keeps an SGD velocity (``Accl1___``) unless momentum is a *constant* 0 and there is no
gradient accumulation (its plain SGD variant); momentum marked variable keeps one even at 0
(``initial_state.py``). Each parameter's hyper-parameters: See [Note: per-parameter
hyper-parameters] (``ipu_param.py``).

An imported ``lossScaling_FLOAT`` scales the loss from the next run on (the caller applies the
value ``import_state`` returns) until ``setOptimizer``. PopART's SGD divides by the loss
scaling inside ``scaledLearningRate0``: written alone, the loss scaling leaves ``lr`` as it is;
written with a ``scaledLearningRate0``, that value is kept, as on the IPU, so the update per
unscaled gradient changes with the loss scaling.

Simulated: PopART's exact set of derived SGD tensors depends on its SGD variant; we always
report the two above, and an imported SGD value is turned back into ``lr`` / ``weight_decay``
(which read back as written, up to float32 rounding). Hyper-parameters that PopTorch compiles
in as constants are reported (and can be written) too. With momentum 0 the velocity reads
zeros (torch's SGD keeps none); an imported one is kept for when momentum becomes non-zero.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ...errors import Error
from ...logger import logger
from .initial_state import idle_velocities, initial_state, keeps_velocity
from .ipu_param import (
    BETA_NAMES,
    DERIVED_NAMES,
    LOSS_SCALING,
    PARAM_NAMES,
    SPECIFIC,
    hyperparameters,
    imported_hyperparameters,
    merge,
    scalar,
    split_groups,
)
from .snapshot import OptimizerSnapshot

__all__ = ["export_state", "idle_velocities", "import_state"]

_STATE_NAMES = {
    "sgd": {"momentum_buffer": "Accl1___"},
    "adam": {"exp_avg": "Accl1___", "exp_avg_sq": "Accl2___", "step": "Step___"},
    "rmsprop": {
        "square_avg": "Accl1___",
        "grad_avg": "Accl2___",
        "momentum_buffer": "Accl3___",
        "step": "Step___",
    },
}
_STATE_NAMES["adamw"] = _STATE_NAMES["lamb"] = _STATE_NAMES["adam"]


def export_state(
    optimizer: torch.optim.Optimizer,
    snap: OptimizerSnapshot,
    names: Sequence[str],
    *,
    gradient_accumulation: int = 1,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Return ``(ipu_state, ipu_param)`` of a device optimizer under PopART's names.

    Parameters that have not been stepped yet report their initial state; each parameter
    reports its own hyper-parameters (see [Note: per-parameter hyper-parameters]).

    Args:
        optimizer: the device optimizer (from ``device_optimizer(snap, params)``).
        snap: its snapshot (supplies the kind, indices and loss scaling).
        names: the model's parameter names, indexed like ``params`` (e.g. ``"lin.weight"``).
        gradient_accumulation: the model's ``gradientAccumulation`` (default 1); SGD keeps a
            velocity with more than one.

    Returns:
        Two dicts of detached CPU tensor copies.

    Raises:
        Error: the optimizer holds a different number of parameters than ``snap``.

    >>> ipu_state, ipu_param = export_state(device_opt, snap, [n for n, _ in model.named_parameters()])
    """
    ipu_state: dict[str, torch.Tensor] = {}
    ipu_param: dict[str, torch.Tensor] = {LOSS_SCALING: scalar(snap.loss_scaling)}
    for p, index, group_index, group in _device_params(optimizer, snap):
        name = names[index]
        velocity = keeps_velocity(snap, group_index, group, gradient_accumulation)
        state = optimizer.state.get(p) or initial_state(optimizer, snap.kind, group, p, velocity)
        for key, prefix in _STATE_NAMES[snap.kind].items():
            if key in state:
                ipu_state[prefix + name] = _copy(state[key])
        for popart, value in hyperparameters(snap.kind, group, snap.loss_scaling).items():
            ipu_param[popart + SPECIFIC + name] = scalar(value)
    return ipu_state, ipu_param


def import_state(
    optimizer: torch.optim.Optimizer,
    snap: OptimizerSnapshot,
    names: Sequence[str],
    ipu_state: dict[str, torch.Tensor] | None,
    ipu_param: dict[str, torch.Tensor] | None,
    *,
    gradient_accumulation: int = 1,
) -> float:
    """Write a (possibly partial) ``ipu_state``/``ipu_param`` into a device optimizer.

    Keys that are absent leave the device's value unchanged; unknown keys are ignored with a
    warning that names them. A hyper-parameter written for some parameters of a group and not
    others applies to those parameters only (see [Note: per-parameter hyper-parameters]).

    Args:
        optimizer: the device optimizer.
        snap: its snapshot.
        names: the model's parameter names, indexed like ``params``.
        ipu_state, ipu_param: dicts as returned by ``export_state`` (None: nothing to write).
        gradient_accumulation: as for ``export_state``.

    Returns:
        The loss scaling to use from now on: ``lossScaling_FLOAT`` if given, else
        ``snap.loss_scaling``. The caller applies it (it scales the loss, not the optimizer).

    Raises:
        Error: the optimizer holds a different number of parameters than ``snap``.

    >>> loss_scaling = import_state(device_opt, snap, names, state["ipu_state"], state["ipu_param"])
    """
    ipu_state, ipu_param = ipu_state or {}, ipu_param or {}
    loss_scaling = snap.loss_scaling
    if LOSS_SCALING in ipu_param:
        loss_scaling = merge(loss_scaling, ipu_param[LOSS_SCALING])
    rows = list(_device_params(optimizer, snap))
    changes = []
    for p, index, group_index, group in rows:
        name = names[index]
        velocity = keeps_velocity(snap, group_index, group, gradient_accumulation)
        _import_param_state(optimizer, snap.kind, group, p, name, ipu_state, velocity)
        changes.append(imported_hyperparameters(snap.kind, group, name, ipu_param, loss_scaling))
    split_groups(optimizer, changes)
    _report_unknown(snap.kind, [names[index] for _, index, _, _ in rows], ipu_state, ipu_param)
    return float(loss_scaling)


def _device_params(
    optimizer: torch.optim.Optimizer, snap: OptimizerSnapshot
) -> Iterator[tuple[torch.Tensor, int, int, dict[str, Any]]]:
    """Each device parameter with its index, its snapshot group and its device group.

    Splitting keeps the parameters' order (see [Note: per-parameter hyper-parameters]), so
    the device parameters in group order are the snapshot's indices in group order.
    """
    order = [(index, gi) for gi, g in enumerate(snap.groups) for index in g.params]
    flat = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    if len(order) != len(flat):
        raise Error(
            f"The device optimizer holds {len(flat)} parameters but its snapshot "
            f"{len(order)}: they were not made from each other."
        )
    for (p, group), (index, group_index) in zip(flat, order):
        yield p, index, group_index, group


def _report_unknown(
    kind: str,
    names: list[str],
    ipu_state: dict[str, torch.Tensor],
    ipu_param: dict[str, torch.Tensor],
) -> None:
    params = [*PARAM_NAMES[kind], *DERIVED_NAMES.get(kind, ())]
    if kind not in ("sgd", "rmsprop"):
        params += BETA_NAMES
    known = {LOSS_SCALING}
    known.update(prefix + n for prefix in _STATE_NAMES[kind].values() for n in names)
    known.update(popart + SPECIFIC + n for popart in params for n in names)
    unknown = sorted(k for k in (*ipu_state, *ipu_param) if k not in known)
    if unknown:
        logger.warning(
            "Ignoring %d optimizer state name(s) that this model's %s optimizer does not have: "
            "%s (names are PopART's, e.g. %s)",
            len(unknown), kind, ", ".join(unknown[:8]) + (", ..." if len(unknown) > 8 else ""),
            next(iter(sorted(known - {LOSS_SCALING})), LOSS_SCALING),
        )  # fmt: skip


def _import_param_state(
    optimizer: torch.optim.Optimizer,
    kind: str,
    group: dict[str, Any],
    p: torch.Tensor,
    name: str,
    ipu_state: dict[str, torch.Tensor],
    velocity: bool,
) -> None:
    found = {
        key: ipu_state[prefix + name]
        for key, prefix in _STATE_NAMES[kind].items()
        if prefix + name in ipu_state and (velocity or kind != "sgd")
    }
    if kind == "sgd" and p not in optimizer.state:
        # A zero velocity before the first step is the initial one: leave torch to seed it with
        # the first gradient (the same update when dampening is 0, the eager one otherwise).
        buffer = found.get("momentum_buffer")
        if buffer is not None and not bool(buffer.any()):
            del found["momentum_buffer"]
    if not found:
        return
    state = optimizer.state.get(p) or initial_state(optimizer, kind, group, p, velocity)
    for key, value in found.items():
        if key == "step" and not isinstance(state.get(key), torch.Tensor):
            state[key] = int(value)
        elif key in state:
            state[key] = value.detach().to(state[key]).clone()
        else:
            state[key] = value.detach().to(device=p.device, dtype=p.dtype).clone()
    optimizer.state[p] = state


def _copy(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return torch.tensor(float(value), dtype=torch.float32)
