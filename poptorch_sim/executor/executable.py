"""What compilation produced (``Executable``) and one call of it (``Executable.run``)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..enums import OutputMode
from ..logger import logger
from ..options import Options
from ..runtime import worker_memory
from ..runtime.dtypes import device_dtype
from ..runtime.io_tiles import IoTiles
from ..runtime.rng import ModelRng
from .anchors import AnchorCollector, anchors_of
from .eager import EagerProgram
from .host_buffers import OutputBuffers
from .inputs import BoundArgs
from .layout import Layout
from .outputs import OutputCollector
from .perf import PerfRecord
from .staged import StagedRunner
from .training import DeviceTrainer
from .weights import DeviceCopy

__all__ = ["DETACHED_INPUT", "Executable", "Program", "to_device_dtype", "to_traced_input"]

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
        anchored: the latest call's anchored tensors by short name (See [Note: anchored
            tensors follow their output mode] in anchors.py).
        rng: the model's random stream (See [Note: a random stream per model]).
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
    anchored: dict[str, torch.Tensor] = field(default_factory=dict)
    rng: ModelRng = field(default_factory=ModelRng)

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
        step = trainer.step if trainer else None
        anchors, model_tensors = None, {}
        if options.anchored_tensors:
            anchors = AnchorCollector(anchors_of(options, self.layout.device_iterations))
            wanted = anchors.long_names
            model_tensors = {n: t for n, _, t in self.device.pairs if n in wanted}
            if trainer is not None and step is not None:
                step = anchors.stepping(step, trainer.anchors, model_tensors)
        start = time.perf_counter()
        lay = self.layout
        streams = self.rng.streams(
            lay.device_iterations * lay.gradient_accumulation * lay.replicas
        )
        if self.io is not None:
            steps = [lay.step_micro_batches(bound, d) for d in range(lay.device_iterations)]
            micro = [(r, (mb, s)) for (r, mb), s in zip(itertools.chain(*steps), streams)]
            for leaves in self.io.run(micro):  # the IO threads convert dtypes as they load
                collector.add(leaves)
        else:
            self.program.run(
                bound.map_tensors(to_device_dtype),
                self.layout,
                collector,
                trainer.loss_scaling if trainer else 1.0,
                step,
                streams,
            )
        if trainer is not None:
            trainer.finish_run()
        if anchors is not None:
            if trainer is None:  # inference: the model's tensors, once per device iteration
                anchors.take({}, model_tensors, steps=lay.device_iterations)
            self.anchored.update(anchors.result())
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
    """An input as the device reads it: detached, IPU dtype."""
    if t.requires_grad:
        t = t.detach()
    return t.to(device_dtype(t.dtype))


def to_traced_input(t: torch.Tensor) -> torch.Tensor:
    """An input as compilation traces it: ``to_device_dtype``, with PopTorch's warning for each
    input that requires grad, at every compile (PopTorch's ``_preprocessGraph``)."""
    if t.requires_grad:
        logger.warning(DETACHED_INPUT)
    return to_device_dtype(t)
