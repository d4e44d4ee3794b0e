"""The device side of training: gradient reduction, loss scaling, clipping and the optimizer step.

After the ``GA × R`` micro-batches of one device iteration each parameter's ``grad`` holds the
sum of its micro-batch gradients, each multiplied by the loss scaling. The step then

    grad ← grad / (loss_scaling · (GA·R if Mean else 1))
    clip the global gradient norm to max_grad_norm           (as torch.nn.utils.clip_grad_norm_)
    update with the snapshot's hyper-parameters              (frozen until setOptimizer)

all in one pass of the fused kernels (``FusedOptimizer``, :mod:`.fused`: the C++ tile
kernels for CPU parameters, their generic torch implementations for CUDA ones), with the
optimizer state on chip or, per ``TensorLocations.setOptimizerLocation``, off chip (host memory)
and streamed through the device in bounded chunks. Algorithms the kernels do not cover
(RMSprop's TensorFlow variant) run on a torch optimizer instead.

[Note: per-stage optimizer steps]
In a pipelined or sharded model each IPU updates its own weights: the parameters that only stage
``s`` uses are stepped on stage ``s``'s worker right after its last backward (the schedule's
``STEP`` action), while upstream stages are still draining, and the trace shows the step on that
IPU's track. The caller then steps whatever still holds a gradient (parameters shared by several
stages, which must wait for all of them). The update of each parameter is the same as one global
step's; only global gradient clipping (``max_grad_norm``) needs every stage's gradients first, so
with it, and with the torch fallback, the whole step runs on the caller after the pipeline drains.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from ...distributed import GradientReducer
from ...enums import ReductionType
from ...kernels import offload_stats
from ...logger import logger
from ...profiling.trace import TraceRecorder
from ...program import StagedProgram
from .fused import FusedOptimizer
from .ipu_state import export_state, idle_velocities, import_state
from .loss_scaling import FACTOR_NAME, FINAL_NAME, AutomaticLossScaling
from .snapshot import OptimizerSnapshot
from .torch_optimizer import (
    apply_hyperparameters,
    device_groups,
    device_optimizer,
    restore_groups_,
)

__all__ = ["DeviceTrainer", "read_state", "write_state"]


class DeviceTrainer:
    """Steps the device copy of a model with a snapshot of the user's optimizer.

    Args:
        snap: the optimizer's hyper-parameters, as taken at wrap time or by ``setOptimizer``.
        params: the device parameters, in the order of the user optimizer's parameters.
        names: parameter name of every device parameter, by ``id``.
        micro_batches_per_step: ``GA × R``.
        reduction: Mean or Sum over those micro-batches.
        off_chip: keep the optimizer state off chip, streamed in chunks during the update.
        reducer: sums the gradients over the processes before each step (None: one process;
            see [Note: replicas across processes] in ``distributed/allreduce.py``).
        gradient_accumulation: the model's ``gradientAccumulation`` (PopART's SGD keeps a
            velocity with more than one; see :mod:`.ipu_state`).
    """

    def __init__(
        self,
        snap: OptimizerSnapshot,
        params: list[nn.Parameter],
        names: dict[int, str],
        micro_batches_per_step: int,
        reduction: ReductionType,
        off_chip: bool = False,
        reducer: GradientReducer | None = None,
        gradient_accumulation: int = 1,
        automatic_loss_scaling: AutomaticLossScaling | None = None,
    ) -> None:
        self.snapshot = snap
        self.als = automatic_loss_scaling
        self.gradient_accumulation = gradient_accumulation
        self.reducer = reducer
        # Mean divides by the global count of micro-batches: GA x replicas x processes.
        micro_batches_per_step *= reducer.world_size if reducer is not None else 1
        self.params = params
        self.names = names
        self.param_names = [names[id(p)] for p in params]
        self.groups_of: dict[str, int] = {}  # replica-grouped weights: name → group count
        self._log_groups(snap)
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
            for p in idle_velocities(snap, params, gradient_accumulation):
                self.optimizer.state.setdefault(p, {})["momentum_buffer"] = self.optimizer._zeros(
                    p, 0
                )
        else:
            self.optimizer = device_optimizer(snap, params)
        self.trace: TraceRecorder | None = None
        self.anchors: dict[str, torch.Tensor] = {}
        self.wanted: set[str] = set()
        self.steps = 0
        self._stage_params: dict[
            int, tuple[list[nn.Parameter], int]
        ] = {}  # stage -> (params, ipu)
        self._lock = threading.Lock()  # stage steps of several workers share the optimizer

    @property
    def loss_scaling(self) -> float:
        """The loss scaling of the current snapshot."""
        return float(self.snapshot.loss_scaling) * self._als_factor()

    def _als_factor(self) -> float:
        return self.als.factor if self.als is not None else 1.0

    def _unscale(self, snap: OptimizerSnapshot) -> float:
        # The Mean reduction's division is folded into the kernels' loss-scaling division.
        return float(snap.loss_scaling) * self._als_factor() * self._mean_over

    def _fused_groups(self, snap: OptimizerSnapshot) -> list[dict]:
        groups, _ = device_groups(snap, self.params)
        if snap.kind in ("adam", "adamw", "lamb"):
            for group in groups:
                group["bias_correction"] = snap.bias_correction
        return groups

    def apply(self, snap: OptimizerSnapshot) -> None:
        """``setOptimizer``: use the hyper-parameters of a new snapshot, keeping the state.

        Values imported for single parameters (``load_state_dict``) are replaced by the
        snapshot's, as PopTorch's ``setOptimizer`` writes every value.
        """
        self._log_groups(snap)
        restore_groups_(self.optimizer, snap)
        if self.fused:
            self.optimizer.set_hyperparameters(
                self._fused_groups(snap), loss_scaling=self._unscale(snap)
            )
        else:
            apply_hyperparameters(self.optimizer, snap)
        self.snapshot = snap

    def _log_groups(self, snap: OptimizerSnapshot) -> None:
        """PopTorch's debug line for each group's hyper-parameters written to the device."""
        for i, group in enumerate(snap.groups):
            values = ", ".join(f"{k}={v}" for k, v in group.values.items())
            names = [self.param_names[j] for j in group.params]
            logger.debug(
                "Updating group %d optimizer with %s for (tensors affected %s)", i, values, names
            )

    def finish_run(self) -> None:
        """End of a call: automatic loss scaling's new factor applies from the next one."""
        if self.als is not None and self.als.finish_run():
            self._rescale()

    def set_loss_scale_factor(self, factor: float) -> None:
        """Write automatic loss scaling's ``lossScaleUpdateFactor`` (``ipu_state``)."""
        if self.als is not None:
            self.als.factor = float(factor)
            self._rescale()

    def _rescale(self) -> None:
        if self.fused:
            self.optimizer.loss_scaling = self._unscale(self.snapshot)

    def use_loss_scaling(self, loss_scaling: float) -> None:
        """Scale the loss by ``loss_scaling`` (an imported ``lossScaling_FLOAT``) from now on.

        The next ``setOptimizer`` takes the optimizer's own loss scaling again.
        """
        self.snapshot = dataclasses.replace(self.snapshot, loss_scaling=loss_scaling)
        if self.fused:
            self.optimizer.loss_scaling = self._unscale(self.snapshot)

    def stage_steps(self, program: StagedProgram) -> Callable[[int], None] | None:
        """The per-stage step to run on the workers of ``program``, or None where it cannot.

        See [Note: per-stage optimizer steps].
        """
        if not self.fused or self.reducer is not None or self.als is not None:
            return None
        users: dict[int, set[int]] = {}
        for spec in program.stages:
            for p in spec.module.parameters():
                users.setdefault(id(p), set()).add(spec.index)
        self._stage_params = {
            spec.index: ([p for p in self.params if users.get(id(p)) == {spec.index}], spec.ipu)
            for spec in program.stages
        }
        return self.step_stage if any(ps for ps, _ in self._stage_params.values()) else None

    def step_stage(self, stage: int) -> None:
        """Step the parameters only ``stage`` uses (on its worker, after its last backward).

        Does nothing while the snapshot clips the global gradient norm: ``step`` does it all.
        """
        params, ipu = self._stage_params[stage]
        if params and not math.isfinite(self.snapshot.max_grad_norm):
            self._apply(params, ipu)

    def step(self) -> None:
        """Reduce, unscale, clip and apply the accumulated gradients, then clear them.

        Parameters that a stage step already updated hold no gradient any more and are skipped.
        """
        if self.reducer is not None:
            start = time.perf_counter_ns()
            self.reducer.all_reduce(self.params)
            if self.trace is not None:
                name = f"all-reduce over {self.reducer.world_size} processes"
                self.trace.record(0, name, "step", start, time.perf_counter_ns())
        if self.als is not None:
            self.als.observe([p.grad for p in self.params])
            if FINAL_NAME in self.wanted:
                self.anchors[FINAL_NAME] = torch.tensor(self.loss_scaling, dtype=torch.float32)
        self._apply(self.params, 0)
        self.steps += 1
        self._record("UpdatedVar___", lambda p: p.detach().clone())

    def _apply(self, params: list[nn.Parameter], ipu: int) -> None:
        """One update of ``params`` (those with a gradient), then clear their gradients."""
        if all(p.grad is None for p in params):
            return  # e.g. the caller's step after the stage steps did everything
        with self._lock:
            start = time.perf_counter_ns()
            before = offload_stats() if self.trace is not None else None
            if self.fused:
                self._record_gradients(1.0 / self._unscale(self.snapshot), params)
                chosen = {id(p) for p in params}
                flat = [p for g in self.optimizer.param_groups for p in g["params"]]
                self.optimizer.step([p.grad if id(p) in chosen else None for p in flat])
            else:
                self._torch_step()
            if self.trace is not None and before is not None:
                self.trace.record(ipu, _step_name(before, offload_stats()), "step", start,
                                  time.perf_counter_ns())  # fmt: skip
            for p in params:
                p.grad = None

    def _torch_step(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        scale = 1.0 / self._unscale(self.snapshot)
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        self._record_gradients(1.0, self.params)
        if math.isfinite(self.snapshot.max_grad_norm):
            nn.utils.clip_grad_norm_(self.params, self.snapshot.max_grad_norm)
        self.optimizer.step()

    def _record_gradients(self, scale: float, params: list[nn.Parameter]) -> None:
        self._record("Gradient___", lambda p: None if p.grad is None else p.grad * scale, params)

    def _record(
        self,
        prefix: str,
        value_of: Callable[[nn.Parameter], torch.Tensor | None],
        params: list[nn.Parameter] | None = None,
    ) -> None:
        if not self.wanted:
            return
        for p in self.params if params is None else params:
            name = prefix + self.names[id(p)]
            if name in self.wanted:
                value = value_of(p)
                if value is not None:
                    # Anchors are host tensors, as PopTorch streams them (no-op on the CPU).
                    self.anchors[name] = value.to("cpu")


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
    logger.info("Writing optimiser state tensors from IPU to host.")  # PopTorch's line
    ipu_state, ipu_param = export_state(
        trainer.optimizer,
        trainer.snapshot,
        trainer.param_names,
        gradient_accumulation=trainer.gradient_accumulation,
    )
    if trainer.als is not None:
        ipu_state[FACTOR_NAME] = torch.tensor(trainer.als.factor, dtype=torch.float32)
    for name, value in ipu_state.items():  # a grouped weight's step count: one per group
        groups = trainer.groups_of.get(name.split("___", 1)[-1])
        if groups is not None and value.dim() == 0:
            ipu_state[name] = value.expand(groups).clone()
    return ipu_state, ipu_param


def write_state(
    trainer: DeviceTrainer, ipu_state: dict[str, torch.Tensor], ipu_param: dict[str, torch.Tensor]
) -> None:
    """Load a state read by ``read_state`` (possibly saved from another run) into the device."""
    logger.info("Writing optimiser state tensors from host to IPU memory.")  # PopTorch's line
    if FACTOR_NAME in ipu_state:
        ipu_state = dict(ipu_state)
        trainer.set_loss_scale_factor(float(ipu_state.pop(FACTOR_NAME)))
    if trainer.groups_of:  # a grouped weight's per-group step counts: the device keeps one
        current, _ = export_state(
            trainer.optimizer,
            trainer.snapshot,
            trainer.param_names,
            gradient_accumulation=trainer.gradient_accumulation,
        )
        ipu_state = {
            k: v[0] if k in current and current[k].dim() == 0 and v.dim() == 1 else v
            for k, v in ipu_state.items()
        }
    loss_scaling = import_state(
        trainer.optimizer,
        trainer.snapshot,
        trainer.param_names,
        ipu_state,
        ipu_param,
        gradient_accumulation=trainer.gradient_accumulation,
    )
    if loss_scaling != trainer.snapshot.loss_scaling:
        trainer.use_loss_scaling(loss_scaling)
