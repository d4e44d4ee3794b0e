"""The worker process's tie to its owner: it ends as soon as the process that owns it dies.

[Note: a worker never outlives its owner]
Two mechanisms, as one alone misses cases:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel sends SIGKILL when the worker's *parent thread*
  exits, whatever the worker is doing, even blocked in C with the interpreter lock held. It is
  set only when that parent thread is the owner's main thread (or the fork server's only
  thread): a loader started from another thread would otherwise lose its worker when that
  thread ends.
- A watchdog thread waits on the owner's pid (a pidfd, else polling) and exits the process
  when the owner is gone: for when the death signal could not be set, or the worker's parent
  thread is not the owner's main thread. It needs the interpreter lock, so it cannot end a
  worker stuck in C code that holds it.

Under the fork server, the worker's parent is the server, which exits once every copy of the
write end of its "alive" pipe is closed: the owner holds one, and multiprocessing hands one to
each process the server forks (for their own children's use). A worker that kept it would keep
the server, and so its own death signal, alive after the owner died; ``release_fork_server``
closes the worker's copy, so that the owner's death ends the server and the server's ends the
worker, even one blocked in C with the interpreter lock held.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["release_fork_server", "watch_owner"]

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


def release_fork_server(start_method: str) -> None:
    """Close this process's copy of the fork server's "alive" pipe, unless this process's own
    children are started by the fork server (``start_method``), which needs it."""
    if start_method == "forkserver":
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    server._forkserver_alive_fd = None
    with contextlib.suppress(OSError):
        os.close(fd)


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
