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

from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.nn.modules import module as module_hooks

from ..errors import Error
from ..program import StageSpec

__all__ = ["StageExecutor", "prepare_backward"]


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
    """

    def __init__(
        self,
        spec: StageSpec,
        *,
        training: bool,
        loss_name: str | None,
        from_stages: frozenset[str],
    ) -> None:
        self.spec = spec
        self.training = training
        self.loss_name = loss_name if loss_name in spec.outputs else None
        self.from_stages = from_stages
        self._saved: dict[int, _Saved] = {}

    def forward(self, mb: int, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the stage on micro-batch ``mb``; ``values`` holds every input name.

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
        with torch.set_grad_enabled(self.training):
            result = _call(self.spec.module, args)
        outputs = self._name_outputs(result)
        if self.training:
            self._saved[mb] = _Saved(leaves, outputs)
        return outputs

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
        return {name: leaf.grad for name, leaf in saved.leaves.items()}

    def discard(self) -> None:
        """Drop the graphs of unfinished micro-batches (after an aborted run)."""
        self._saved.clear()
