"""PopTorch's private ``poptorch._impl`` names that its tests and some user code reach for."""

from __future__ import annotations

from typing import Any

from .errors import createPoptorchError
from .ipu_context import isRunningOnIpu

__all__ = [
    "createPoptorchError",
    "isDispatchTracing",
    "isRunningOnIpu",
    "_restoreWrapperIfNecessary",
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
