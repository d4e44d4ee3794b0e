"""Data-loader worker processes: how many to start, and shutting them down deterministically."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..logger import debug_once

__all__ = ["available_cores", "capped_num_workers", "shutdown_workers"]

_FEEDER_JOIN_S = 2.0


def available_cores() -> int:
    """Number of CPU cores this process may run on (its affinity mask, else ``os.cpu_count``).

    >>> available_cores() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def capped_num_workers(requested: int, is_iterable: bool) -> int:
    """The number of worker processes to start for ``requested`` (``num_workers``).

    Map-style datasets get at most one worker process per available core: PopTorch programs
    ask for ``num_workers=16`` (sized for an IPU-POD host) and on a small machine that many
    processes only fight over the cores. Batches, their contents and their order do not depend on
    the number of workers, so the cap is invisible except in speed. IterableDatasets are not
    capped: there each worker runs its own copy of the iterator and the number of workers
    changes what is yielded.

    Args:
        requested: the user's ``num_workers``.
        is_iterable: whether the dataset is a ``torch.utils.data.IterableDataset``.

    Returns:
        The number of worker processes to use.

    >>> capped_num_workers(0, False)
    0
    """
    cores = available_cores()
    if is_iterable or requested <= cores:
        return requested
    debug_once(
        f"DataLoader: num_workers={requested} capped to {cores} worker processes, one per CPU "
        "core this process may use (Simulated: more processes than cores only slow loading "
        "down; batches are unchanged)."
    )
    return cores


def shutdown_workers(iterator: Any, loader: Any, final: bool) -> None:
    """Stop the worker processes behind an epoch iterator that is finished or abandoned.

    Args:
        iterator: an epoch iterator (a torch data-loader iterator, a generator over one, or any
            iterator); may be None.
        loader: the iterable the iterator came from (a torch ``DataLoader`` or anything else);
            may be None.
        final: also stop the loader's persistent workers (kept between epochs otherwise).
    """
    persistent = getattr(loader, "_iterator", None)
    if iterator is not persistent:
        _stop_torch_iterator(iterator)
    close = getattr(iterator, "close", None)
    if callable(close):
        # A generator over a torch iterator: closing it drops its reference to the torch
        # iterator, whose finaliser shuts a non-persistent one down.
        close()
    if final and isinstance(loader, torch.utils.data.DataLoader) and persistent is not None:
        loader._iterator = None
        _stop_torch_iterator(persistent)


def _stop_torch_iterator(iterator: Any) -> None:
    """Shut down a torch multi-process iterator's workers and wait for its queue threads."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if not callable(stop):
        return
    stop()
    # The index queues' feeder threads exit once their queue is closed; wait for them so
    # that no thread outlives terminate().
    for index_queue in getattr(iterator, "_index_queues", ()):
        feeder = getattr(index_queue, "_thread", None)
        if feeder is not None:
            feeder.join(_FEEDER_JOIN_S)
