"""The device side of training: gradient reduction, loss scaling, clipping and the optimizer step.

After the ``GA × R`` micro-batches of one device iteration each parameter's ``grad`` holds the
sum of its micro-batch gradients, each multiplied by the loss scaling. The step then

    grad ← grad / (loss_scaling · (GA·R if Mean else 1))     (one fused pass per tensor)
    clip the global gradient norm to max_grad_norm           (torch.nn.utils.clip_grad_norm_)
    update with the device optimizer built from the snapshot (hyper-parameters frozen until
                                                              setOptimizer)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..enums import ReductionType
from ..optim.device import apply_hyperparameters, device_optimizer
from ..optim.ipu_state import export_state, import_state
from ..optim.snapshot import OptimizerSnapshot

__all__ = ["DeviceTrainer"]


class DeviceTrainer:
    """Steps the device copy of a model with a snapshot of the user's optimizer.

    Args:
        snap: the optimizer's hyper-parameters, as taken at wrap time or by ``setOptimizer``.
        params: the device parameters, in the order of the user optimizer's parameters.
        names: parameter name of every device parameter, by ``id``.
        micro_batches_per_step: ``GA × R``.
        reduction: Mean or Sum over those micro-batches.
    """

    def __init__(
        self,
        snap: OptimizerSnapshot,
        params: list[nn.Parameter],
        names: dict[int, str],
        micro_batches_per_step: int,
        reduction: ReductionType,
    ) -> None:
        self.snapshot = snap
        self.params = params
        self.names = names
        self.param_names = [names[id(p)] for p in params]
        self.optimizer = device_optimizer(snap, params)
        self._mean_over = micro_batches_per_step if reduction == ReductionType.Mean else 1
        self.anchors: dict[str, torch.Tensor] = {}
        self.wanted: set[str] = set()
        self.steps = 0

    @property
    def loss_scaling(self) -> float:
        """The loss scaling of the current snapshot."""
        return float(self.snapshot.loss_scaling)

    def apply(self, snap: OptimizerSnapshot) -> None:
        """``setOptimizer``: use the hyper-parameters of a new snapshot, keeping the state."""
        apply_hyperparameters(self.optimizer, snap)
        self.snapshot = snap

    def step(self) -> None:
        """Reduce, unscale, clip and apply the accumulated gradients, then clear them."""
        grads = [p.grad for p in self.params if p.grad is not None]
        scale = 1.0 / (self.loss_scaling * self._mean_over)
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        if math.isfinite(self.snapshot.max_grad_norm):
            nn.utils.clip_grad_norm_(self.params, self.snapshot.max_grad_norm)
        self._record("Gradient___")
        self.optimizer.step()
        self.steps += 1
        self._record("UpdatedVar___")
        for p in self.params:
            p.grad = None

    def _record(self, prefix: str) -> None:
        if not self.wanted:
            return
        for p in self.params:
            name = prefix + self.names[id(p)]
            if name in self.wanted:
                value = p.grad if prefix == "Gradient___" else p
                if value is not None:
                    self.anchors[name] = value.detach().clone()


def read_state(trainer: DeviceTrainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The device optimizer's state and hyper-parameters under PopART's names."""
    return export_state(trainer.optimizer, trainer.snapshot, trainer.param_names)


def write_state(
    trainer: DeviceTrainer, ipu_state: dict[str, torch.Tensor], ipu_param: dict[str, torch.Tensor]
) -> None:
    """Load a state read by ``read_state`` (possibly saved from another run) into the device."""
    import_state(trainer.optimizer, trainer.snapshot, trainer.param_names, ipu_state, ipu_param)
