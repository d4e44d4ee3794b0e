"""``poptorch.profiling``: user profiling channels (``Channel``) and the execution trace."""

from __future__ import annotations

from .channel import Channel
from .trace import TraceEvent, TraceRecorder

__all__ = ["Channel", "TraceEvent", "TraceRecorder"]
