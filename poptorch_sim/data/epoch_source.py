"""What the accessor's worker process iterates: epochs of a dataset, re-batched if asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..logger import logger
from .rebatch import rebatch
from .workers import shutdown_workers

__all__ = ["EpochSource"]


class EpochSource:
    """Opens and closes the epochs of ``dataset`` in the worker process.

    It is sent to the worker whole (pickled, unless the worker is forked), so it holds nothing
    but the dataset and the re-batching size.

    Args:
        dataset: any iterable; a ``poptorch.DataLoader`` is iterated through its synchronous
            epochs (``_open_epoch``).
        rebatched_size: if set, re-cut the epoch into batches of exactly this many rows.

    >>> import torch
    >>> source = EpochSource(torch.utils.data.TensorDataset(torch.arange(3)), None)
    >>> [int(x[0]) for x in source.open()]
    [0, 1, 2]
    """

    def __init__(self, dataset: Any, rebatched_size: int | None) -> None:
        self.dataset = dataset
        self.rebatched_size = rebatched_size

    def open(self) -> Iterator[Any]:
        """A fresh iterator over one epoch."""
        open_epoch = getattr(self.dataset, "_open_epoch", None)
        iterator = open_epoch() if callable(open_epoch) else iter(self.dataset)
        if self.rebatched_size is None:
            return iterator  # type: ignore[no-any-return]
        drop_last = getattr(self.dataset, "rebatched_drop_last", True)
        return rebatch(iterator, self.rebatched_size, drop_last)

    def close(self, iterator: Iterator[Any] | None, final: bool) -> None:
        """Stop the worker processes behind a finished or abandoned epoch (never raises)."""
        try:
            shutdown_workers(iterator, self.dataset, final)
        except Exception as error:  # shutting down must not raise
            logger.debug("AsynchronousDataAccessor: worker shutdown failed: %s", error)
