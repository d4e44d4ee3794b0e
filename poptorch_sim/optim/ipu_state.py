"""A device optimizer's state under PopART's tensor names (``ipu_state`` / ``ipu_param``).

PopTorch users read and write the device optimizer state through ``optimizer.state_dict()``
(see [Note: optimizer state on the device] in ``base.py``). The keys are PopART's tensor names:

=================  ==========================  ==============================================
kind               ``ipu_state`` (per param)   ``ipu_param`` (per param, ``___specific___``)
=================  ==========================  ==============================================
sgd                ``Accl1___`` (velocity,     ``scaledLearningRate0``, ``weightDecayScale-
                   only with momentum; zeros   Factor0``, ``momentum``, ``dampening``
                   before the first step)
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

Simulated: PopART's exact set of derived SGD tensors depends on its SGD variant; we always
report the two above. On import, state tensors are written exactly; direct hyper-parameters
(``learningRate``, ``beta1``, ...) set their group's value (the first parameter of the group
that has one wins); derived SGD values and ``lossScaling_FLOAT`` are read-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .snapshot import OptimizerSnapshot
from .variants import RMSpropTF

__all__ = ["export_state", "import_state"]

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
# PopART name -> group key, for the hyper-parameters stored as they are.
_PARAM_NAMES = {
    "sgd": {"momentum": "momentum", "dampening": "dampening"},
    "adam": {"learningRate": "lr", "weightDecay": "weight_decay", "eps": "eps"},
    "rmsprop": {
        "learningRate": "lr",
        "weightDecay": "weight_decay",
        "alpha": "alpha",
        "eps": "eps",
        "momentum": "momentum",
    },
}
_PARAM_NAMES["adamw"] = _PARAM_NAMES["adam"]
_PARAM_NAMES["lamb"] = {**_PARAM_NAMES["adam"], "maxWeightNorm": "max_weight_norm"}
_SPECIFIC = "___specific___"
LOSS_SCALING = "lossScaling_FLOAT"


def export_state(
    optimizer: torch.optim.Optimizer, snap: OptimizerSnapshot, names: Sequence[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Return ``(ipu_state, ipu_param)`` of a device optimizer under PopART's names.

    Parameters that have not been stepped yet report their initial state.

    Args:
        optimizer: the device optimizer (from ``device_optimizer(snap, params)``).
        snap: its snapshot (supplies the kind, indices and loss scaling).
        names: the model's parameter names, indexed like ``params`` (e.g. ``"lin.weight"``).

    Returns:
        Two dicts of detached CPU tensor copies.

    >>> ipu_state, ipu_param = export_state(device_opt, snap, [n for n, _ in model.named_parameters()])
    """
    ipu_state: dict[str, torch.Tensor] = {}
    ipu_param: dict[str, torch.Tensor] = {LOSS_SCALING: _scalar(snap.loss_scaling)}
    for group, group_snap in zip(optimizer.param_groups, snap.groups):
        for p, index in zip(group["params"], group_snap.params):
            name = names[index]
            state = optimizer.state.get(p) or _initial_state(optimizer, snap.kind, group, p)
            for key, prefix in _STATE_NAMES[snap.kind].items():
                if key in state:
                    ipu_state[prefix + name] = _copy(state[key])
            for popart, value in _hyperparameters(snap, group).items():
                ipu_param[popart + _SPECIFIC + name] = _scalar(value)
    return ipu_state, ipu_param


def import_state(
    optimizer: torch.optim.Optimizer,
    snap: OptimizerSnapshot,
    names: Sequence[str],
    ipu_state: dict[str, torch.Tensor] | None,
    ipu_param: dict[str, torch.Tensor] | None,
) -> None:
    """Write a (possibly partial) ``ipu_state``/``ipu_param`` into a device optimizer.

    Keys that are absent leave the device's value unchanged; unknown keys are ignored.

    Args:
        optimizer: the device optimizer.
        snap: its snapshot.
        names: the model's parameter names, indexed like ``params``.
        ipu_state, ipu_param: dicts as returned by ``export_state`` (None: nothing to write).

    >>> import_state(device_opt, snap, names, state["ipu_state"], state["ipu_param"])
    """
    ipu_state, ipu_param = ipu_state or {}, ipu_param or {}
    for group, group_snap in zip(optimizer.param_groups, snap.groups):
        written: set[str] = set()
        for p, index in zip(group["params"], group_snap.params):
            _import_param_state(optimizer, snap.kind, group, p, names[index], ipu_state)
            for popart, key in _PARAM_NAMES[snap.kind].items():
                value = ipu_param.get(popart + _SPECIFIC + names[index])
                if value is not None and key not in written:
                    group[key] = _merge(group[key], value)
                    written.add(key)
            _import_betas(group, names[index], ipu_param, written)


def _import_param_state(
    optimizer: torch.optim.Optimizer,
    kind: str,
    group: dict[str, Any],
    p: torch.Tensor,
    name: str,
    ipu_state: dict[str, torch.Tensor],
) -> None:
    found = {
        key: ipu_state[prefix + name]
        for key, prefix in _STATE_NAMES[kind].items()
        if prefix + name in ipu_state
    }
    if kind == "sgd" and p not in optimizer.state:
        # A zero velocity before the first step is the initial one: leave torch to seed it with
        # the first gradient (the same update when dampening is 0, the eager one otherwise).
        velocity = found.get("momentum_buffer")
        if velocity is not None and not bool(velocity.any()):
            del found["momentum_buffer"]
    if not found:
        return
    state = optimizer.state.get(p) or _initial_state(optimizer, kind, group, p)
    for key, value in found.items():
        if key == "step" and not isinstance(state.get(key), torch.Tensor):
            state[key] = int(value)
        elif key in state:
            state[key] = value.detach().to(state[key]).clone()
        else:
            state[key] = value.detach().to(device=p.device, dtype=p.dtype).clone()
    optimizer.state[p] = state


def _import_betas(
    group: dict[str, Any], name: str, ipu_param: dict[str, torch.Tensor], written: set[str]
) -> None:
    if "betas" not in group or "betas" in written:
        return
    beta1 = ipu_param.get("beta1" + _SPECIFIC + name)
    beta2 = ipu_param.get("beta2" + _SPECIFIC + name)
    if beta1 is None and beta2 is None:
        return
    old1, old2 = group["betas"]
    group["betas"] = (
        old1 if beta1 is None else _merge(old1, beta1),
        old2 if beta2 is None else _merge(old2, beta2),
    )
    written.add("betas")


def _hyperparameters(snap: OptimizerSnapshot, group: dict[str, Any]) -> dict[str, Any]:
    """The PopART hyper-parameter tensors of one parameter (its group's values)."""
    out = {popart: group[key] for popart, key in _PARAM_NAMES[snap.kind].items()}
    if snap.kind == "sgd":
        lr, dampening = group["lr"], group["dampening"]
        out["scaledLearningRate0"] = lr * (1 - dampening) / snap.loss_scaling
        out["weightDecayScaleFactor0"] = 1 - lr * (1 - dampening) * group["weight_decay"]
    if "betas" in group:
        out["beta1"], out["beta2"] = group["betas"]
    return out


def _initial_state(
    optimizer: torch.optim.Optimizer, kind: str, group: dict[str, Any], p: torch.Tensor
) -> dict[str, Any]:
    """The state the device optimizer would create at its first step, in its own format."""
    zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
    if kind == "sgd":
        # PopART allocates the velocity (zeros) at compile time when there is momentum; torch's
        # SGD creates it at its first step, seeded with the gradient (see _import_param_state).
        return {"momentum_buffer": zeros} if group["momentum"] != 0 else {}
    torch_step = isinstance(optimizer, (torch.optim.Adam, torch.optim.RMSprop))
    step: Any = torch.zeros((), dtype=torch.float32) if torch_step else 0
    if kind != "rmsprop":
        return {"step": step, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
    square_avg = torch.ones_like(zeros) if isinstance(optimizer, RMSpropTF) else zeros.clone()
    state = {"step": step, "square_avg": square_avg}
    if group["momentum"] > 0 or isinstance(optimizer, RMSpropTF):
        state["momentum_buffer"] = zeros.clone()
    if group["centered"] or isinstance(optimizer, RMSpropTF):
        state["grad_avg"] = zeros.clone()
    return state


def _merge(current: Any, value: torch.Tensor) -> Any:
    """The imported value, unless it is the current one rounded to float32 (keep full precision)."""
    if _scalar(current).item() == float(value):
        return current
    return float(value)


def _scalar(value: Any) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


def _copy(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return torch.tensor(float(value), dtype=torch.float32)
