"""The large tensors of IPU worker threads, from a pool kept mapped between steps.

See [Note: worker memory] in ``csrc/engine/worker_memory.cpp``: on the threads that ``enter``
(IPU workers, replica threads) and on the caller's thread during a call (``pooled``), blocks of
128 KiB and more come from a pool of blocks already faulted in, instead of fresh pages from the
kernel each step; every other allocation goes to PyTorch's allocator as before.
``POPTORCH_SIM_WORKER_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .. import env

__all__ = ["WorkerMemoryStats", "enter", "pooled", "stats", "trim"]

_thread = threading.local()  # .pooled: whether this thread's large tensors come from the pool


class WorkerMemoryStats(NamedTuple):
    """The pool's bytes and requests since the process started."""

    in_use_bytes: int
    idle_bytes: int
    peak_bytes: int  # the most bytes its tensors held at once
    reused: int  # requests served by an idle block
    new_blocks: int  # requests that mapped a new block


def _ops() -> object | None:
    """``torch.ops.poptorch_sim`` with the C++ kernels loaded, or None where they are not built."""
    from ..kernels.engine import load_library

    try:
        load_library()
    except ImportError:
        return None
    return torch.ops.poptorch_sim


def enter(on: bool = True) -> bool:
    """The calling thread's large tensors come from the pool from now on (unless
    ``POPTORCH_SIM_WORKER_MEMORY=0`` or the kernels are not built), or no longer (``on``
    False). Returns whether they do."""
    ops = _ops() if env.worker_memory() or not on else None
    now = ops is not None and bool(ops.enter_worker_memory(on)) and on  # type: ignore[attr-defined]
    _thread.pooled = now
    return now


@contextmanager
def pooled() -> Iterator[None]:
    """The calling thread's large tensors come from the pool inside the block (as ``enter``)."""
    if getattr(_thread, "pooled", False) or not enter():
        yield
        return
    try:
        yield
    finally:
        enter(False)


def trim() -> int:
    """Free the pool's idle blocks; returns their bytes.

    A pipeline's finalizer calls it, and the garbage collector runs finalizers wherever it
    starts: inside another model's capture too, whose torch-function and dispatch modes then
    recorded the call into that graph or failed on it. The call leaves them out.
    """
    ops = _ops()
    if ops is None:
        return 0
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        return int(ops.trim_worker_memory())  # type: ignore[attr-defined]


def stats() -> WorkerMemoryStats:
    """The pool's figures (all zero where it never served a thread)."""
    ops = _ops()
    values = [0] * 5 if ops is None else ops.worker_memory_stats()  # type: ignore[attr-defined]
    return WorkerMemoryStats(*values)
