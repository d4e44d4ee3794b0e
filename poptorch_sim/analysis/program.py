"""``ProgramAnalysis``: the stages, IPUs, activations and ops of a compiled program, made once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..executor.replica_groups import grouped_variables
from ..memory.activations import StageActivations, model_activations, stage_activations

__all__ = ["ProgramAnalysis", "analyse_program"]


@dataclass(frozen=True)
class ProgramAnalysis:
    """What a compiled program is, as both estimates need it.

    Attributes:
        stages: ``(stage, ipu, module)`` in pipeline order (one entry for a single-IPU program).
        activations: per stage, what one micro-batch saves and what its forward ran (``ops``).
        mode: ``"pipelined"``, ``"sharded"``, ``"phased"`` or ``"single IPU"``.
        schedule_name: the runtime's schedule (``"1f1b"``, ``"sharded"`` ...).
        recompute: whether the simulator's stages recompute (None: read from the options).
        training: whether the program trains.
        host_input_bytes: bytes of one micro-batch's inputs from the host.
        micro_batch_size: samples in a micro-batch (the first input's batch dimension).
        seconds: how long the analysis took.
    """

    stages: list[tuple[int, int, nn.Module]]
    activations: list[StageActivations]
    mode: str
    schedule_name: str
    recompute: bool | None
    training: bool
    host_input_bytes: int
    micro_batch_size: int = 1
    seconds: float = 0.0

    @property
    def ipus(self) -> list[int]:
        """The IPUs of one replica, in order."""
        return sorted({ipu for _, ipu, _ in self.stages})


def analyse_program(program: Any, first: Any, training: bool) -> ProgramAnalysis:
    """Analyse a freshly compiled program (runs each stage's forward once on fake tensors).

    Args:
        program: the executor's ``StagedRunner`` or ``EagerProgram``.
        first: the first micro-batch (``BoundArgs``, in device dtypes).
        training: whether the model trains.
    """
    start = time.perf_counter()
    staged = getattr(program, "program", None)
    leaves = pytree.tree_leaves((first.args, first.kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    host = sum(t.numel() * t.element_size() for t in tensors)
    batch = next((t.shape[0] for t in tensors if t.dim() > 0), 1)
    if staged is not None:
        stages = [(s.index, s.ipu, s.module) for s in staged.stages]
        inputs = program._inputs(first)
        if not training:  # a forward that edits its inputs in place must not reach the caller's
            memo: dict[int, torch.Tensor] = {}
            inputs = {k: memo.setdefault(id(v), v.clone()) if isinstance(v, torch.Tensor) else v
                      for k, v in inputs.items()}  # fmt: skip
        acts = stage_activations(staged.stages, inputs, training)
        mode = staged.meta.get("mode", "pipelined")
        schedule_name = program.runtime.schedule_name
        recompute = staged.meta.get("recompute")
    else:
        stages = [(0, 0, program.model)]
        if training:
            # replica-grouped weights: a replica computes with one group's value
            with grouped_variables(getattr(program, "grouped", []), program.model, 0):
                acts = [model_activations(program.model, first.args, first.kwargs, training)]
        else:  # the forward the program ran at prepare: a model's Python runs once at compile
            acts = [StageActivations(0, 0, 0, host, "inference", ops=program.ops)]
        mode, schedule_name, recompute = "single IPU", "sharded", None
    return ProgramAnalysis(
        stages, acts, mode, schedule_name, recompute, training, host, int(batch),
        time.perf_counter() - start,
    )  # fmt: skip
