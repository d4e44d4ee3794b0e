"""The input pipeline: ``poptorch.DataLoader`` and ``poptorch.AsynchronousDataAccessor``.

    loader.py         ``DataLoader``: batches of one model call (the combined batch size)
    rebatch.py        combining the user's batches into one model call's batch
    process_block.py  the contiguous block of the dataset one process reads (several processes)
    workers.py        capping and shutting down the worker processes
    accessor.py       ``AsynchronousDataAccessor``: batches loaded ahead of the model
    prefetch.py       the loading loop, epoch by epoch (a thread, or the worker process's)
    worker_process.py the accessor's worker process and its requests
    ring.py           the shared-memory slots batches cross in

The datasets themselves (MNIST, or its generated stand-in offline) are ``poptorch_sim.datasets``.
"""

from __future__ import annotations

from .accessor import AsynchronousDataAccessor
from .loader import DataLoader

__all__ = ["AsynchronousDataAccessor", "DataLoader"]
