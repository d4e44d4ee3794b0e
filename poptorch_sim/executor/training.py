"""The device side of training: gradient reduction, loss scaling, clipping and the optimizer step.

After the ``GA × R`` micro-batches of one device iteration each parameter's ``grad`` holds the
sum of its micro-batch gradients, each multiplied by the loss scaling. The step then

    grad ← grad / (loss_scaling · (GA·R if Mean else 1))
    clip the global gradient norm to max_grad_norm           (as torch.nn.utils.clip_grad_norm_)
    update with the snapshot's hyper-parameters              (frozen until setOptimizer)

all in one pass of the fused C++ kernels (``poptorch_sim.kernels.FusedOptimizer``), with the
optimizer state on chip or, per ``TensorLocations.setOptimizerLocation``, off chip and streamed
through a bounded staging buffer. Algorithms the kernels do not cover (RMSprop's TensorFlow
variant) run on a torch optimizer instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from ..enums import ReductionType
from ..kernels import FusedOptimizer
from ..kernels.optim import offload_stats
from ..optim.device import apply_hyperparameters, device_groups, device_optimizer
from ..optim.ipu_state import export_state, import_state
from ..optim.snapshot import OptimizerSnapshot
from ..profiling.trace import TraceRecorder

__all__ = ["DeviceTrainer"]


class DeviceTrainer:
    """Steps the device copy of a model with a snapshot of the user's optimizer.

    Args:
        snap: the optimizer's hyper-parameters, as taken at wrap time or by ``setOptimizer``.
        params: the device parameters, in the order of the user optimizer's parameters.
        names: parameter name of every device parameter, by ``id``.
        micro_batches_per_step: ``GA × R``.
        reduction: Mean or Sum over those micro-batches.
        off_chip: keep the optimizer state off chip, streamed in chunks during the update.
    """

    def __init__(
        self,
        snap: OptimizerSnapshot,
        params: list[nn.Parameter],
        names: dict[int, str],
        micro_batches_per_step: int,
        reduction: ReductionType,
        off_chip: bool = False,
    ) -> None:
        self.snapshot = snap
        self.params = params
        self.names = names
        self.param_names = [names[id(p)] for p in params]
        self._mean_over = micro_batches_per_step if reduction == ReductionType.Mean else 1
        self.fused = not (snap.kind == "rmsprop" and snap.use_tf_variant)
        if self.fused:
            self.optimizer = FusedOptimizer(
                snap.kind,
                self._fused_groups(snap),
                loss_scaling=self._unscale(snap),
                max_grad_norm=snap.max_grad_norm,
                accum_type=snap.accum_type,
                first_order_momentum_accum_type=snap.first_order_momentum_accum_type,
                second_order_momentum_accum_type=snap.second_order_momentum_accum_type,
                off_chip=off_chip,
            )
        else:
            self.optimizer = device_optimizer(snap, params)
        self.trace: TraceRecorder | None = None
        self.anchors: dict[str, torch.Tensor] = {}
        self.wanted: set[str] = set()
        self.steps = 0

    @property
    def loss_scaling(self) -> float:
        """The loss scaling of the current snapshot."""
        return float(self.snapshot.loss_scaling)

    def _unscale(self, snap: OptimizerSnapshot) -> float:
        # The Mean reduction's division is folded into the kernels' loss-scaling division.
        return float(snap.loss_scaling) * self._mean_over

    def _fused_groups(self, snap: OptimizerSnapshot) -> list[dict]:
        groups, _ = device_groups(snap, self.params)
        if snap.kind in ("adam", "adamw", "lamb"):
            for group in groups:
                group["bias_correction"] = snap.bias_correction
        return groups

    def apply(self, snap: OptimizerSnapshot) -> None:
        """``setOptimizer``: use the hyper-parameters of a new snapshot, keeping the state."""
        if self.fused:
            self.optimizer.set_hyperparameters(
                self._fused_groups(snap), loss_scaling=self._unscale(snap)
            )
        else:
            apply_hyperparameters(self.optimizer, snap)
        self.snapshot = snap

    def step(self) -> None:
        """Reduce, unscale, clip and apply the accumulated gradients, then clear them."""
        start = time.perf_counter_ns()
        before = offload_stats() if self.trace is not None else None
        if self.fused:
            self._record_gradients(1.0 / self._unscale(self.snapshot))
            self.optimizer.step()
        else:
            self._torch_step()
        if self.trace is not None and before is not None:
            self.trace.record(0, _step_name(before, offload_stats()), "step", start,
                              time.perf_counter_ns())  # fmt: skip
        self.steps += 1
        self._record("UpdatedVar___", lambda p: p.detach().clone())
        for p in self.params:
            p.grad = None

    def _torch_step(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        scale = 1.0 / self._unscale(self.snapshot)
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        self._record_gradients(1.0)
        if math.isfinite(self.snapshot.max_grad_norm):
            nn.utils.clip_grad_norm_(self.params, self.snapshot.max_grad_norm)
        self.optimizer.step()

    def _record_gradients(self, scale: float) -> None:
        self._record("Gradient___", lambda p: None if p.grad is None else p.grad * scale)

    def _record(
        self, prefix: str, value_of: Callable[[nn.Parameter], torch.Tensor | None]
    ) -> None:
        if not self.wanted:
            return
        for p in self.params:
            name = prefix + self.names[id(p)]
            if name in self.wanted:
                value = value_of(p)
                if value is not None:
                    self.anchors[name] = value


def _step_name(before: dict[str, int], after: dict[str, int]) -> str:
    chunks = after["chunks"] - before["chunks"]
    if not chunks:
        return "optimizer step"
    moved = (after["bytes_to_device"] - before["bytes_to_device"]) + (
        after["bytes_to_host"] - before["bytes_to_host"]
    )
    return f"optimizer step, state streamed off-chip: {chunks} chunks, {moved / 1e6:.1f} MB"


def read_state(trainer: DeviceTrainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The device optimizer's state and hyper-parameters under PopART's names."""
    return export_state(trainer.optimizer, trainer.snapshot, trainer.param_names)


def write_state(
    trainer: DeviceTrainer, ipu_state: dict[str, torch.Tensor], ipu_param: dict[str, torch.Tensor]
) -> None:
    """Load a state read by ``read_state`` (possibly saved from another run) into the device."""
    import_state(trainer.optimizer, trainer.snapshot, trainer.param_names, ipu_state, ipu_param)
