"""Values marked with ``poptorch.recomputationCheckpoint``: stashed in forward, reused in backward.

[Note: recomputation checkpoints]
With recomputation on (see [Note: pipeline recomputation] in ``stage.py``) a stage keeps, per
micro-batch in flight, its inputs and the values marked with ``recomputationCheckpoint``
(PopTorch: "these values will not be recomputed and they will be stored in memory between
forward and backwards passes instead"); everything between the marks is recomputed in backward.
Both spellings of the mark, ``poptorch.recomputationCheckpoint(x)`` and
``torch.ops.poptorch.recomputation_checkpoint(x)``, are the same op, kept by the capture as a
node of the stage's graph.

    forward (no autograd)       each mark's value is copied into the micro-batch's stash
    backward's recomputation    the i-th mark returns the i-th stashed value instead, as the
                                output of ``_Stashed`` (gradients flow back into the segment
                                that recomputed it), so every segment starts from a stashed
                                value, as on an IPU

A ``TorchFunctionMode`` sees each call of the op on the worker thread that runs the stage (the
mode stack is per thread); stages without a mark run without it. Without recomputation the mark
is an identity.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx, nn
from torch.overrides import TorchFunctionMode

__all__ = ["Checkpoints", "has_checkpoints", "is_checkpoint"]


@functools.cache
def _op() -> Any:
    from ..ops import library  # noqa: F401  (registers torch.ops.poptorch)

    return torch.ops.poptorch.recomputation_checkpoint


@functools.cache
def _default() -> Any:
    return _op().default


def is_checkpoint(target: Any) -> bool:
    """Whether ``target`` (a graph node's target, or a called function) is the mark."""
    op = _op()
    return target is op or target is _default()


def has_checkpoints(module: nn.Module, unknown: bool = True) -> bool:
    """Whether a stage marks values: an fx graph with the op; ``unknown`` for other modules."""
    if not isinstance(module, fx.GraphModule):
        return unknown
    return any(n.op == "call_function" and is_checkpoint(n.target) for n in module.graph.nodes)


class _Stashed(torch.autograd.Function):
    """The stashed value, standing for the recomputed one: gradients go to the recomputed."""

    @staticmethod
    def forward(ctx: Any, recomputed: torch.Tensor, stashed: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(stashed)  # the output *is* the stash, so later in-place ops may use it
        return stashed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class Checkpoints(TorchFunctionMode):
    """Collects the marked values of one forward, or substitutes them in its recomputation.

    Args:
        stashed: None in forward (the values are collected into ``kept``); in the
            recomputation, the values the forward kept, in order.
    """

    def __init__(self, stashed: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []
        self._stashed = stashed

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if not is_checkpoint(func) or not isinstance(result, torch.Tensor):
            return result
        if self._stashed is None:
            # A copy: the stage may modify the marked value in place after the mark.
            self.kept.append(result.detach().clone())
            return result
        stashed = self._stashed[len(self.kept)]
        self.kept.append(stashed)
        if not (torch.is_grad_enabled() and result.requires_grad):
            return stashed
        return _Stashed.apply(result, stashed)
