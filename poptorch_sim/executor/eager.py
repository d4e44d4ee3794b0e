"""The single-IPU program: the device copy of the model run eagerly, one micro-batch at a time.

One call, as PopTorch defines it (reference §2.2):

    for d in range(DI):                  # device iterations
        for a in range(GA):              # gradient accumulation steps
            for r in range(R):           # replicas (identical weights, own inputs)
                out = model(micro_batch(d, a, r));  backward(final_loss · loss_scaling)
        reduce gradients over GA·R (Mean or Sum); optimizer step

Simulated: ``forward`` runs once per micro-batch, where an IPU replays a graph traced once;
Python side effects in ``forward`` therefore repeat (see tests/test_footguns.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..analysis.ops import OpCounter, OpTotals
from ..ipu_context import running_on_ipu
from ..logger import logger
from ..ops.blocks import recording_blocks
from ..ops.control import training_graph
from ..ops.overlap_graph import OverlapGraphChecks
from ..ops.printing import prints_suppressed
from ..runtime.rng import MicroBatchStream, rng_lock
from .fp_checks import FloatingPointChecks
from .inputs import BoundArgs
from .layout import Layout
from .losses import LossRecorder, final_loss
from .outputs import OutputCollector
from .refusals import PopTorchRefusals
from .replica_groups import GroupedVariable, grouped_variables
from .replica_threads import ReplicaThreads
from .replicas import ReplicaBuffers, buffer_versions, check_buffer_broadcast

__all__ = ["EagerProgram", "LossLocator"]


@dataclass(frozen=True)
class LossLocator:
    """Where the final loss is: output leaf ``leaf``, else the ``recorded``-th loss computed."""

    leaf: int | None
    recorded: int


class EagerProgram:
    """Runs calls of a model on its device copy.

    Args:
        model: the device copy (never the user's module).
        training: whether calls train.
        buffers: per-replica buffers (``broadcastBuffers(False)``), or ``None``.
    """

    def __init__(
        self,
        model: nn.Module,
        training: bool,
        buffers: ReplicaBuffers | None,
        broadcast_replicas: bool = False,
    ) -> None:
        self.model = model
        self.training = training
        self.buffers = buffers
        self.broadcast_replicas = broadcast_replicas
        self.loss: LossLocator | None = None
        self.blocks_seen = False
        self.out_spec: pytree.TreeSpec | None = None
        self.fp_checks = False  # Precision.enableFloatingPointExceptions (see fp_checks.py)
        self.draws_random = False  # forward consumed the CPU generator (found by ``prepare``)
        self.ops = OpTotals()  # what prepare's forward ran, for the time estimate
        self.replica_threads: ReplicaThreads | None = None
        self.grouped: list[GroupedVariable] = []  # replica-grouped parameters

    def prepare(self, mb: BoundArgs, check_unchanged: Callable[[], None]) -> None:
        """Compile-time checks on the first micro-batch, leaving no trace in the model.

        Finds the final loss (training), and raises PopTorch's errors for a missing or
        ambiguous loss, a reassigned buffer, or an in-place buffer update that replicas would
        have to broadcast. Buffers and the RNG are restored afterwards.
        """
        mb = mb.map_tensors(torch.clone)  # in-place edits of inputs must not happen twice
        saved = [b.detach().clone() for b in self.model.buffers()]
        with rng_lock():  # no model's stream is lent to torch's generator while this looks
            rng = torch.get_rng_state()
            before = buffer_versions(self.model)
            spotter = _BlockSpotter()
            overlap = OverlapGraphChecks(mb.tensors())
            counter = OpCounter()
            try:
                with (
                    torch.set_grad_enabled(self.training),
                    prints_suppressed(),
                    recording_blocks(spotter),
                    PopTorchRefusals(),
                    overlap,
                    counter,
                ):
                    if self.training:
                        leaves = self._first_forward(mb)
                    else:
                        leaves, _ = self.forward(mb, 0)
                overlap.check_outputs(leaves)
                self.ops = counter.totals
                self.blocks_seen = spotter.seen
                self.draws_random = not torch.equal(torch.get_rng_state(), rng)
                check_unchanged()
                if self.broadcast_replicas:
                    check_buffer_broadcast(self.model, before)
            finally:
                with torch.no_grad():
                    for buf, value in zip(self.model.buffers(), saved):
                        buf.copy_(value)
                torch.set_rng_state(rng)

    def forward(self, mb: BoundArgs, r: int) -> tuple[list[Any], torch.Tensor | None]:
        """Run one micro-batch of replica ``r``; return output leaves and the final loss."""
        if self.buffers is not None:
            self.buffers.activate(r)
        recorder = LossRecorder() if self.loss and self.loss.leaf is None else None
        checks = FloatingPointChecks() if self.fp_checks else contextlib.nullcontext()
        grouped = grouped_variables(self.grouped, self.model, r)
        with running_on_ipu(), training_graph(self.training), checks, grouped:
            if recorder is None:
                out = self.model(*mb.args, **mb.kwargs)
            else:
                with recorder:
                    out = self.model(*mb.args, **mb.kwargs)
        leaves, spec = pytree.tree_flatten(out)
        self.out_spec = spec
        if not self.training:
            return leaves, None
        assert self.loss is not None
        if self.loss.leaf is not None:
            return leaves, leaves[self.loss.leaf]
        assert recorder is not None
        return leaves, recorder.losses[self.loss.recorded]

    input_device = torch.device("cpu")  # the device copy stays on the host CPU

    def use_replica_threads(self, replicas: int) -> bool:
        """Run the replicas at the same time, one thread each, where that computes the same.

        See [Note: replicas on threads]. Returns whether they will.
        """
        refusal = self._replica_threads_refusal(replicas)
        if refusal is None:
            try:
                self.replica_threads = ReplicaThreads(
                    self.model,
                    replicas,
                    self.buffers,
                    self.loss.leaf if self.loss else None,
                    self.grouped,
                )
            except Exception as exc:  # a model that cannot be copied: the one-thread loop
                refusal = f"the model cannot be copied per replica ({type(exc).__name__}: {exc})"
        if refusal is not None:
            logger.debug(
                "poptorch_sim: %d replicas run one after the other: %s", replicas, refusal
            )
        return refusal is None

    def _replica_threads_refusal(self, replicas: int) -> str | None:
        if replicas < 2:
            return "one replica"
        if self.draws_random:
            return "forward draws random numbers"
        if self.fp_checks:
            return "floating-point exceptions are checked (on the caller's thread)"
        if self.buffers is None and any(True for _ in self.model.buffers()):
            return "the replicas share the model's buffers (broadcastBuffers)"
        if self.training and (self.loss is None or self.loss.leaf is None):
            return "the final loss is not one of forward's outputs"
        if any(
            p._backward_hooks or p._post_accumulate_grad_hooks for p in self.model.parameters()
        ):
            return "a parameter has gradient hooks"
        return None

    def close(self) -> None:
        """Stop the replica threads, if any."""
        if self.replica_threads is not None:
            self.replica_threads.close()
            self.replica_threads = None

    def run_micro_batch(
        self, mb: BoundArgs, r: int, stream: MicroBatchStream | None = None
    ) -> list[Any]:
        """Inference of one micro-batch (overlapped IO's compute phase): its output leaves;
        random ops draw from ``stream``."""
        with torch.no_grad(), self._drawing(stream):
            leaves, _ = self.forward(mb, r)
        return [_detach(t) for t in leaves]

    def _drawing(self, stream: MicroBatchStream | None) -> contextlib.AbstractContextManager[Any]:
        """Lend ``stream`` to torch's generator while a forward that draws runs."""
        if stream is None or not self.draws_random:
            return contextlib.nullcontext()
        return stream.drawing(self.input_device)

    def _first_forward(self, mb: BoundArgs) -> list[Any]:
        grouped = grouped_variables(self.grouped, self.model, 0)
        with running_on_ipu(), training_graph(), LossRecorder() as recorder, grouped:
            out = self.model(*mb.args, **mb.kwargs)
        leaves, self.out_spec = pytree.tree_flatten(out)
        k = final_loss(recorder.losses)
        loss = recorder.losses[k]
        if loss.grad_fn is None:
            logger.warning(NOTHING_TO_TRAIN)
        leaf = next((i for i, t in enumerate(leaves) if t is loss), None)
        self.loss = LossLocator(leaf, k)
        return leaves

    def run(
        self,
        bound: BoundArgs,
        layout: Layout,
        collector: OutputCollector,
        loss_scale: float,
        step: Callable[[], None] | None,
        streams: list[MicroBatchStream] | None = None,
    ) -> None:
        """Run one call: every micro-batch, and in training an optimizer ``step`` per iteration.

        ``streams``: one random stream per micro-batch of the call, in call order (See [Note: a
        random stream per model]); None draws from torch's generator.
        """
        draw = iter(streams) if streams is not None else None
        threads = self.replica_threads
        if threads is not None and not threads.current():
            threads.close()  # the parameters were replaced: copy the model again
            self.use_replica_threads(layout.replicas)
            threads = self.replica_threads
        for d in range(layout.device_iterations):
            if threads is not None:
                items = layout.step_micro_batches(bound, d)
                threads.run(items, self.training, loss_scale, collector.add)
                if step is not None:
                    step()
                continue
            for r, mb in layout.step_micro_batches(bound, d):
                drawing = self._drawing(next(draw) if draw is not None else None)
                if self.training:
                    with drawing:
                        leaves, loss = self.forward(mb, r)
                    _backward(loss, loss_scale)
                else:
                    with torch.no_grad(), drawing:
                        leaves, _ = self.forward(mb, r)
                collector.add([_detach(t) for t in leaves])
            if step is not None:
                step()


class _BlockSpotter:
    """A block recorder that only notes whether ``forward`` entered any block."""

    def __init__(self) -> None:
        self.seen = False
        self._auto = 0

    def begin_block(self, user_id: str | None, ipu_id: int | None) -> None:
        self.seen = True

    def end_block(self) -> None:
        pass

    def next_auto_id(self) -> str:
        self._auto += 1
        return str(self._auto - 1)

    def reset_auto_id(self) -> None:
        self._auto = 0


def _detach(t: Any) -> Any:
    return t.detach() if isinstance(t, torch.Tensor) else t


NOTHING_TO_TRAIN = (
    "The final loss does not depend on any parameter that requires grad, so training changes "
    "no weights (buffers such as BatchNorm statistics still update in train mode); if that is "
    "not what you meant, check that the loss is computed from the model's outputs"
)


def _backward(loss: torch.Tensor | None, loss_scale: float) -> None:
    if loss is None or loss.grad_fn is None:
        return  # a frozen model; see NOTHING_TO_TRAIN
    grad = torch.full_like(loss, loss_scale)
    loss.backward(grad)
