"""How many intra-op (OpenMP) threads each IPU worker thread uses, and how it sets them.

[Note: per-thread intra-op threads]
With this torch build (ATen parallel backend OpenMP, libgomp; see
``torch.__config__.parallel_info()``) ``torch.set_num_threads(n)`` *is* per calling thread,
with one trap. It calls ``omp_set_num_threads`` (an OpenMP ICV, which belongs to the calling
thread) and ``mkl_set_num_threads_local``, so two worker threads can run with 1 and 4 threads
while the main thread keeps its own count; each worker that runs a parallel region becomes the
master of its own OpenMP team, whose threads exit with the worker. The trap: ATen also stores
the count in one process-wide atomic, and a thread's *first* parallel op (or
``torch.get_num_threads()``) lazily re-applies that global value to the thread
(``at::internal::lazy_init_num_threads``). Measured here (``torch 2.14.1``):

    ================================================  =========================
    worker: set_num_threads(1); main then sets 2;     worker runs with 2 threads
    worker's first op runs afterwards                 (the lazy init overrode it)
    same, but the worker called get_num_threads()     worker keeps 1
    before set_num_threads(1)
    a new thread started after workers set 1          starts with 1 (global leaked)
    main calls set_num_threads(old) after that        new threads start with old
    ================================================  =========================

So each worker first calls ``torch.get_num_threads()`` (forcing its lazy init), then
``torch.set_num_threads(n)``; once every worker has set its count (at start-up, and after a run
in which some worker took a new count) the runtime restores the global default from a fresh,
short-lived thread that sets the main thread's count and exits, which leaves every live thread's
own count alone. How many threads each worker gets is decided in ``cores.py`` (See [Note: cores
follow the work]).

Oversubscription is expensive with libgomp: its team threads spin at barriers. On the shared
two-core build machine (load average ~10), eager fwd+bwd of two 256-wide dense layers on 8
micro-batches took 27 ms on one intra-op thread and 3,600 ms on two — one reason the default
divides the cores between the workers rather than letting each use them all.

[Note: idle teams slow every team]
A thread's OpenMP team outlives its parallel regions: its threads wait in the thread's pool
until the thread exits. libgomp counts every pooled thread, busy or not, and once it counts
more threads than CPUs every team in the process (the caller's own eager ops included) spins
only briefly at its barriers before sleeping in the kernel, so each parallel op pays wake-ups.
Measured on dev-zen4 (2 cores, quiet): the main thread's loop of 512-wide linears on 64 rows
took 8.5-9.1 ms before, and 10.6-11.2 ms while four idle threads each held a 2-thread team;
8.6-8.8 ms once each had freed its team. So a worker that ran on more than one intra-op thread
frees its team when it goes idle (``release_team``: OpenMP 5's ``omp_pause_resource_all``,
which frees the calling thread's pool), not after each op: a freed team costs a thread start
at its next parallel op, measured 80 us (quiet) to 3 ms (loaded) on the same machine.

On a machine loaded by other processes the short spin is the better one: a spinning barrier
waits out whole time slices of a descheduled team thread (the same loop took 320 ms spinning
and 18 ms sleeping there, ``benchmarks/idle_teams.py``). Freeing the teams gives the caller
what plain PyTorch gives on that machine, whichever way that goes.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

import torch

from .. import env
from ..errors import Error

__all__ = [
    "pinned_threads_per_ipu",
    "resolve_threads_per_ipu",
    "set_worker_threads",
    "restore_default_threads",
    "release_team",
]

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the threads, keep nothing else


def _pause_function() -> Callable[[int], int] | None:
    """``omp_pause_resource_all`` of the OpenMP runtime torch loaded (never loads another)."""
    for name in ("libgomp.so.1", "libomp.so", "libiomp5.so", "libomp.dylib"):
        try:
            library = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            pause = library.omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        return pause
    return None


_PAUSE = _pause_function()


def pinned_threads_per_ipu(explicit: int | None) -> int | None:
    """Intra-op threads per worker pinned by ``explicit``, else by
    ``POPTORCH_SIM_THREADS_PER_IPU``; None when neither pins a count.

    Raises:
        Error: the pinned count is smaller than 1.
    """
    value = explicit if explicit is not None else env.threads_per_ipu()
    if value is not None and value < 1:
        raise Error(
            f"threads_per_ipu must be at least 1, got {value} (from "
            f"{'the threads_per_ipu argument' if explicit is not None else 'POPTORCH_SIM_THREADS_PER_IPU'})"
        )
    return value


def resolve_threads_per_ipu(explicit: int | None, num_workers: int) -> int:
    """Intra-op threads per worker: the pinned count (``pinned_threads_per_ipu``), else the
    main thread's count divided evenly between the workers (at least 1).

    Raises:
        Error: the pinned count is smaller than 1.
    """
    value = pinned_threads_per_ipu(explicit)
    if value is None:
        return max(1, torch.get_num_threads() // max(1, num_workers))
    return value


def set_worker_threads(count: int) -> None:
    """Give the calling (worker) thread ``count`` intra-op threads.

    See [Note: per-thread intra-op threads].
    """
    torch.get_num_threads()  # force this thread's lazy init before setting its own count
    torch.set_num_threads(count)


def restore_default_threads(count: int) -> None:
    """Reset the process-wide default that new threads inherit to ``count``, leaving the count
    of every live thread (the caller's included) as it is.

    See [Note: per-thread intra-op threads].
    """

    def reset() -> None:
        torch.get_num_threads()  # this thread's lazy init first, as a worker's
        torch.set_num_threads(count)

    thread = threading.Thread(target=reset, name="poptorch_sim thread-count reset")
    thread.start()
    thread.join()


def release_team() -> None:
    """Free the calling thread's OpenMP team; its next parallel op starts a new one.

    See [Note: idle teams slow every team]. Call it from a worker thread going idle, outside any
    parallel region; it does nothing where no OpenMP runtime with OpenMP 5's pause is loaded.
    """
    if _PAUSE is not None:
        _PAUSE(OMP_PAUSE_SOFT)
