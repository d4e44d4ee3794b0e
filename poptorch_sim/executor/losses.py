"""Finding the final loss of an eagerly executed model (PopTorch's one-final-loss rule).

A loss is the result of a torch loss (module or function) or of ``identity_loss``. A loss that
feeds, through any chain of ops, into another loss is demoted to a plain value; exactly one final
loss must remain. Losses are recorded with a ``TorchFunctionMode`` while the first micro-batch
runs; ancestry is read from the autograd graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import Error
from ..ops import loss as loss_ops
from ..ops.loss import MANY_LOSSES, NO_LOSS

__all__ = ["LossRecorder", "final_loss", "NO_LOSS", "MANY_LOSSES"]


class LossRecorder(TorchFunctionMode):
    """Records every loss computed while active, in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[torch.Tensor] = []
        self._previous: Callable[[torch.Tensor], None] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        if loss_ops.is_loss_callable(func) and isinstance(result, torch.Tensor):
            self.losses.append(result)
        return result

    def __enter__(self) -> LossRecorder:
        self._previous = loss_ops.loss_hook()
        loss_ops.set_loss_hook(self._on_identity_loss)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        loss_ops.set_loss_hook(self._previous)

    def _on_identity_loss(self, result: torch.Tensor) -> None:
        self.losses.append(result)


def _ancestors(t: torch.Tensor) -> set[Any]:
    seen: set[Any] = set()
    stack = [t.grad_fn] if t.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(fn for fn, _ in node.next_functions if fn is not None)
    return seen


def final_loss(losses: list[torch.Tensor]) -> int:
    """Index in ``losses`` of the one final loss.

    Raises:
        Error: no loss, or more than one loss that feeds no other loss.
    """
    candidates = [i for i, t in enumerate(losses) if t.grad_fn is not None]
    if not candidates:
        if losses:  # nothing requires grad (a frozen model): backward has nothing to do
            return len(losses) - 1
        raise Error(NO_LOSS)
    graphs = {i: _ancestors(losses[i]) for i in candidates}
    finals = [
        i
        for i in candidates
        if not any(j != i and losses[i].grad_fn in graphs[j] for j in candidates)
    ]
    # The same tensor recorded twice (a loss module calling a loss function) is one loss.
    unique = {id(losses[i].grad_fn): i for i in finals}
    if len(unique) > 1:
        raise Error(MANY_LOSSES)
    return max(unique.values())
