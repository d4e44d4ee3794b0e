"""The large tensors of IPU worker threads, from a pool kept mapped between steps.

See [Note: worker memory] in ``csrc/engine/worker_memory.cpp``: on the threads that ``enter``
(IPU workers, replica threads), blocks of 128 KiB and more come from a pool of blocks already
faulted in, instead of fresh pages from the kernel each step; every other thread's allocations
go to PyTorch's allocator as before. ``POPTORCH_SIM_WORKER_MEMORY=0`` turns it off.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import env

__all__ = ["WorkerMemoryStats", "enter", "stats", "trim"]


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


def enter() -> bool:
    """The calling thread's large tensors come from the pool from now on (unless
    ``POPTORCH_SIM_WORKER_MEMORY=0`` or the kernels are not built). Returns whether they do."""
    ops = _ops() if env.worker_memory() else None
    return ops is not None and bool(ops.enter_worker_memory(True))  # type: ignore[attr-defined]


def trim() -> int:
    """Free the pool's idle blocks; returns their bytes."""
    ops = _ops()
    return 0 if ops is None else int(ops.trim_worker_memory())  # type: ignore[attr-defined]


def stats() -> WorkerMemoryStats:
    """The pool's figures (all zero where it never served a thread)."""
    ops = _ops()
    values = [0] * 5 if ops is None else ops.worker_memory_stats()  # type: ignore[attr-defined]
    return WorkerMemoryStats(*values)
