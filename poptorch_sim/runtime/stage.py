"""One stage's forward and backward on one micro-batch, with autograd cut at its boundaries.

[Note: stage boundaries cut autograd]
A value received from another stage becomes a fresh leaf (``detach().requires_grad_()``), so each
stage owns a separate autograd graph per micro-batch. Backward of stage ``s`` on micro-batch ``m``
seeds its outputs with the gradients its consumers sent back (plus ``loss_scale`` on the loss),
runs ``torch.autograd.backward`` on that graph only, and hands the leaves' ``.grad`` upstream.
That is what lets forward and backward of different micro-batches run at the same time on
different worker threads. Parameter gradients accumulate (sum) into ``p.grad`` over the
micro-batches, exactly as repeated ``loss.backward()`` calls do eagerly; the caller scales.
Simulated: a stage whose first op modifies a received activation in place fails ("a leaf Variable
that requires grad is being used in an in-place operation") where eager PyTorch would not.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.nn.modules import module as module_hooks

from ..errors import Error
from ..program import StageSpec
from .checkpoints import Checkpoints, has_checkpoints
from .in_place import destinations
from .rng import MicroBatchStream, RngState, held, replaying

__all__ = ["RANDOM_NAMES", "StageExecutor", "prepare_backward"]


def prepare_backward() -> None:
    """Import what ``torch.autograd.backward(..., grad_tensors)`` imports on its first call.

    That first call imports ``torch.fx.experimental.symbolic_shapes`` (and sympy): a second or
    more, under the import lock. Done before the workers start, it does not stall the first run
    in the middle of the pipeline (and distort its trace).
    """
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


@dataclass
class _Saved:
    """What a stage keeps between F and B of one micro-batch."""

    leaves: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    args: list[Any] | None = None  # kept for recomputation (see [Note: pipeline recomputation])
    rng: RngState | None = None  # where the forward's draws started (a stage that draws)
    checkpoints: list[torch.Tensor] | None = None  # See [Note: recomputation checkpoints]
    # the values the forward started from, of the buffers it changed (by position in
    # ``module.buffers()``), for the recomputation to start from (See [Note: restoring buffers
    # after recomputation])
    buffers: dict[int, torch.Tensor] | None = None


def _differentiable(value: torch.Tensor) -> bool:
    return value.is_floating_point() or value.is_complex()


def _call(module: nn.Module, args: list[torch.Tensor]) -> object:
    """Call the stage; an fx ``GraphModule`` without hooks is called through ``forward``.

    fx wraps ``GraphModule.__call__`` so that an error raised on a generated line is printed to
    stderr and re-raised without its traceback, which would lose the graph node that failed
    (see ``failure.graph_node_of``); ``forward`` is the same computation without the wrapper.
    """
    hooked = (
        module._forward_hooks
        or module._forward_pre_hooks
        or module_hooks._global_forward_hooks
        or module_hooks._global_forward_pre_hooks
    )
    if isinstance(module, fx.GraphModule) and not hooked:
        return module.forward(*args)
    return module(*args)


class StageExecutor:
    """Runs ``spec.module`` for one micro-batch at a time and its backward later.

    Args:
        spec: the stage.
        training: keep graphs for backward (else forward runs under ``torch.no_grad``).
        loss_name: the value seeded with ``loss_scale`` in backward, if this stage makes it.
        from_stages: names of the stage's inputs that come from other stages (they get leaves;
            program inputs are detached and never receive gradients).
        recompute: keep only the inputs between forward and backward, and run forward again
            in backward (see [Note: pipeline recomputation]).
    """

    probe: Any = None  # a memory.SavedProbe while poptorch_sim.memory measures a run
    stream_key = 0  # See [Note: a random stream per model]
    in_place: fx.GraphModule | None = None  # See [Note: outputs computed in place]

    def __init__(
        self,
        spec: StageSpec,
        *,
        training: bool,
        loss_name: str | None,
        from_stages: frozenset[str],
        recompute: bool = False,
    ) -> None:
        self.spec = spec
        self.recompute = recompute and training
        self.draws = _has_random_ops(spec.module)
        self._marks = self.recompute and has_checkpoints(spec.module)
        self.training = training
        self.loss_name = loss_name if loss_name in spec.outputs else None
        self.from_stages = from_stages
        self._saved: dict[int, _Saved] = {}

    def forward(
        self,
        mb: int,
        values: dict[str, torch.Tensor],
        into: dict[str, torch.Tensor] | None = None,
        stream: MicroBatchStream | None = None,
    ) -> dict[str, torch.Tensor]:
        """Run the stage on micro-batch ``mb``; ``values`` holds every input name; ``into``
        where outputs may be computed (See [Note: outputs computed in place]); ``stream``
        the micro-batch's random stream (else random ops draw from torch's generators).

        Returns:
            The stage's outputs by name.

        Raises:
            Error: the module did not return a tuple with one value per output name.
        """
        leaves: dict[str, torch.Tensor] = {}
        args = []
        for name in self.spec.inputs:
            value = values[name].detach()
            if self.training and name in self.from_stages and _differentiable(value):
                value = value.requires_grad_()
                leaves[name] = value
            args.append(value)
        probe, index = self.probe, self.spec.index
        if self.recompute:
            marks = Checkpoints() if self._marks else None
            before = [b.detach().clone() for b in self.spec.module.buffers()]
            with self._drawing(stream, args) as rng, torch.no_grad(), marks or nullcontext():
                result = _call(self.spec.module, args)
            kept = marks.kept if marks is not None else None
            changed = _changed_buffers(list(self.spec.module.buffers()), before)
            if probe is not None:
                probe.keep(index, mb, [*args, *(kept or ()), *changed.values()])
            outputs = self._name_outputs(result)
            self._saved[mb] = _Saved(leaves, outputs, args, rng, kept, changed)
            return outputs
        counting = probe.forward(index, mb) if probe is not None and self.training else None
        in_place = self.in_place if into and not self.training else None
        with (
            self._drawing(stream, args),
            torch.set_grad_enabled(self.training),
            counting or nullcontext(),
            destinations(into) if in_place is not None else nullcontext(),
        ):
            result = _call(in_place if in_place is not None else self.spec.module, args)
        outputs = self._name_outputs(result)
        if self.training:
            self._saved[mb] = _Saved(leaves, outputs)
        return outputs

    def _recomputed(self, mb: int, saved: _Saved) -> dict[str, torch.Tensor]:
        """The outputs of micro-batch ``mb`` computed again, with autograd recording.

        The RNG is replayed from the forward and the buffers start from the values the forward
        started from, so the values are those of the forward; ``backward`` restores the buffers
        afterwards (See [Note: restoring buffers after recomputation]).
        """
        assert saved.args is not None
        _set_buffers(list(self.spec.module.buffers()), saved.buffers or {})
        device = next(a.device for a in saved.args if isinstance(a, torch.Tensor))
        probe = self.probe
        counting = probe.recompute(self.spec.index, mb) if probe is not None else None
        marks = Checkpoints(saved.checkpoints) if saved.checkpoints is not None else None
        # Only a stage that draws replays the RNG: another stage's replay, unlocked, would move
        # the process-wide RNG under the forward of a stage that draws.
        with (
            replaying(saved.rng, device) if saved.rng is not None else nullcontext(),
            counting or nullcontext(),
            marks or nullcontext(),
        ):
            with torch.enable_grad():
                result = _call(self.spec.module, saved.args)
        return self._name_outputs(result)

    def _drawing(
        self, stream: MicroBatchStream | None, args: list[Any]
    ) -> AbstractContextManager[RngState | None]:
        """Where the forward's random ops draw (See [Note: a random stream per model]); the
        context yields the state they start from, for a recomputation to replay."""
        if not self.draws:
            return nullcontext(None)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        if stream is not None:
            return stream.drawing(device, self.stream_key)
        return held(device) if self.recompute else nullcontext(None)

    def _name_outputs(self, result: object) -> dict[str, torch.Tensor]:
        names = self.spec.outputs
        if not isinstance(result, tuple) or len(result) != len(names):
            got = (
                f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            )
            raise Error(
                f"stage {self.spec.index} must return a tuple of {len(names)} values "
                f"({list(names)}), got {got}"
            )
        return dict(zip(names, result))

    def backward(
        self, mb: int, grads: dict[str, torch.Tensor], loss_scale: float
    ) -> dict[str, torch.Tensor | None]:
        """Backward of micro-batch ``mb`` from the output gradients ``grads`` (by name).

        Returns:
            The gradient of each input that came from another stage (``None`` if it got none).
        """
        saved = self._saved.pop(mb)
        buffers = list(self.spec.module.buffers())
        current = None
        if saved.args is not None:
            current = {i: buffers[i].detach().clone() for i in saved.buffers or {}}
            saved.outputs = self._recomputed(mb, saved)
        roots: list[torch.Tensor] = []
        seeds: list[torch.Tensor] = []
        if self.loss_name is not None:
            loss = saved.outputs[self.loss_name]
            if loss.requires_grad:
                roots.append(loss)
                seeds.append(torch.full_like(loss, loss_scale))
        for name, grad in grads.items():
            output = saved.outputs[name]
            if output.requires_grad:
                roots.append(output)
                seeds.append(grad)
        if roots:
            torch.autograd.backward(roots, seeds)
        if current is not None:
            # after backward: its graph may have saved the buffers the recomputation read
            _set_buffers(buffers, current)
        if self.probe is not None:
            self.probe.release(self.spec.index, mb)
        return {name: leaf.grad for name, leaf in saved.leaves.items()}

    def discard(self) -> None:
        """Drop the graphs of unfinished micro-batches (after an aborted run)."""
        self._saved.clear()


# names of the ops that draw random numbers
RANDOM_NAMES = (
    *("dropout", "rand", "bernoulli", "normal", "multinomial", "uniform", "exponential"),
    *("cauchy", "geometric", "poisson", "gumbel", "rrelu"),
)


def _has_random_ops(module: nn.Module) -> bool:
    """Whether the stage may draw random numbers (any module that is not an fx graph may)."""
    if not isinstance(module, fx.GraphModule):
        return True
    for node in module.graph.nodes:
        if node.op == "call_module":
            called = module.get_submodule(node.target)
            if isinstance(called, (nn.modules.dropout._DropoutNd, nn.RReLU)):
                return True
        elif node.op in ("call_function", "call_method"):
            name = getattr(node.target, "__name__", str(node.target)).lower()
            if any(word in name for word in RANDOM_NAMES):
                return True
    return False


def _changed_buffers(
    buffers: list[torch.Tensor], before: list[torch.Tensor]
) -> dict[int, torch.Tensor]:
    """The values ``before`` of the buffers whose values are no longer those, by position
    (a buffer registered during the forward has no value before and is left alone)."""
    return {
        i: value
        for i, (b, value) in enumerate(zip(buffers, before))
        if b.shape != value.shape or not torch.equal(b, value)
    }


def _set_buffers(buffers: list[torch.Tensor], values: dict[int, torch.Tensor]) -> None:
    """Give the buffers at the positions in ``values`` those values, unseen by autograd.

    See [Note: restoring buffers after recomputation].
    """
    with torch.no_grad():
        for i, value in values.items():
            b = buffers[i]
            if b.shape == value.shape:
                b.data.copy_(value)  # ``.data``: a view with a version counter of its own
            else:
                b.data = value.clone()


# [Note: pipeline recomputation]
# With PopART's automatic recomputation (``_Popart.set("autoRecomputation", 3)``,
# RecomputationType.Pipeline, in pipelined training; or 4, RecomputeAll) a stage does not keep
# its activations for every micro-batch in flight: forward runs without recording, keeping only
# the stage's inputs (and the values marked with ``recomputationCheckpoint``, see [Note:
# recomputation checkpoints] in checkpoints.py), and backward runs the forward again with
# autograd before differentiating it. That trades one more forward per micro-batch for memory (see poptorch_sim.memory). The
# recomputed forward replays the RNG state of the original (dropout draws the same masks) and
# leaves buffers as the original forward left them (running statistics are updated once).
# The state replayed is the one the forward started from, in the micro-batch's stream (See
# [Note: a random stream per model] in rng.py); stages without random ops replay nothing.

# [Note: restoring buffers after recomputation]
# A recomputed stage's forward may change its buffers: running statistics, counters, or a queue
# of past features that the forward reads and then updates (CLIP's ``text_fea_queue``). The
# recomputation in backward must read what the forward read, so the forward keeps the values
# its changed buffers started from, the recomputation starts from them (it changes them again
# as the forward did), and after backward the buffers get back the values they held when
# backward began (those of the latest forwards). Without that the recomputation read the
# queue already updated with its own micro-batch's features: the loss that backward
# differentiated was not the one forward computed, and the gradients were wrong. The
# recomputed graph saves buffers and views of them (BERT's ``position_ids[:, :seq]``, CLIP's
# causal-mask slice, the queue itself) and backward checks that each saved tensor is still at
# the version it was saved at, so the values are written through ``b.data``, which writes the
# same memory without bumping the version, only for the buffers the forward changed, and the
# latest values are given back only once backward is done with the graph.
