"""``Channel``: user-named profiling spans (PopTorch's libpvti wrapper), recorded in memory.

PopTorch forwards ``Channel`` tracepoints to libpvti (PopVision's system analyser) and makes
them no-ops without it. The simulator records each span (channel, name, start and end times,
thread) in a bounded in-memory list per channel name, which ``Channel.spans()`` returns.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Channel", "Span"]

MAX_SPANS_PER_CHANNEL = 100_000  # the oldest spans are dropped beyond this

_channels: dict[str, deque[Span]] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Span:
    """One completed tracepoint; times from ``time.perf_counter_ns``."""

    channel: str
    name: str
    start_ns: int
    end_ns: int
    thread: str

    @property
    def duration_ns(self) -> int:
        """How long the tracepoint lasted."""
        return self.end_ns - self.start_ns


def _store(name: str) -> deque[Span]:
    with _lock:
        if name not in _channels:
            _channels[name] = deque(maxlen=MAX_SPANS_PER_CHANNEL)
        return _channels[name]


class Channel:
    """A named profiling channel; channels with the same name share their spans.

    >>> channel = Channel("MyApp")
    >>> with channel.tracepoint("TimeThis"):
    ...     pass
    >>> channel.spans()[-1].name
    'MyApp.TimeThis'
    """

    def __init__(self, name: str):
        """Args: name: the channel's name (prefixes its tracepoints' names)."""
        self._name = name
        self._spans = _store(name)

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    @contextmanager
    def tracepoint(self, name: str) -> Iterator[None]:
        """Record the time spent in the ``with`` block as the span ``<channel>.<name>``.

        Args:
            name: the tracepoint's name.
        """
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            thread = threading.current_thread().name
            self._spans.append(Span(self._name, f"{self._name}.{name}", start, end, thread))

    def instrument(self, obj: Any, *methods: str) -> Any:
        """Wrap the named methods of ``obj`` so that each call is recorded as a span.

        Args:
            obj: the object (or class) whose methods to instrument.
            methods: names of its methods.

        Returns:
            ``obj``.

        Raises:
            AttributeError: ``obj`` has no callable attribute with one of these names.
        """
        for method in methods:
            original = getattr(obj, method, None)
            if not callable(original):
                raise AttributeError(
                    f"Channel.instrument: {type(obj).__name__} has no method {method!r}"
                )
            setattr(obj, method, self._traced(method, original))
        return obj

    def _traced(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with self.tracepoint(name):
                return fn(*args, **kwargs)

        return traced

    def spans(self) -> list[Span]:
        """The spans recorded on this channel so far, oldest first."""
        return list(self._spans)

    def clear(self) -> None:
        """Forget the spans recorded on this channel."""
        self._spans.clear()

    def __repr__(self) -> str:
        return f"Channel({self._name!r})"
