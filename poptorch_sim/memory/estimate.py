"""The memory model: weights, gradient accumulators, optimizer state and activations per IPU.

[Note: what each IPU holds]
For one replica, IPU ``i`` holds, in bytes:

=================  ============================================================================
weights            every parameter and buffer of the stages on ``i`` (a tensor shared by two
                   of its stages once)
gradients          an accumulator per trainable parameter, in the optimizer's ``accum_type``,
                   when gradient accumulation > 1; otherwise each gradient is consumed by the
                   update as it is produced (replicas reduce it in place) and none is kept,
                   as PopART's SGD2 and Adam decompositions do. SGD with
                   ``use_combined_accum=True`` (PopART's SGD1) keeps instead one combined
                   accumulator-and-velocity tensor per weight, in the weight's dtype, and no
                   optimizer state (PopTorch: ``setOptimizerLocation`` has no effect on it)
optimizer_state    per trainable parameter, the optimizer's state tensors in their dtypes
                   (SGD: the velocity in ``velocity_accum_type``, kept unless PopART runs plain
                   SGD, momentum a constant 0 without gradient accumulation: with separate
                   tensors (SGD2) even momentum 0 with accumulation keeps one, and so does the
                   simulator, see ``idle_velocities`` in ``optim/device/ipu_state.py``;
                   Adam/AdamW/LAMB: first and second moments and a float32 step; RMSprop:
                   mean square, momentum / mean gradient when used, step). Off chip (``useOnChipStorage(False)``): 0 on chip. RTS: each tensor
                   padded to a multiple of R and divided by R
activations        the peak, over the IPU's own action list in the schedule actually used, of
                   the bytes saved for backward by the micro-batches in flight: a forward adds
                   its stage's bytes per micro-batch, a backward releases them. With pipeline
                   recomputation a forward keeps only the stage's inputs and the values marked
                   with ``recomputationCheckpoint``, and a backward briefly holds one segment's
                   activations again (see [Note: recomputing one segment at a time])
allowance          10% of the limit, reserved for what the model cannot know: the program's
                   code, exchange buffers and temporaries (Poplar's "always-live" and
                   "not-always-live" memory). It is not measured, only stated
=================  ============================================================================

[Note: recomputing one segment at a time]
With recomputation, a stage's backward of one micro-batch runs its forward again from what the
forward kept: the inputs and each value marked with ``recomputationCheckpoint``. The marks cut
the stage into segments (inputs → mark 1 → mark 2 → ... → outputs). PopART schedules each
recomputed op just before the gradient ops that consume it, so an IPU recomputes and
differentiates the last segment, frees its activations, then the one before, and so on: the
transient on top of the kept values is the *largest segment's* saved bytes, not the stage's.
Graphcore's pipelined BERT marks every encoder layer's output, so a stage of 7 layers holds
one layer's activations in backward, not seven. BERT-Large at micro-batch 2, sequence 512,
FP16, as MLPerf ran it on [3, 7, 7, 7] (``benchmarks/published``): one layer saves 52 MiB
(without dropout on the attention probabilities, Graphcore's setting; 138 MiB with
transformers' defaults, attention dropout 0.1 and SDPA), so counting seven put the IPUs at
94-98% of their memory (about 160-175% with the defaults) where they hold 51-63% (60-72%).
Without marks the stage is one segment. The count is the same at compile (``SavedBytes.segments`` on the recomputation of the
stage's forward, ``activations.py``), in a measured run (``probe.py``) and in the placement
planner, whose candidate stages go through ``activation_peaks`` too (``placement.py``; a mark
between two candidate modules ends the segment of the one before it).
Simulated: the simulator recomputes every segment before differentiating any (one
``autograd.backward`` per stage and micro-batch), so for a short moment it holds them all; the
estimate and the probe count what an IPU holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..runtime.actions import ActionKind
from ..runtime.clock import Schedule
from .activations import StageActivations
from .report import IpuMemory
from .saved import storage_key, tensor_bytes
from .settings import MemorySettings

__all__ = [
    "ALLOWANCE_FRACTION",
    "activation_peaks",
    "optimizer_state_shapes",
    "ipu_memory",
]

ALLOWANCE_FRACTION = 0.10

_FLOAT32 = torch.float32


def _group_of(snapshot: Any, index: int) -> dict[str, Any]:
    for group in snapshot.groups:
        if index in group.params:
            return dict(group.values)
    return dict(snapshot.defaults.values)


def plain_sgd(snapshot: Any, index: int, gradient_accumulation: int) -> bool:
    """Whether PopART runs parameter ``index`` with plain SGD (SGD0): momentum a constant 0
    and no gradient accumulation, which keeps no velocity and no accumulator."""
    group = _group_of(snapshot, index)
    constant = any(index in g.params and "momentum" in g.constant for g in snapshot.groups)
    return float(group.get("momentum", 0.0)) == 0.0 and constant and gradient_accumulation == 1


def optimizer_state_shapes(
    snapshot: Any, index: int, numel: int, gradient_accumulation: int
) -> list[tuple[str, torch.dtype, int]]:
    """``(state name, dtype, elements)`` of the state the optimizer keeps for parameter ``index``.

    See [Note: what each IPU holds].
    """
    group = _group_of(snapshot, index)
    first = snapshot.first_order_momentum_accum_type
    second = snapshot.second_order_momentum_accum_type
    kind = snapshot.kind
    if kind == "sgd":
        if snapshot.use_combined_accum or plain_sgd(snapshot, index, gradient_accumulation):
            return []  # See [Note: what each IPU holds]: SGD1's combined tensor is a gradient
        return [("velocity", snapshot.velocity_accum_type, numel)]
    if kind in ("adam", "adamw", "lamb"):
        return [("first moment", first, numel), ("second moment", second, numel),
                ("step", _FLOAT32, 1)]  # fmt: skip
    if kind == "rmsprop":
        out = [("mean square", second, numel)]
        if float(group.get("momentum", 0.0)) > 0:
            out.append(("momentum", first, numel))
        if group.get("centered", False):
            out.append(("mean gradient", first, numel))
        return [*out, ("step", _FLOAT32, 1)]
    return []


def _on_chip_bytes(numel: int, dtype: torch.dtype, settings: MemorySettings) -> tuple[int, int]:
    """``(on chip, off chip)`` bytes of one optimizer state tensor of one replica."""
    size = torch.empty((), dtype=dtype).element_size()
    elements = numel
    if settings.rts and numel >= settings.min_elements_rts:
        elements = math.ceil(numel / settings.replicas)
    if settings.off_chip and numel >= settings.min_elements_off_chip:
        return 0, elements * size
    return elements * size, 0


def activation_peaks(
    schedule: Schedule, activations: Sequence[StageActivations], recompute: bool
) -> tuple[dict[int, int], dict[int, int]]:
    """Per IPU, the peak bytes saved for backward over its action list; per stage, the most
    micro-batches in flight. See [Note: what each IPU holds].
    """
    by_stage = {a.stage: a for a in activations}
    peaks: dict[int, int] = {}
    in_flight: dict[int, int] = {}
    for ipu, actions in enumerate(schedule.ipu_actions):
        live = peak = 0
        held: dict[int, int] = {}
        for action in actions:
            act = by_stage.get(action.stage)
            if act is None:
                continue
            kept = act.kept if recompute else act.saved
            if action.kind is ActionKind.F:
                live += kept
                held[action.stage] = held.get(action.stage, 0) + 1
                in_flight[action.stage] = max(in_flight.get(action.stage, 0), held[action.stage])
                peak = max(peak, live)
            elif action.kind is ActionKind.B:
                if recompute:
                    peak = max(peak, live + act.recompute_saved)
                live -= kept
                held[action.stage] -= 1
        peaks[ipu] = peak
    return peaks, in_flight


def ipu_memory(
    ipu: int,
    modules: Sequence[tuple[int, nn.Module]],
    settings: MemorySettings,
    optimizer: tuple[Any, dict[int, int]] | None,
    activations: tuple[int, dict[int, int], dict[int, int]],
    limit: int,
) -> IpuMemory:
    """What IPU ``ipu`` holds.

    Args:
        ipu: the IPU.
        modules: ``(stage, module)`` of the stages on it.
        settings: the memory options.
        optimizer: ``(snapshot, {id(param): index in the snapshot})``, or None (inference).
        activations: ``(peak bytes, per-stage bytes per micro-batch, per-stage in flight)``.
        limit: the IPU's memory in bytes.
    """
    seen: set[int] = set()
    weights = gradients = on_chip = off_chip = 0
    detail: dict[str, int] = {}
    accum = optimizer[0].accum_type if optimizer is not None else _FLOAT32
    accumulate = settings.gradient_accumulation > 1
    for _, module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            key = storage_key(t) if t.device.type != "meta" else id(t)
            if key in seen:
                continue
            seen.add(key)
            weights += tensor_bytes(t)
            if not (settings.training and isinstance(t, nn.Parameter) and t.requires_grad):
                continue
            index = None if optimizer is None else optimizer[1].get(id(t))
            combined = (
                optimizer is not None
                and optimizer[0].kind == "sgd"
                and (optimizer[0].use_combined_accum)
            )
            if combined and index is not None:
                if not plain_sgd(optimizer[0], index, settings.gradient_accumulation):
                    gradients += tensor_bytes(t)
            elif accumulate:
                gradients += t.numel() * torch.empty((), dtype=accum).element_size()
            if index is None:
                continue
            for name, dtype, numel in optimizer_state_shapes(
                optimizer[0], index, t.numel(), settings.gradient_accumulation
            ):
                on, off = _on_chip_bytes(numel, dtype, settings)
                on_chip, off_chip = on_chip + on, off_chip + off
                label = f"{name} ({str(dtype).replace('torch.', '')})"
                detail[label] = detail.get(label, 0) + on + off
    peak, per_mb, in_flight = activations
    return IpuMemory(
        ipu=ipu,
        stages=tuple(s for s, _ in modules),
        weights=weights,
        gradients=gradients,
        optimizer_state=on_chip,
        activations=peak,
        allowance=int(ALLOWANCE_FRACTION * limit),
        limit=limit,
        optimizer_state_off_chip=off_chip,
        optimizer_detail=detail,
        activations_per_micro_batch=per_mb,
        in_flight=in_flight,
    )
