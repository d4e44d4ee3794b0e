"""What compilation produced (``Executable``) and one call of it (``Executable.run``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..enums import OutputMode
from ..logger import warning_once
from ..options import Options
from ..runtime import worker_memory
from ..runtime.dtypes import device_dtype
from ..runtime.io_tiles import IoTiles
from .eager import EagerProgram
from .host_buffers import OutputBuffers
from .inputs import BoundArgs
from .layout import Layout
from .outputs import OutputCollector
from .perf import PerfRecord
from .staged import StagedRunner
from .training import DeviceTrainer
from .weights import DeviceCopy

__all__ = ["DETACHED_INPUT", "Executable", "Program", "to_device_dtype"]

Program = EagerProgram | StagedRunner

# PopTorch's wording.
DETACHED_INPUT = (
    "Input tensor has requires_grad=True set. This tensor will be detached because backward "
    "pass via inputs is not supported."
)


@dataclass(eq=False)
class Executable:
    """What compilation produced.

    Attributes:
        inputs: the inputs it was compiled for (later calls must match them).
        layout: how a call's host batch splits into micro-batches.
        device: the device copy of the weights.
        program: one eager program, or a staged program on IPU worker threads.
        trainer: the device side of training (None for inference).
        io: overlapped IO's threads (inference with IO tiles), else None.
        memory: the memory estimate made at compile time (``poptorch_sim.memory_report``).
        timing: the time estimate made at compile time (``poptorch_sim.time_report``).
        analysis: the program's analysis both estimates read (``analysis/program.py``).
        host_outputs: the joined outputs' memory, reused across calls (See [Note: output
            buffers are reused]).
    """

    inputs: BoundArgs
    layout: Layout
    device: DeviceCopy
    program: Program
    trainer: DeviceTrainer | None
    io: IoTiles | None = None
    memory: Any = None
    timing: Any = None
    analysis: Any = None
    host_outputs: OutputBuffers = field(default_factory=OutputBuffers)

    def run(self, bound: BoundArgs, options: Options) -> tuple[Any, PerfRecord]:
        """One call: every micro-batch of ``bound`` through the program (and optimizer steps).

        ``bound`` must have passed ``check_batch(bound, self.layout)``.

        Returns:
            The outputs, shaped as ``forward``'s and joined per ``Options.outputMode``, and the
            call's performance record.
        """
        with worker_memory.pooled():  # as the IPU workers: See [Note: worker memory]
            return self._run(bound, options)

    def _run(self, bound: BoundArgs, options: Options) -> tuple[Any, PerfRecord]:
        collector = OutputCollector(
            OutputMode(options.output_mode),
            options.output_return_period,
            self.layout,
            self.host_outputs,
        )
        trainer = self.trainer
        start = time.perf_counter()
        if self.io is not None:
            if any(t.requires_grad for t in bound.tensors()):
                warning_once(DETACHED_INPUT)
            lay = self.layout
            micro = [
                mb for d in range(lay.device_iterations) for mb in lay.step_micro_batches(bound, d)
            ]
            for leaves in self.io.run(micro):  # the IO threads convert dtypes as they load
                collector.add(leaves)
        else:
            self.program.run(
                bound.map_tensors(to_device_dtype),
                self.layout,
                collector,
                trainer.loss_scaling if trainer else 1.0,
                trainer.step if trainer else None,
            )
        if trainer is not None:
            trainer.finish_run()
        perf = PerfRecord(
            start=start,
            collected=tuple(collector.times),
            num_inputs=sum(1 for _ in bound.tensors()),
            num_outputs=collector.num_outputs,
            mode=OutputMode(options.output_mode).name,
            period=options.output_return_period,
            gradient_accumulation=self.layout.gradient_accumulation,
            replicas=self.layout.replicas,
            synthetic=bool(options._Popart.options.get("syntheticDataMode", 0)),
        )
        leaves = collector.result()
        spec = self.program.out_spec
        return (None if spec is None else pytree.tree_unflatten(leaves, spec)), perf

    def close(self) -> None:
        """Stop the IO threads and the program's worker threads; let go of kept outputs and of
        the worker memory's idle blocks."""
        self.host_outputs.clear()
        if self.io is not None:
            self.io.close()
        self.program.close()
        worker_memory.trim()


def to_device_dtype(t: torch.Tensor) -> torch.Tensor:
    """An input as the device reads it: detached (with PopTorch's warning), IPU dtype."""
    if t.requires_grad:
        warning_once(DETACHED_INPUT)
        t = t.detach()
    return t.to(device_dtype(t.dtype))
