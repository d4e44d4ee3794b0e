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
from ..errors import Error
from ..optim.device import (
    AutomaticLossScaling,
    DeviceTrainer,
    OptimizerSnapshot,
    apply_mean_reduction_strategy,
    check_update,
    read_state,
    snapshot,
    write_state,
)

__all__ = ["DeviceTrainer", "OptimizerMixin"]

_ALS_ENABLED = "automaticLossScalingSettings.enabled"


class OptimizerMixin:
    """The optimizer side of ``PoplarExecutor``: snapshots, ``setOptimizer``, device state.

    See [Note: optimizer state on the device] in ``poptorch_sim/optim/base.py``.
    """

    _options: Any
    _optimizer: Any
    _snapshot: OptimizerSnapshot | None
    _executable: Any
    _training: bool

    def _build_trainer(self, device: Any, layout: Any) -> DeviceTrainer:
        assert self._optimizer is not None and self._snapshot is not None
        host_to_device = {id(h): d for _, h, d in device.pairs}
        names = {id(d): n for n, _, d in device.pairs}
        host_params = [p for g in self._optimizer.param_groups for p in g["params"]]
        offline = self._options.connection_type == ConnectionType.Never
        popart = self._options._Popart.options
        trainer = DeviceTrainer(
            self._snapshot,
            [host_to_device[id(p)] for p in host_params],
            names,
            layout.gradient_accumulation * layout.replicas,
            self._options.Training.accumulation_and_replication_reduction_type,
            off_chip=self._options.optimizer_off_chip,
            reducer=None if offline else reducer_for(self._options),  # see _compile
            gradient_accumulation=layout.gradient_accumulation,
            automatic_loss_scaling=(
                AutomaticLossScaling(popart) if popart.get(_ALS_ENABLED) else None
            ),
        )
        trainer.wanted = {v[0] for v in self._options.anchored_tensors.values()}
        return trainer

    def _take_snapshot(
        self, optimizer: torch.optim.Optimizer, previous: OptimizerSnapshot | None = None
    ) -> OptimizerSnapshot:
        apply_mean_reduction_strategy(optimizer, self._options, compiled=previous is not None)
        return snapshot(
            optimizer,
            previous=previous,
            relax_checks=self._options._relax_optimizer_attributes_checks,
        )

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use ``optimizer``'s current hyper-parameters (and state, if loaded) from now on.

        Raises:
            Error: after compilation, a constant hyper-parameter changed.
        """
        if not self._training:
            raise Error("setOptimizer() can only be called on a trainingModel")
        compiled = self._executable is not None
        new = self._take_snapshot(optimizer, self._snapshot if compiled else None)
        if compiled and self._snapshot is not None:
            check_update(self._snapshot, new)
        self._snapshot = new
        old = self._optimizer
        if old is not optimizer and hasattr(old, "_set_state_reader"):
            if self._executable is not None:
                old.state_dict()
            old._set_state_reader(None)
        self._optimizer = optimizer
        if self._executable is not None and self._executable.trainer is not None:
            self._executable.trainer.apply(self._snapshot)
            self._connect_optimizer_state()

    def _connect_optimizer_state(self) -> None:
        exe = self._executable
        opt = self._optimizer
        if exe is None or exe.trainer is None or not hasattr(opt, "_set_state_reader"):
            return
        if self._options.connection_type == ConnectionType.Never:
            return  # offline target: there is no device to read a state from
        trainer = exe.trainer
        opt._set_state_reader(lambda: read_state(trainer))
        if opt.ipu_state_is_dirty and opt.has_state():
            state = opt.get_state_dict()
            write_state(trainer, state["ipu_state"], state["ipu_param"])
            opt.ipu_state_is_dirty = False
        elif not opt.has_state():
            opt._set_ipu_state(*read_state(trainer))
