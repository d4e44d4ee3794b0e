"""PopTorch's Python logger (``poptorch::python``), its level names and ``setLogLevel``."""

from __future__ import annotations

import logging
import sys
import time

from . import env

__all__ = ["logger", "setLogLevel", "debug_once"]

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


_said: set[str] = set()


def debug_once(message: str) -> None:
    """Log ``message`` at debug level the first time it is seen in this process."""
    if message not in _said:
        _said.add(message)
        logger.debug(message)


setLogLevel(env.log_level())
