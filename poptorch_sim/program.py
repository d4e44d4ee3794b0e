"""The staged program: what the compiler produces and the runtime executes.

The compiler (``poptorch_sim.compiler``) turns ``nn.Module + Options`` into a ``StagedProgram``;
the runtime (``poptorch_sim.runtime``) runs one on IPU worker threads. Neither imports the other:
this record is their only contract.

Values flow between stages by name. The program's inputs are the flattened tensor inputs of
``forward`` (names ``input_names``); each stage consumes named values (program inputs or outputs
of earlier stages, in any earlier stage: a tensor may skip stages) and produces named values.

    program inputs ──► stage 0 (IPU 0) ──► stage 1 (IPU 1) ──► ... ──► output values
                 └──────────────── skip connection ─────────────►┘
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["StageSpec", "StagedProgram"]


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage.

    Attributes:
        index: position of the stage in the forward pipeline (0 = first).
        ipu: the IPU (worker) that runs it; stages need not follow increasing IPU order.
        module: called as ``module(*values_of(inputs))``; returns a tuple with one value per name
            in ``outputs`` (always a tuple, even for one output). Its parameters live on ``ipu``.
        inputs: names of the values it consumes.
        outputs: names of the values it produces that a later stage or the program output needs.
        blocks: the user block ids placed in this stage (for messages and printing).
    """

    index: int
    ipu: int
    module: nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    blocks: tuple[str, ...] = ()

    def __repr__(self) -> str:
        blocks = ",".join(self.blocks) or "-"
        return (
            f"StageSpec(stage={self.index}, ipu={self.ipu}, blocks={blocks}, "
            f"in={list(self.inputs)}, out={list(self.outputs)})"
        )


@dataclass
class StagedProgram:
    """A model cut into stages.

    Attributes:
        stages: in forward pipeline order.
        input_names: names of the program's tensor inputs, in flattened-argument order.
        output_names: names of the values that make up the model's output leaves, in order
            (the executor rebuilds the user's output structure from them).
        loss_name: name of the final loss value (training), or ``None`` (inference).
        sharded: True for ``ShardedExecution`` (one micro-batch at a time through the IPUs),
            False for ``PipelinedExecution``.
        meta: free-form facts the compiler wants to report (e.g. the block → stage → IPU map).
    """

    stages: list[StageSpec]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    loss_name: str | None = None
    sharded: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_ipus(self) -> int:
        """How many IPUs the program uses (highest IPU id + 1)."""
        return max(stage.ipu for stage in self.stages) + 1

    def parameters_of(self, index: int) -> list[torch.nn.Parameter]:
        """The trainable parameters stage ``index`` owns."""
        return [p for p in self.stages[index].module.parameters() if p.requires_grad]
