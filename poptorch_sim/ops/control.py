"""On-device control flow: ``for_loop`` and ``cond``, run eagerly (inference only, as PopTorch).

[Note: control flow in a training model]
PopTorch rejects ``for_loop``/``cond`` when it compiles a training model. The simulator learns
that it is running a training model's forward from the executor, which wraps the forward (in the
thread that runs it) in ``training_graph()``; outside that context both ops simply run.
Under ``torch.fx`` symbolic tracing ``for_loop`` is unrolled and ``cond`` evaluates both
branches and selects with ``torch.where``, so the traced graph computes the same values.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..errors import createPoptorchError
from .fx_leaf import find_proxy, is_proxy

__all__ = ["for_loop", "cond", "training_graph", "is_training_graph"]

_state = threading.local()


@contextlib.contextmanager
def training_graph(enabled: bool = True) -> Iterator[None]:
    """Mark code run inside (in this thread) as the forward of a training model.

    The executor enters it around a training model's forward so that ``for_loop`` and ``cond``
    raise PopTorch's "only supported in inference" errors. See
    [Note: control flow in a training model].

    Args:
        enabled: ``False`` marks an inference forward (for nesting).

    >>> with training_graph():
    ...     is_training_graph()
    True
    """
    previous = getattr(_state, "training", False)
    _state.training = enabled
    try:
        yield
    finally:
        _state.training = previous


def is_training_graph() -> bool:
    """Whether this thread is running a training model's forward (see ``training_graph``)."""
    return bool(getattr(_state, "training", False))


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) or is_proxy(value)


def _as_list(outputs: Any) -> list[Any]:
    if isinstance(outputs, (list, tuple)):
        return list(outputs)
    return [outputs]


def for_loop(
    count: int, body: Callable[..., Any], inputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Run ``body`` ``count`` times, feeding each iteration's outputs to the next.

    The body receives copies of the inputs (they are passed by value: in-place changes inside
    the body do not reach the caller's tensors) and must return as many tensors as it takes.

    Args:
        count: number of iterations.
        body: ``body(*tensors) -> tensor | tuple/list of tensors``.
        inputs: the initial inputs, a list of tensors.

    Returns:
        The outputs of the last iteration, as a list.

    Raises:
        ValueError: ``inputs`` is not a list of tensors (PopTorch's messages).
        poptorch.Error: used in a training model, a bad ``count``, or the body returns a
            different number of tensors than it takes.

    >>> for_loop(3, lambda x: x * 2, [torch.tensor([1.0])])
    [tensor([8.])]
    """
    if not isinstance(inputs, list):
        raise ValueError(
            "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. "
            "(Object is not list)"
        )
    for index, tensor in enumerate(inputs):
        if not _is_tensor(tensor):
            raise ValueError(
                "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. "
                f"(Object contained in list at index {index} is not torch.tensor)"
            )
    if is_training_graph():
        raise createPoptorchError("poptorch.for_loop() is only supported in inference.")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise createPoptorchError(
            f"poptorch.for_loop: count must be a non-negative int; got {count!r}."
        )
    values = [t.clone() for t in inputs]
    for _ in range(count):
        outputs = _as_list(body(*values))
        if len(outputs) != len(values):
            raise createPoptorchError(
                f"poptorch.for_loop: the body takes {len(values)} tensor(s) but returned "
                f"{len(outputs)}; it must return one new value per input."
            )
        values = outputs
    return values


def _check_branch_outputs(then_out: Sequence[Any], else_out: Sequence[Any]) -> None:
    if len(then_out) != len(else_out):
        raise createPoptorchError(
            f"poptorch.cond: then_body returned {len(then_out)} tensor(s) but else_body "
            f"returned {len(else_out)}; both branches must return the same number of outputs."
        )


def cond(
    condition: torch.Tensor,
    then_body: Callable[..., Any],
    then_inps: list[torch.Tensor],
    else_body: Callable[..., Any],
    else_inps: list[torch.Tensor],
) -> list[torch.Tensor]:
    """Run ``then_body(*then_inps)`` if ``condition`` is true, else ``else_body(*else_inps)``.

    Args:
        condition: a boolean (one-element) tensor.
        then_body: the branch taken when ``condition`` is true.
        then_inps: its inputs, a list.
        else_body: the branch taken otherwise.
        else_inps: its inputs, a list.

    Returns:
        The chosen branch's outputs, as a list.

    Raises:
        ValueError: ``then_inps`` or ``else_inps`` is not a list (PopTorch's message).
        poptorch.Error: used in a training model.

    >>> cond(torch.tensor(True), lambda x: x + 1, [torch.ones(1)], lambda x: x, [torch.ones(1)])
    [tensor([2.])]
    """
    if not isinstance(then_inps, list) or not isinstance(else_inps, list):
        raise ValueError(
            "poptorch.cond expects then_inps and else_inps tensors to be a list of tensors. "
            "(Object is not list)"
        )
    if is_training_graph():
        raise createPoptorchError("poptorch.cond() is only supported in inference.")
    if find_proxy(condition) is not None:
        then_out = _as_list(then_body(*then_inps))
        else_out = _as_list(else_body(*else_inps))
        _check_branch_outputs(then_out, else_out)
        return [torch.where(condition, a, b) for a, b in zip(then_out, else_out)]
    if condition:
        return _as_list(then_body(*then_inps))
    return _as_list(else_body(*else_inps))
