"""Names PopTorch's C++ module ``poptorch.poptorch_core`` gives, for code and tests that import it."""

from __future__ import annotations

import enum
from typing import Any

from . import env
from .errors import Error, RecoverableError, UnrecoverableError
from .hardware import MK2_VERSION

__all__ = [
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "TestErrorType",
    "_throwTestError",
    "_validateOptions",
    "isCompilingWithDispatcher",
    "ipuHardwareVersion",
]


class TestErrorType(enum.IntEnum):
    """Kinds of error ``_throwTestError`` raises."""

    Poptorch = 0
    Popart = 1
    PopartInternal = 2
    Poplibs = 3
    PoplarUnrecoverable = 4
    PoplarUnknown = 5
    PoplarRecoverableFullReset = 6
    PoplarLinkError = 7


def _throwTestError(kind: TestErrorType) -> None:
    """Raise the error PopTorch's backend raises for ``kind`` (used by PopTorch's tests)."""
    if kind == TestErrorType.PoplarUnrecoverable:
        raise UnrecoverableError("Test unrecoverable error")
    if kind == TestErrorType.PoplarRecoverableFullReset:
        raise RecoverableError("Test recoverable error", recovery_action="FULL_RESET")
    if kind == TestErrorType.PoplarLinkError:
        raise UnrecoverableError("Test link error", type="poplar_link_error")
    raise Error(f"Test error of type {kind.name}", type=f"{kind.name.lower()}_error")


def _validateOptions(options: dict[str, Any]) -> None:
    """Accept any PopART option: simulation has no session to validate them against."""


def isCompilingWithDispatcher() -> bool:
    """Always True: models are captured by tracing, never by the legacy JIT path."""
    return True


def ipuHardwareVersion(num_ipus: int = 1) -> int:
    """The version of the simulated IPUs (2), or 0 with none."""
    return MK2_VERSION if env.num_ipus() >= num_ipus else 0
