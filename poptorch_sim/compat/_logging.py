"""PopTorch's private ``poptorch._logging`` module, which its test helpers import."""

from __future__ import annotations

from ..logger import logger, setLogLevel, setPopartLogLevel

__all__ = ["logger", "setLogLevel", "setPopartLogLevel"]
