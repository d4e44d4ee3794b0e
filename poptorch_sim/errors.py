"""PopTorch's exception hierarchy: ``Error`` with ``RecoverableError`` and ``UnrecoverableError``."""

from __future__ import annotations

__all__ = [
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "createPoptorchError",
    "NO_EXECUTABLE_ERR",
]

NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."


class Error(Exception):
    """The root of every error poptorch_sim raises on its own account (``poptorch.Error``).

    Attributes mirror PopTorch's: ``message`` (without context), ``type`` (the component that
    raised it) and ``location`` (where, when known).
    """

    def __init__(self, message: str = "", type: str = "poptorch_py_error", location: str = ""):
        super().__init__(message)
        self.message = message
        self.type = type
        self.location = location


class RecoverableError(Error):
    """An error after which the device can be used again once ``recovery_action`` is taken."""

    def __init__(
        self,
        message: str = "",
        type: str = "poplar_recoverable_runtime_error",
        location: str = "",
        recovery_action: str = "IPU_RESET",
    ):
        super().__init__(message, type, location)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """An error after which the process must be restarted."""

    def __init__(
        self,
        message: str = "",
        type: str = "poplar_unrecoverable_runtime_error",
        location: str = "",
    ):
        super().__init__(message, type, location)


def createPoptorchError(msg: str) -> Error:
    """Return (not raise) a ``poptorch.Error`` whose ``str`` is ``"'poptorch_py_error': msg"``.

    >>> str(createPoptorchError("boom"))
    "'poptorch_py_error': boom"
    """
    err = Error(f"'poptorch_py_error': {msg}")
    err.message = msg
    return err
