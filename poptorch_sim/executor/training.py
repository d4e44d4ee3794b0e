"""The executor's optimizer side: ``setOptimizer``, and the device trainer built from the options.

The device optimizer itself (snapshots, the fused step, gradient reduction and loss scaling,
state on and off chip, PopART's state names) is :mod:`poptorch_sim.optim.device`; this module
only wires it to a ``PoplarExecutor``: it takes the snapshots, builds the ``DeviceTrainer`` from
the model's options and connects the user optimizer's ``state_dict()`` to the device state.
"""

from __future__ import annotations

from typing import Any

import torch

from ..distributed import reducer_for
from ..enums import ConnectionType
from ..optim.device import (
    AutomaticLossScaling,
    DeviceTrainer,
    OptimizerSnapshot,
    apply_mean_reduction_strategy,
    read_state,
    snapshot,
    write_state,
)

__all__ = ["DeviceTrainer", "build_trainer", "connect_state", "take_snapshot"]

_ALS_ENABLED = "automaticLossScalingSettings.enabled"


def build_trainer(
    options: Any, optimizer: Any, snap: OptimizerSnapshot, device: Any, layout: Any
) -> DeviceTrainer:
    """The device trainer of a freshly compiled executable.

    Args:
        options: the model's (frozen) options.
        optimizer: the user's optimizer (its groups say which parameters it steps).
        snap: the optimizer's latest snapshot.
        device: the executable's device copy (``DeviceCopy``); layout: its batch layout.
    """
    host_to_device = {id(h): d for _, h, d in device.pairs}
    names = {id(d): n for n, _, d in device.pairs}
    host_params = [p for g in optimizer.param_groups for p in g["params"]]
    offline = options.connection_type == ConnectionType.Never
    popart = options._Popart.options
    trainer = DeviceTrainer(
        snap,
        [host_to_device[id(p)] for p in host_params],
        names,
        layout.gradient_accumulation * layout.replicas,
        options.Training.accumulation_and_replication_reduction_type,
        off_chip=options.optimizer_off_chip,
        reducer=None if offline else reducer_for(options),  # see _compile
        gradient_accumulation=layout.gradient_accumulation,
        automatic_loss_scaling=(
            AutomaticLossScaling(popart) if popart.get(_ALS_ENABLED) else None
        ),
    )
    trainer.wanted = {v[0] for v in options.anchored_tensors.values()}
    return trainer


def take_snapshot(
    options: Any,
    optimizer: torch.optim.Optimizer,
    previous: OptimizerSnapshot | None = None,
    reported: set[str] | None = None,
) -> OptimizerSnapshot:
    """A snapshot of ``optimizer`` under the model's options (``previous``: the one it
    replaces after compilation; ``reported``: the unexpected-attribute messages given)."""
    apply_mean_reduction_strategy(optimizer, options, compiled=previous is not None)
    return snapshot(
        optimizer,
        previous=previous,
        relax_checks=options._relax_optimizer_attributes_checks,
        reported=reported,
    )


def connect_state(options: Any, optimizer: Any, executable: Any) -> None:
    """Read and write ``optimizer``'s state (a ``poptorch.optim`` one) through
    ``executable.trainer``: a state loaded into it goes to the device, else the device's
    state becomes its ``state_dict()``."""
    if executable is None or executable.trainer is None:
        return
    if not hasattr(optimizer, "_set_state_reader"):
        return
    if options.connection_type == ConnectionType.Never:
        return  # offline target: there is no device to read a state from
    trainer = executable.trainer
    optimizer._set_state_reader(lambda: read_state(trainer))
    if optimizer.ipu_state_is_dirty and optimizer.has_state():
        state = optimizer.get_state_dict()
        write_state(trainer, state["ipu_state"], state["ipu_param"])
        optimizer.ipu_state_is_dirty = False
    elif not optimizer.has_state():
        optimizer._set_ipu_state(*read_state(trainer))
