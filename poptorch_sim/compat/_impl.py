"""PopTorch's private ``poptorch._impl`` names that its tests and some user code reach for."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import createPoptorchError
from ..executor.weights import set_tensors_wrapped
from ..ipu_context import isRunningOnIpu

__all__ = [
    "createPoptorchError",
    "isDispatchTracing",
    "isRunningOnIpu",
    "_restoreWrapperIfNecessary",
    "rewrapModelIfNecessary",
    "unwrapModelIfNecessary",
]


def isDispatchTracing() -> bool:
    """Whether PopTorch's dispatcher is capturing the model's ops onto the ``ipu`` device.

    Simulated: always False. Models run eagerly (or through torch.fx) on ordinary tensors, so
    code that creates tensors on ``device="ipu"`` while tracing must keep its CPU path.

    >>> isDispatchTracing()
    False
    """
    return False


def _restoreWrapperIfNecessary(obj: Any) -> Any:
    """Return ``obj`` as unpickled: poptorch_sim never pickles its host-sync wrappers.

    PopTorch re-wraps unpickled parameters of a wrapped model here. poptorch_sim saves the
    user's own classes and plain tensors, so there is nothing to restore.
    """
    return obj


def unwrapModelIfNecessary(model: nn.Module) -> None:
    """Give a training-wrapped model's parameters and buffers back their own classes.

    Libraries (optimum-graphcore) call it before deep-copying or saving a model that a
    ``trainingModel`` wraps, and ``rewrapModelIfNecessary`` afterwards. The host weights are
    brought up to date first. A model that is not wrapped is left as it is.

    Args:
        model: the user's model.

    >>> unwrapModelIfNecessary(torch.nn.Linear(2, 2))  # doctest: +SKIP
    """
    set_tensors_wrapped(model, wrapped=False)


def rewrapModelIfNecessary(model: nn.Module) -> None:
    """Undo ``unwrapModelIfNecessary``: the parameters and buffers sync with the device again.

    Args:
        model: the user's model.
    """
    set_tensors_wrapped(model, wrapped=True)
