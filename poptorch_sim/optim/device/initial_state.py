"""The optimizer state PopART holds before a parameter's first step: which SGD velocities it
keeps, and each kind's initial state in the device optimizer's own format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..variants import RMSpropTF
from .snapshot import OptimizerSnapshot

__all__ = ["idle_velocities", "initial_state", "keeps_velocity"]


def keeps_velocity(
    snap: OptimizerSnapshot, group_index: int, group: dict[str, Any], gradient_accumulation: int
) -> bool:
    """PopART's SGD keeps a velocity unless momentum is a constant 0 without accumulation."""
    if snap.kind != "sgd":
        return False
    constant = snap.is_constant("momentum", group_index)
    return group["momentum"] != 0 or not constant or gradient_accumulation > 1


def idle_velocities(
    snap: OptimizerSnapshot, params: Sequence[torch.Tensor], gradient_accumulation: int
) -> list[torch.Tensor]:
    """The parameters whose SGD velocity PopART keeps but an update at momentum 0 never reads.

    PopART's separate-tensor SGD (``use_combined_accum=False``) keeps a velocity per weight
    unless it runs plain SGD (``keeps_velocity``). At momentum 0 torch's update has none; the
    device holds one anyway (zeros), so that it holds what the IPU holds (``poptorch_sim.memory``
    measures it). Where momentum may later become non-zero, only with a constant dampening of
    0: the first step with momentum then computes the velocity torch's first step does.
    """
    if snap.kind != "sgd" or snap.use_combined_accum:
        return []
    idle = []
    for gi, group in enumerate(snap.groups):
        values = group.values
        if values["momentum"] != 0 or not keeps_velocity(snap, gi, values, gradient_accumulation):
            continue
        fixed = snap.is_constant("momentum", gi)
        if fixed or (values.get("dampening", 0) == 0 and snap.is_constant("dampening", gi)):
            idle += [params[i] for i in group.params]
    return idle


def initial_state(
    optimizer: torch.optim.Optimizer,
    kind: str,
    group: dict[str, Any],
    p: torch.Tensor,
    velocity: bool,
) -> dict[str, Any]:
    """The state the device optimizer would create at its first step, in its own format.

    ``velocity``: PopART keeps an SGD velocity for ``p`` (see ``keeps_velocity``).
    """
    zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
    if kind == "sgd":
        # PopART allocates the velocity (zeros) at compile time; torch's SGD creates it at its
        # first step, seeded with the gradient (see ipu_state._import_param_state).
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
