"""The worker process's tie to its owner: it ends as soon as the process that owns it dies.

[Note: a worker never outlives its owner]
Two mechanisms, as one alone misses cases:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel sends SIGKILL when the worker's *parent thread*
  exits, whatever the worker is doing, even blocked in C with the interpreter lock held. It is
  set only when that parent thread is the owner's main thread (or the fork server's only
  thread): a loader started from another thread would otherwise lose its worker when that
  thread ends.
- A watchdog thread waits on the owner's pid (a pidfd, else polling) and exits the process
  when the owner is gone. It is the one that fires under the fork server, whose server lives
  on while any worker does, and when the death signal could not be set.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["watch_owner"]

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


def watch_owner(owner: int, on_death: Callable[[], None], death_signal: bool) -> None:
    """Call ``on_death`` (which must end the process) once process ``owner`` has exited.

    Args:
        owner: pid of the process that started the worker (and reads its batches).
        on_death: run on the watchdog thread; it must not return (``os._exit``).
        death_signal: also ask the kernel for SIGKILL when the parent thread exits.
    """
    if death_signal:
        _set_parent_death_signal(signal.SIGKILL)
    thread = threading.Thread(
        target=_watch, args=(owner, on_death), name="poptorch_sim-owner-watch", daemon=True
    )
    thread.start()


def _set_parent_death_signal(sig: signal.Signals) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(owner: int, on_death: Callable[[], None]) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        on_death()
        return
    except (AttributeError, OSError):  # no pidfd here: poll
        while _alive(owner):
            time.sleep(_POLL_S)
        on_death()
        return
    select.select([fd], [], [])  # readable once the owner has exited
    on_death()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
