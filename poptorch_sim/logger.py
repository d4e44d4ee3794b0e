"""PopTorch's Python logger (``poptorch::python``), its level names and ``setLogLevel``."""

from __future__ import annotations

import logging
import sys
import time

from . import env

__all__ = ["logger", "setLogLevel", "setPopartLogLevel", "popart_log_level", "debug_once"]

# PopTorch's level names, and the integers its setLogLevel accepts (5 is unused).
_LEVELS = {
    "TRACE": logging.DEBUG - 5,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERR": logging.ERROR,
    "OFF": logging.CRITICAL + 10,
}
_LEVEL_BY_INT = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}
_NAME_BY_LEVEL = {
    logging.DEBUG - 5: "trace",
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


class _Formatter(logging.Formatter):
    """``[HH:MM:SS.mmm] [poptorch::python] [warning] message``, as PopTorch prints it."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = _NAME_BY_LEVEL.get(record.levelno, record.levelname.lower())
        msecs = int(record.msecs)
        return f"[{stamp}.{msecs:03d}] [{record.name}] [{level}] {record.getMessage()}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now, so pytest's capture sees the lines."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


logger = logging.getLogger("poptorch::python")
logger.propagate = False
_handler = _StderrHandler()
_handler.setFormatter(_Formatter())
logger.addHandler(_handler)
logging.addLevelName(_LEVELS["TRACE"], "TRACE")


def setLogLevel(level: str | int) -> None:
    """Set the log level of poptorch_sim's logger.

    Args:
        level: one of ``TRACE, DEBUG, INFO, WARN, ERR, OFF`` or the integers ``0, 1, 2, 3, 4, 6``.

    Raises:
        ValueError: an unknown level name or integer.

    >>> setLogLevel("DEBUG")
    """
    if isinstance(level, int):
        if level not in _LEVEL_BY_INT:
            raise ValueError("Invalid log level integer")
        level = _LEVEL_BY_INT[level]
    name = str(level).upper()
    if name not in _LEVELS:
        raise ValueError(
            f"Unknown log level: {level}. Valid values are DEBUG, ERR, INFO, OFF, TRACE and WARN"
        )
    logger.setLevel(_LEVELS[name])


# PopART's level names and the integers PopTorch passes to its C++ core for them.
_POPART_LEVELS = {
    "TRACE": 0,
    "TRACE_ALL": 0,
    "DEBUG": 1,
    "DEBUG_IR": 1,
    "INFO": 2,
    "WARN": 3,
    "ERR": 4,
    "OFF": 6,
}
_popart_level = "WARN"


def setPopartLogLevel(level: str) -> None:
    """Set PopART's log level (PopTorch's ``poptorch._logging.setPopartLogLevel``).

    Simulated: there is no PopART, so the level is only remembered (``popart_log_level()``);
    nothing is ever logged under the ``popart:`` categories.

    Args:
        level: one of ``TRACE, TRACE_ALL, DEBUG, DEBUG_IR, INFO, WARN, ERR, OFF``.

    Raises:
        ValueError: ``level`` is not one of those strings (integers are refused too).

    >>> setPopartLogLevel("INFO")
    """
    global _popart_level
    if not isinstance(level, str) or level not in _POPART_LEVELS:
        raise ValueError(f"Level must be one of {', '.join(_POPART_LEVELS)} (got {level!r})")
    _popart_level = level


def popart_log_level() -> str:
    """The level last given to ``setPopartLogLevel`` (``WARN`` by default)."""
    return _popart_level


_said: set[str] = set()


def _once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.log(level, message)


def debug_once(message: str) -> None:
    """Log ``message`` at debug level the first time it is seen in this process."""
    _once(logging.DEBUG, message)


def warning_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process."""
    _once(logging.WARNING, message)


setLogLevel(env.log_level())
