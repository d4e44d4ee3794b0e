"""The multi-IPU program: a model cut into stages, run on IPU worker threads.

The compiler traces the device copy of the model on the first micro-batch and cuts it at its
blocks; the runtime then runs each device iteration's ``GA × R`` micro-batches through the
pipeline (or one at a time through the shards), and the executor steps the optimizer.

[Note: inference pipelines span device iterations]
Training must finish a device iteration's micro-batches before the optimizer steps, so each device
iteration is one pipeline run (fill, steady state, drain). Inference has no step: PopTorch's
forward-only pipeline streams every micro-batch of the call through the stages back to back, which
is why it asks for ``deviceIterations`` of at least the pipeline's depth. So an inference call is
*one* run over its ``deviceIterations × replicas`` micro-batches; run per device iteration, with
one micro-batch each, the stages would take turns and never overlap (``M + N - 1`` stage times
become ``M × N``).
"""

from __future__ import annotations

import atexit
import itertools
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..compiler import compile_program, describe
from ..compiler.signature import flatten_inputs
from ..ipu_context import running_on_ipu
from ..logger import logger
from ..memory.settings import recomputes
from ..profiling.trace import TraceRecorder
from ..profiling.utilisation import write_report
from ..program import StagedProgram
from ..runtime import PipelineRuntime
from .inputs import BoundArgs
from .layout import Layout
from .meta import meta_devices
from .outputs import OutputCollector

__all__ = ["StagedRunner"]

_serial = itertools.count()


class StagedRunner:
    """Runs calls of a model compiled into a ``StagedProgram``.

    Args:
        model: the device copy of the model (the stages share its parameters).
        options: the model's options (strategy, batching, profiling).
        first: the first micro-batch, used to trace ``forward``.
        training: whether calls train.
    """

    buffers = None  # per-replica buffers are not supported across stages
    stage_step: Callable[[int], None] | None = None  # See [Note: per-stage optimizer steps]

    def __init__(self, model: nn.Module, options: Any, first: BoundArgs, training: bool) -> None:
        with running_on_ipu():
            self.program: StagedProgram = compile_program(
                model, options, first.args, first.kwargs, training
            )
        # See [Note: pipeline recomputation] in runtime/stage.py.
        self.program.meta["recompute"] = recomputes(
            options, self.program.meta["mode"], training, self.program.stages
        )
        logger.info("poptorch_sim: %s", describe(self.program))
        self.training = training
        self.out_spec: pytree.TreeSpec = self.program.meta["out_spec"]
        self._constants: dict[int, Any] = self.program.meta["out_constants"]
        self._signature = self.program.meta["signature"]
        # each output's per-micro-batch shape and dtype, from the last inference call
        self._shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self.profile_dir: str | None = options.profile_dir
        self.trace = TraceRecorder() if self.profile_dir else None
        devices = meta_devices(model, [s.ipu for s in self.program.stages])
        self.runtime = PipelineRuntime(
            self.program, training=training, trace=self.trace, devices=devices
        )
        name = f"execution_trace_{'training' if training else 'inference'}_{next(_serial)}.json"
        finalizer = weakref.finalize(
            self, _close, self.runtime, self.trace, self.profile_dir, name
        )
        atexit.register(finalizer)
        self._finalizer = finalizer

    def prepare(self, mb: BoundArgs, check_unchanged: Callable[[], None]) -> None:
        """Compile-time checks happened while tracing; nothing more to do."""

    def close(self) -> None:
        """Join the worker threads and write the execution trace, if one was asked for."""
        self._finalizer()

    @property
    def input_device(self) -> torch.device:
        """Where the first stage computes (the target of overlapped IO's loads)."""
        return self.runtime.devices[self.program.stages[0].ipu]

    def run_micro_batch(self, mb: BoundArgs, r: int) -> list[Any]:
        """Inference of one micro-batch (overlapped IO's compute phase): its output leaves."""
        with torch.no_grad():
            values = self.runtime.run([self._inputs(mb)])[0]
        return self._leaves(values)

    def _inputs(self, mb: BoundArgs) -> dict[str, torch.Tensor]:
        tensors = flatten_inputs(self._signature, mb.args, mb.kwargs)
        return dict(zip(self.program.input_names, tensors))

    def _leaves(self, values: dict[str, torch.Tensor]) -> list[Any]:
        produced = iter(values[name] for name in self.program.output_names)
        return [
            self._constants[i] if i in self._constants else next(produced)
            for i in range(self.out_spec.num_leaves)
        ]

    def run(
        self,
        bound: BoundArgs,
        layout: Layout,
        collector: OutputCollector,
        loss_scale: float,
        step: Callable[[], None] | None,
    ) -> None:
        """Run one call: each device iteration's micro-batches through the pipeline, then step.

        See [Note: inference pipelines span device iterations].
        """
        if not self.training:
            inputs = [
                self._inputs(mb)
                for d in range(layout.device_iterations)
                for _, mb in layout.step_micro_batches(bound, d)
            ]
            into = self._destinations(len(inputs), collector)
            with torch.no_grad():
                results = self.runtime.run(inputs, into=into)
            if results:
                self._shapes = {n: (v.shape, v.dtype) for n, v in results[0].items()}
            self._collect(results, collector)
            return
        for d in range(layout.device_iterations):
            inputs = [self._inputs(mb) for _, mb in layout.step_micro_batches(bound, d)]
            results = self.runtime.run(inputs, loss_scale=loss_scale, step=self.stage_step)
            self._collect(results, collector)
            if step is not None:
                step()

    def _destinations(
        self, count: int, collector: OutputCollector
    ) -> list[dict[str, torch.Tensor]] | None:
        """Per micro-batch, the rows of the joined outputs the collector has ready, by output
        name (See [Note: outputs computed in place])."""
        into: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
        names = iter(self.program.output_names)
        for i in range(self.out_spec.num_leaves):
            if i in self._constants:
                continue
            name = next(names)
            if name not in self._shapes:
                continue
            rows = collector.reserve(i, *self._shapes[name], count)
            for values, part in zip(into, rows or ()):
                values[name] = part
        return into if any(into) else None

    def _collect(self, results: list[dict[str, torch.Tensor]], collector: OutputCollector) -> None:
        for values in results:
            collector.add(self._leaves(values))


def _close(
    runtime: PipelineRuntime, trace: TraceRecorder | None, directory: str | None, name: str
) -> None:
    runtime.close()
    if trace is not None and directory is not None and trace.events:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name)
        if any(e.track for e in trace.events):
            write_report(trace, path)  # overlapped IO: with its utilisation plot
        else:
            trace.write(path)
        print(trace.summary())
