"""The input pipeline: ``poptorch.DataLoader`` and ``poptorch.AsynchronousDataAccessor``.

    loader.py         ``DataLoader``: batches of one model call (the combined batch size)
    combined.py       the combined batch size, and how a loader makes its combined batches
    arguments.py      PopTorch's checks and warnings on the loader's and accessor's arguments
    batch.py          batch structures: tensors, flat containers, registered custom types
    rebatch.py        combining the user's batches into one model call's batch
    process_block.py  the contiguous block of the dataset one process reads (several processes)
    workers.py        capping and shutting down the worker processes
    accessor.py       ``AsynchronousDataAccessor``: batches loaded ahead of the model
    epoch_source.py   what the accessor's worker iterates: epochs of the dataset
    prefetch.py       the loading loop, epoch by epoch (a thread, or the worker process's)
    worker_process.py the accessor's worker process, from the parent: start, read, stop
    worker_main.py    the worker process itself: entry point and loading loop
    sharing.py        starting the worker for each ``SharingStrategy`` (the fork server)
    owner_watch.py    the worker ends when its owner dies
    ring.py           the shared-memory slots batches cross in

The datasets themselves (MNIST, or its generated stand-in offline) are ``poptorch_sim.datasets``.
"""

from __future__ import annotations

from .accessor import AsynchronousDataAccessor
from .loader import DataLoader

__all__ = ["AsynchronousDataAccessor", "DataLoader"]
