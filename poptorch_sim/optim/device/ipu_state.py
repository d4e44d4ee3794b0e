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
gradient accumulation (its plain SGD variant); momentum marked variable keeps one even at 0.

An imported ``lossScaling_FLOAT`` scales the loss from the next run on (the caller applies the
value ``import_state`` returns) until ``setOptimizer``. PopART's SGD divides by the loss
scaling inside ``scaledLearningRate0``: written alone, the loss scaling leaves ``lr`` as it is;
written with a ``scaledLearningRate0``, that value is kept, as on the IPU, so the update per
unscaled gradient changes with the loss scaling.

[Note: per-parameter hyper-parameters]
Each ``___specific___`` value belongs to one weight, as in PopART. On import, a value that
differs from the others of its device group splits the group: the group's parameters are cut
into runs of consecutive parameters with the same imported values, each run a device group of
its own, so the order of the parameters over all groups never changes (it is how
``_device_params`` finds each parameter's name and snapshot group). A value written to every
parameter of a group changes the group in place. ``restore_groups_`` (``torch_optimizer.py``)
joins the runs again when ``setOptimizer`` writes the snapshot's values to every parameter.

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
from ..variants import RMSpropTF
from .snapshot import OptimizerSnapshot

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
# Names computed from the group's values (see _hyperparameters).
_DERIVED_NAMES = {"sgd": ("scaledLearningRate0", "weightDecayScaleFactor0")}
_BETA_NAMES = ("beta1", "beta2")
_SPECIFIC = "___specific___"
LOSS_SCALING = "lossScaling_FLOAT"


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
    ipu_param: dict[str, torch.Tensor] = {LOSS_SCALING: _scalar(snap.loss_scaling)}
    for p, index, group_index, group in _device_params(optimizer, snap):
        name = names[index]
        velocity = _keeps_velocity(snap, group_index, group, gradient_accumulation)
        state = optimizer.state.get(p) or _initial_state(optimizer, snap.kind, group, p, velocity)
        for key, prefix in _STATE_NAMES[snap.kind].items():
            if key in state:
                ipu_state[prefix + name] = _copy(state[key])
        for popart, value in _hyperparameters(snap.kind, group, snap.loss_scaling).items():
            ipu_param[popart + _SPECIFIC + name] = _scalar(value)
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
        loss_scaling = _merge(loss_scaling, ipu_param[LOSS_SCALING])
    rows = list(_device_params(optimizer, snap))
    changes = []
    for p, index, group_index, group in rows:
        name = names[index]
        velocity = _keeps_velocity(snap, group_index, group, gradient_accumulation)
        _import_param_state(optimizer, snap.kind, group, p, name, ipu_state, velocity)
        changes.append(_imported_hyperparameters(snap.kind, group, name, ipu_param, loss_scaling))
    _split_groups(optimizer, changes)
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


def _keeps_velocity(
    snap: OptimizerSnapshot, group_index: int, group: dict[str, Any], gradient_accumulation: int
) -> bool:
    """PopART's SGD keeps a velocity unless momentum is a constant 0 without accumulation."""
    if snap.kind != "sgd":
        return False
    constant = snap.is_constant("momentum", group_index)
    return group["momentum"] != 0 or not constant or gradient_accumulation > 1


def _imported_hyperparameters(
    kind: str,
    group: dict[str, Any],
    name: str,
    ipu_param: dict[str, torch.Tensor],
    loss_scaling: float,
) -> dict[str, Any]:
    """The group values one parameter's imported ``___specific___`` values change."""

    def given(popart: str) -> torch.Tensor | None:
        return ipu_param.get(popart + _SPECIFIC + name)

    new = {}
    for popart, key in _PARAM_NAMES[kind].items():
        value = given(popart)
        if value is not None:
            new[key] = _merge(group[key], value)
    if "betas" in group and any(given(b) is not None for b in _BETA_NAMES):
        betas = [
            old if value is None else _merge(old, value)
            for old, value in zip(group["betas"], map(given, _BETA_NAMES))
        ]
        new["betas"] = tuple(betas)
    if kind == "sgd":
        _import_sgd_derived(group, new, given("scaledLearningRate0"),
                            given("weightDecayScaleFactor0"), loss_scaling)  # fmt: skip
    return {k: v for k, v in new.items() if v != (tuple(group[k]) if k == "betas" else group[k])}


def _import_sgd_derived(
    group: dict[str, Any],
    new: dict[str, Any],
    scaled_lr: torch.Tensor | None,
    decay_factor: torch.Tensor | None,
    loss_scaling: float,
) -> None:
    """Turn imported ``scaledLearningRate0`` / ``weightDecayScaleFactor0`` into lr / decay."""
    values = {**group, **new}
    undamped = 1 - values["dampening"]
    current = _hyperparameters("sgd", values, loss_scaling)
    if scaled_lr is not None and not _same(current["scaledLearningRate0"], scaled_lr):
        if undamped != 0:
            values["lr"] = new["lr"] = float(scaled_lr) * loss_scaling / undamped
            current = _hyperparameters("sgd", values, loss_scaling)
    step = values["lr"] * undamped
    if decay_factor is not None and not _same(current["weightDecayScaleFactor0"], decay_factor):
        if step != 0:
            new["weight_decay"] = (1 - float(decay_factor)) / step


def _split_groups(optimizer: torch.optim.Optimizer, changes: list[dict[str, Any]]) -> None:
    """Give each parameter its imported values (see [Note: per-parameter hyper-parameters])."""
    if not any(changes):
        return
    groups: list[dict[str, Any]] = []
    start = 0
    for group in optimizer.param_groups:
        params = group["params"]
        mine = changes[start : start + len(params)]
        start += len(params)
        runs: list[tuple[list[torch.Tensor], dict[str, Any]]] = []
        for p, change in zip(params, mine):
            if runs and runs[-1][1] == change:
                runs[-1][0].append(p)
            else:
                runs.append(([p], change))
        if len(runs) <= 1:
            group.update(runs[0][1] if runs else {})
            groups.append(group)
        else:
            groups.extend({**group, **change, "params": ps} for ps, change in runs)
    optimizer.param_groups[:] = groups


def _report_unknown(
    kind: str,
    names: list[str],
    ipu_state: dict[str, torch.Tensor],
    ipu_param: dict[str, torch.Tensor],
) -> None:
    params = [*_PARAM_NAMES[kind], *_DERIVED_NAMES.get(kind, ())]
    if kind not in ("sgd", "rmsprop"):
        params += _BETA_NAMES
    known = {LOSS_SCALING}
    known.update(prefix + n for prefix in _STATE_NAMES[kind].values() for n in names)
    known.update(popart + _SPECIFIC + n for popart in params for n in names)
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
    state = optimizer.state.get(p) or _initial_state(optimizer, kind, group, p, velocity)
    for key, value in found.items():
        if key == "step" and not isinstance(state.get(key), torch.Tensor):
            state[key] = int(value)
        elif key in state:
            state[key] = value.detach().to(state[key]).clone()
        else:
            state[key] = value.detach().to(device=p.device, dtype=p.dtype).clone()
    optimizer.state[p] = state


def _hyperparameters(kind: str, group: dict[str, Any], loss_scaling: float) -> dict[str, Any]:
    """The PopART hyper-parameter tensors of one parameter (its device group's values)."""
    out = {popart: group[key] for popart, key in _PARAM_NAMES[kind].items()}
    if kind == "sgd":
        lr, dampening = group["lr"], group["dampening"]
        out["scaledLearningRate0"] = lr * (1 - dampening) / loss_scaling
        out["weightDecayScaleFactor0"] = 1 - lr * (1 - dampening) * group["weight_decay"]
    if "betas" in group:
        out["beta1"], out["beta2"] = group["betas"]
    return out


def _initial_state(
    optimizer: torch.optim.Optimizer,
    kind: str,
    group: dict[str, Any],
    p: torch.Tensor,
    velocity: bool,
) -> dict[str, Any]:
    """The state the device optimizer would create at its first step, in its own format.

    ``velocity``: PopART keeps an SGD velocity for ``p`` (see ``_keeps_velocity``).
    """
    zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
    if kind == "sgd":
        # PopART allocates the velocity (zeros) at compile time; torch's SGD creates it at its
        # first step, seeded with the gradient (see _import_param_state).
        return {"momentum_buffer": zeros} if velocity else {}
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
    return current if _same(current, value) else float(value)


def _same(current: Any, value: torch.Tensor) -> bool:
    """Whether an imported float32 ``value`` is ``current`` as exported."""
    return bool(_scalar(current).item() == float(value))


def _scalar(value: Any) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


def _copy(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return torch.tensor(float(value), dtype=torch.float32)
