"""Worker threads: starting them, waits that can be stopped, joining, and carrying failures home.

[Note: worker threads]
Every background thread of poptorch_sim (IPU workers, IO-tile phases, the prefetcher, serving
feeders) follows the same four rules, kept here once:

- **Daemon, named, started here** (``start_thread``): a hung thread never keeps the process
  alive, and its name says what it is in a stack dump or a warning.
- **Every blocking wait polls a stop flag** every ``POLL_S`` (``polled_get``, ``polled_put``),
  so a thread blocked on an empty or full queue notices ``close()`` within ``POLL_S``.
- **Failures travel, never raise across threads**: a thread turns what it ran into an
  ``Outcome`` ``(ok, payload)`` (``attempt``) — ``(True, value)`` or ``(False, exception)`` —
  and hands it to the caller (a queue, a future), which re-raises it with its original
  traceback (``unwrap``).
- **Joined with a bound** (``join_all``): the owner's ``close()`` waits at most ``JOIN_TIMEOUT_S``
  for all its threads together (``LONG_JOIN_TIMEOUT_S`` when one may be inside a model call),
  then warns naming the ones still running rather than hanging the caller.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..logger import logger

__all__ = [
    "JOIN_TIMEOUT_S",
    "LONG_JOIN_TIMEOUT_S",
    "POLL_S",
    "Outcome",
    "attempt",
    "join_all",
    "polled_get",
    "polled_put",
    "start_thread",
    "unwrap",
]

POLL_S = 0.05  # how often a blocked wait re-checks its stop flag
JOIN_TIMEOUT_S = 10.0  # how long close() waits for threads that stop between two steps
LONG_JOIN_TIMEOUT_S = 30.0  # ... for threads that may be inside a model call when asked to stop

T = TypeVar("T")
Outcome = tuple[bool, Any]  # (True, value) or (False, the exception raised)
Stop = threading.Event | Callable[[], bool]


def start_thread(target: Callable[..., object], name: str, *args: Any) -> threading.Thread:
    """Start ``target(*args)`` on a new daemon thread called ``name``; return the thread."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def attempt(fn: Callable[..., T], *args: Any) -> Outcome:
    """``(True, fn(*args))``, or ``(False, exc)`` if it raised: a result safe to hand over.

    >>> attempt(int, "3")
    (True, 3)
    >>> attempt(int, "x")[0]
    False
    """
    try:
        return True, fn(*args)
    except BaseException as exc:  # carried to the caller, never raised on this thread
        return False, exc


def unwrap(outcome: Outcome) -> Any:
    """The value of an ``Outcome``, or its exception raised again (original traceback kept)."""
    ok, payload = outcome
    if ok:
        return payload
    raise payload


def _stopped(stop: Stop) -> bool:
    return stop.is_set() if isinstance(stop, threading.Event) else stop()


def polled_get(
    inbox: queue.Queue[T], stop: Stop, timeout: float | None = None
) -> tuple[bool, T | None]:
    """Wait for an item of ``inbox`` until ``stop`` or ``timeout`` seconds pass.

    Returns:
        ``(True, item)``, or ``(False, None)`` once ``stop`` is set or the time is up (an item
        already queued is still taken when ``stop`` is set).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        try:
            if left <= 0 or _stopped(stop):
                return True, inbox.get_nowait()
            return True, inbox.get(timeout=left)
        except queue.Empty:
            if _stopped(stop) or (deadline is not None and time.monotonic() >= deadline):
                return False, None


def polled_put(outbox: queue.Queue[T], item: T, stop: Stop) -> bool:
    """Put ``item`` on a bounded ``outbox``, waiting for room; False if ``stop`` came first."""
    while not _stopped(stop):
        try:
            outbox.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def join_all(
    threads: Iterable[threading.Thread], timeout: float | None = JOIN_TIMEOUT_S, why: str = ""
) -> list[str]:
    """Join ``threads`` within ``timeout`` seconds in all (None: wait as long as it takes).

    The calling thread is skipped (a thread closing its own owner cannot join itself).

    Args:
        threads: the threads, told to stop already.
        timeout: seconds for all of them together.
        why: appended to the warning about a thread still running (what it is probably doing).

    Returns:
        The names of the threads still running, each also logged as a warning.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    alive = []
    for thread in threads:
        if thread is threading.current_thread() or not thread.is_alive():
            continue
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            alive.append(thread.name)
            logger.warning("%s did not stop within %.0f s%s", thread.name, timeout, why)
    return alive
