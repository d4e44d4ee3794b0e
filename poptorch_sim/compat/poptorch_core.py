"""Names PopTorch's C++ module ``poptorch.poptorch_core`` gives, for code and tests that import it."""

from __future__ import annotations

import enum
from typing import Any

from .. import env
from ..errors import Error, RecoverableError, UnrecoverableError
from ..hardware import simulated_version
from ..ipu_context import isRunningOnIpu

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


# What PopTorch's C++ test thrower raises per kind: (error class, ``type``, message).
_TEST_ERRORS: dict[TestErrorType, tuple[type[Error], str, str]] = {
    TestErrorType.Poptorch: (Error, "poptorch_cpp_error", "This is a PopTorch error"),
    TestErrorType.Popart: (Error, "popart_exception", "This is a Popart error"),
    TestErrorType.PopartInternal: (Error, "popart_internal_exception", "This is a Popart error"),
    TestErrorType.Poplibs: (Error, "poplibs_exception", "This is a Poplibs error"),
    TestErrorType.PoplarUnrecoverable: (
        UnrecoverableError,
        "poplar_unrecoverable_runtime_error",
        "This is not recoverable",
    ),
    TestErrorType.PoplarUnknown: (
        Error,
        "poplar_unknown_runtime_error",
        "Don't know what happened",
    ),
    TestErrorType.PoplarRecoverableFullReset: (
        RecoverableError,
        "poplar_recoverable_runtime_error",
        "Reboot needed",
    ),
    TestErrorType.PoplarLinkError: (
        Error,
        "poplar_link_error",
        "Link error. Output: Library -lfoo not found\ncheck path",
    ),
}

# The nested log contexts PopTorch's thrower is inside when it raises.
_TEST_LOCATION = "throwTestError::topLevel\n  throwTestError::bottomLevel"


def _throwTestError(kind: TestErrorType) -> None:
    """Raise the error PopTorch's backend raises for ``kind`` (used by PopTorch's tests).

    The error's ``str`` is PopTorch's long form (``In <file>:<line>: '<type>': <message>``, the
    recovery action, then ``Error raised in:`` and the context); ``message`` holds only the
    message and ``location`` only the context.

    Raises:
        Error: always; ``RecoverableError`` or ``UnrecoverableError`` for Poplar runtime kinds.
    """
    cls, type_, message = _TEST_ERRORS[TestErrorType(kind)]
    long_message = f"In poptorch_core.py:0: '{type_}': {message}"
    if cls is RecoverableError:
        long_message += "\nRecovery action required: FULL_RESET"
    long_message += f"\nError raised in:\n{_TEST_LOCATION}"
    if cls is RecoverableError:
        err: Error = RecoverableError(
            long_message, type_, _TEST_LOCATION, recovery_action="FULL_RESET"
        )
    else:
        err = cls(long_message, type_, _TEST_LOCATION)
    err.message = message
    raise err


def _validateOptions(options: dict[str, Any]) -> None:
    """Check ``Options.toDict()`` as PopTorch's compiler does (see ``options/session.py``).

    Raises:
        poptorch.Error: ``Unknown <kind> option <name>`` / ``Unknown value type ... for option``.
    """
    from ..options.session import validate_options

    validate_options(options)


def isCompilingWithDispatcher() -> bool:
    """Whether a model is being captured for the IPU right now (PopTorch's dispatcher is active).

    Simulated: True exactly while ``isRunningOnIpu()`` is, i.e. while poptorch_sim traces or
    runs a model's ``forward``; False once that is over, including after a compilation that
    failed.
    """
    return isRunningOnIpu()


def ipuHardwareVersion(num_ipus: int = 1) -> int:
    """The version of the simulated IPUs (``POPTORCH_SIM_IPU_VERSION``, default 2), or 0
    with none."""
    return simulated_version() if env.num_ipus() >= num_ipus else 0
