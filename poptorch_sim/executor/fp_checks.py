"""``Precision.enableFloatingPointExceptions(True)``: stop a run at the first invalid float op.

On an IPU the option enables the floating-point exception traps: an operation that is invalid
(a NaN operand, ``0 * inf``, ``sqrt(-1)``), divides by zero or overflows stops the program with an
error. Here every op of the model's forward runs under a dispatch mode that applies the same
rules to its tensors:

    rule                                              example
    a floating input holds a NaN                      x > nan
    the result holds a NaN                            0 * inf, sqrt(-1), 0 / 0
    the result holds an inf that no input held        1 / 0, exp(3800)

Ops that only move or select values (views, copies, fills, ``where``, ``max``...) are not checked:
they raise no exception on an IPU either.

Simulated: only the forward pass of a model that runs as one program is checked (not the
backward pass, the optimizer step, nor the stages of a pipelined or sharded program).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import Error

__all__ = ["FloatingPointChecks"]

# Ops that move or select values: no arithmetic, so no floating-point exception.
_MOVES = frozenset(
    """alias amax amin argmax argmin as_strided cat clone copy detach diagonal empty
    empty_like empty_strided expand fill full full_like gather index index_put index_select
    lift_fresh lift_fresh_copy masked_fill max min narrow new_empty new_full new_ones
    new_zeros ones ones_like permute repeat reshape scalar_tensor scatter select slice sort
    split split_with_sizes squeeze stack t topk transpose unbind unsqueeze view where zeros
    zeros_like _to_copy _unsafe_view _reshape_alias""".split()
)


def _floats(tree: Any) -> list[torch.Tensor]:
    return [
        t
        for t in pytree.tree_leaves(tree)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0
    ]


class FloatingPointChecks(TorchDispatchMode):
    """Raise ``poptorch.Error`` at the first op that would trap on an IPU (see module doc)."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")
        if name in _MOVES:
            return out
        inputs = _floats((args, kwargs))
        if any(bool(t.isnan().any()) for t in inputs):
            self._raise(name, "invalid operation (a NaN operand)")
        results = _floats(out)
        if any(bool(t.isnan().any()) for t in results):
            self._raise(name, "invalid operation (the result is NaN)")
        if any(bool(t.isinf().any()) for t in results) and not any(
            bool(t.isinf().any()) for t in inputs
        ):
            self._raise(name, "overflow or division by zero (the result is infinite)")
        return out

    @staticmethod
    def _raise(op: str, what: str) -> None:
        raise Error(
            f"Floating-point exception in aten::{op}: {what}. Raised because "
            "Precision.enableFloatingPointExceptions(True) is set."
        )
