"""A device optimizer's hyper-parameters under PopART's names: one ``___specific___`` value per
weight (``ipu_param``), read from and written to its groups.

[Note: per-parameter hyper-parameters]
Each ``___specific___`` value belongs to one weight, as in PopART. On import, a value that
differs from the others of its device group splits the group: the group's parameters are cut
into runs of consecutive parameters with the same imported values, each run a device group of
its own, so the order of the parameters over all groups never changes (it is how
``ipu_state._device_params`` finds each parameter's name and snapshot group). A value written to every
parameter of a group changes the group in place. ``restore_groups_`` (``torch_optimizer.py``)
joins the runs again when ``setOptimizer`` writes the snapshot's values to every parameter.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "BETA_NAMES",
    "DERIVED_NAMES",
    "LOSS_SCALING",
    "PARAM_NAMES",
    "SPECIFIC",
    "hyperparameters",
    "imported_hyperparameters",
    "merge",
    "same",
    "scalar",
    "split_groups",
]

# PopART name -> group key, for the hyper-parameters stored as they are.
PARAM_NAMES = {
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
PARAM_NAMES["adamw"] = PARAM_NAMES["adam"]
PARAM_NAMES["lamb"] = {**PARAM_NAMES["adam"], "maxWeightNorm": "max_weight_norm"}
# Names computed from the group's values (see hyperparameters).
DERIVED_NAMES = {"sgd": ("scaledLearningRate0", "weightDecayScaleFactor0")}
BETA_NAMES = ("beta1", "beta2")
SPECIFIC = "___specific___"
LOSS_SCALING = "lossScaling_FLOAT"


def hyperparameters(kind: str, group: dict[str, Any], loss_scaling: float) -> dict[str, Any]:
    """The PopART hyper-parameter tensors of one parameter (its device group's values)."""
    out = {popart: group[key] for popart, key in PARAM_NAMES[kind].items()}
    if kind == "sgd":
        lr, dampening = group["lr"], group["dampening"]
        out["scaledLearningRate0"] = lr * (1 - dampening) / loss_scaling
        out["weightDecayScaleFactor0"] = 1 - lr * (1 - dampening) * group["weight_decay"]
    if "betas" in group:
        out["beta1"], out["beta2"] = group["betas"]
    return out


def imported_hyperparameters(
    kind: str,
    group: dict[str, Any],
    name: str,
    ipu_param: dict[str, torch.Tensor],
    loss_scaling: float,
) -> dict[str, Any]:
    """The group values one parameter's imported ``___specific___`` values change."""

    def given(popart: str) -> torch.Tensor | None:
        return ipu_param.get(popart + SPECIFIC + name)

    new = {}
    for popart, key in PARAM_NAMES[kind].items():
        value = given(popart)
        if value is not None:
            new[key] = merge(group[key], value)
    if "betas" in group and any(given(b) is not None for b in BETA_NAMES):
        betas = [
            old if value is None else merge(old, value)
            for old, value in zip(group["betas"], map(given, BETA_NAMES))
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
    current = hyperparameters("sgd", values, loss_scaling)
    if scaled_lr is not None and not same(current["scaledLearningRate0"], scaled_lr):
        if undamped != 0:
            values["lr"] = new["lr"] = float(scaled_lr) * loss_scaling / undamped
            current = hyperparameters("sgd", values, loss_scaling)
    step = values["lr"] * undamped
    if decay_factor is not None and not same(current["weightDecayScaleFactor0"], decay_factor):
        if step != 0:
            new["weight_decay"] = (1 - float(decay_factor)) / step


def split_groups(optimizer: torch.optim.Optimizer, changes: list[dict[str, Any]]) -> None:
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


def merge(current: Any, value: torch.Tensor) -> Any:
    """The imported value, unless it is the current one rounded to float32 (keep full precision)."""
    return current if same(current, value) else float(value)


def same(current: Any, value: torch.Tensor) -> bool:
    """Whether an imported float32 ``value`` is ``current`` as exported."""
    return bool(scalar(current).item() == float(value))


def scalar(value: Any) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)
