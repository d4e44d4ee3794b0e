"""``poptorch.AsynchronousDataAccessor``: loads batches ahead of the model in a worker process."""

from __future__ import annotations

import weakref
from typing import Any

from ..enums import SharingStrategy
from ..errors import createPoptorchError
from ..logger import logger
from .arguments import check_accessor_arguments
from .epoch_source import EpochSource
from .prefetch import Item
from .worker_process import WorkerProcess

__all__ = ["AsynchronousDataAccessor"]

_FAILED_TO_START = "AsynchronousDataAccessor worker thread failed to start (Check above for details)"  # PopTorch's words, though its worker is a process too


class AsynchronousDataAccessor:
    """Iterate over ``dataset`` with batches prefetched by a worker process.

    PopTorch's accessor for hiding data loading behind the model: iterating it returns exactly
    what iterating ``dataset`` returns, in the same order, while the next ``buffer_size`` batches
    are already being loaded. Iterate it once per epoch; with ``load_indefinitely`` the next
    epoch is prefetched as soon as the previous one is exhausted. An exception raised by the
    dataset reaches the caller unchanged (same type and message, with a note saying where it was
    raised), at the batch where it happened.

    As PopTorch's, the accessor starts a worker process, as ``sharing_strategy`` says, that
    iterates ``dataset`` (a DataLoader's own worker processes are its children) and hands batches
    over in shared memory through a ring of ``buffer_size`` slots; see [Note: sharing
    strategies] in ``sharing.py``, [Note: the accessor's worker process] in
    ``worker_process.py`` and [Note: prefetch epochs] in ``prefetch.py``. The dataset is used in
    the worker: changes the parent makes to it after the accessor starts are not seen. The
    worker starts from the parent's torch and Python random states, whatever the strategy.

    Simulated: PopTorch returns views of its ring buffer, which later batches overwrite; here
    each batch is copied out of its slot into memory of its own and is never overwritten. The
    worker runs torch on one thread (as torch's data-loader workers do), and
    ``miss_sleep_time_in_ms`` is accepted but has no effect (waits poll every 50 ms).

    Args:
        dataset: any iterable: a ``poptorch.DataLoader``, a torch ``DataLoader``, a
            ``torch.utils.data.Dataset`` or ``IterableDataset``. Each element must be a tensor,
            a flat list/tuple of tensors, a dict of tensors or an object of a type registered
            with ``poptorch.registerCustomArgParser``.
        buffer_size: how many batches to load ahead (default 3).
        miss_sleep_time_in_ms: accepted for compatibility (default 0.1).
        load_indefinitely: start loading the next epoch as soon as one ends (default True).
        early_preload: keep loading past the first batch before the first ``iter()``
            (default False: only the first batch is loaded at construction).
        sharing_strategy: how the worker process is started and receives ``dataset``
            (default ``SharingStrategy.ForkServer``; ``Fork`` forks this process).
        rebatched_size: if set, return batches of exactly this many rows, re-cut from the
            dataset's batches (must be > 1).

    Raises:
        poptorch.Error: ``dataset`` is a DataLoader already in ``Async`` mode; the dataset is
            empty; the dataset failed while loading its first element ("...failed to start",
            chained to the original exception); the dataset cannot be pickled for a
            ``sharing_strategy`` other than ``Fork``.
        AssertionError: ``drop_last=False`` DataLoader without ``rebatched_size``;
            ``rebatched_size <= 1``.

    >>> import torch
    >>> accessor = AsynchronousDataAccessor(torch.utils.data.TensorDataset(torch.arange(4)))
    >>> [int(x[0]) for x in accessor]
    [0, 1, 2, 3]
    >>> accessor.terminate()
    """

    def __init__(
        self,
        dataset: Any,
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
        rebatched_size: int | None = None,
    ) -> None:
        self._worker: WorkerProcess | None = None
        check_accessor_arguments(dataset, rebatched_size)
        self.rebatched_size = rebatched_size
        self._embedded = getattr(dataset, "_embedding_accessor", False)
        # A DataLoader that owns this accessor is held weakly (it holds us); anything else
        # strongly. Nothing the worker process uses refers to the accessor strongly, so dropping
        # the last user reference still finalises (and terminates) the accessor.
        self._dataset_ref = weakref.ref(dataset) if self._embedded else (lambda d=dataset: d)
        self._generation = 0
        self._used = False
        self._at_eof = False
        self._start(
            buffer_size, load_indefinitely, early_preload, SharingStrategy(sharing_strategy)
        )

    def _start(
        self,
        buffer_size: int,
        load_indefinitely: bool,
        early_preload: bool,
        sharing_strategy: SharingStrategy,
    ) -> None:
        worker = WorkerProcess(
            EpochSource(self._dataset_ref(), self.rebatched_size),
            buffer_size,
            load_indefinitely,
            early_preload,
            sharing_strategy,
            name="poptorch_sim-AsynchronousDataAccessor",
        )
        self._worker = worker
        # Runs on terminate(), on garbage collection, and at interpreter exit (atexit) while
        # holding no reference to self.
        self._finalizer = weakref.finalize(self, worker.close)
        try:
            result = worker.start()
        except BaseException:
            self.terminate()
            raise
        if result.kind == "ok":
            return
        self.terminate()
        if result.kind == "empty":
            raise createPoptorchError("The Dataset is empty")
        logger.error(
            "AsynchronousDataAccessor: loading the first element failed: %s: %s",
            type(result.error).__name__,
            result.error,
        )
        raise createPoptorchError(_FAILED_TO_START) from result.error

    def terminate(self) -> None:
        """Stop the worker process and the data loader's worker processes (idempotent).

        >>> import torch
        >>> AsynchronousDataAccessor(torch.utils.data.TensorDataset(torch.arange(2))).terminate()
        """
        if self._worker is not None:
            self._finalizer()
            self._worker = None

    def __del__(self) -> None:
        self.terminate()

    def __len__(self) -> int:
        dataset = self._dataset_ref()
        length = len(dataset)
        if self.rebatched_size and not self._embedded:
            rows = length * (getattr(dataset, "batch_size", None) or 1)
            length = rows // self.rebatched_size
        return length

    def __iter__(self) -> AsynchronousDataAccessor:
        worker = self._live_worker()
        if self._used or self._at_eof:
            # Finished or stopped part-way: move to the next epoch (see [Note: prefetch epochs]).
            self._generation += 1
        self._used = False
        self._at_eof = False
        worker.request_epoch(self._generation)
        return self

    def __next__(self) -> Any:
        if self._at_eof:
            raise StopIteration
        worker = self._live_worker()
        worker.request_epoch(self._generation)
        while True:
            item = worker.get()
            if item.generation >= self._generation:
                break
        return self._deliver(item)

    def _deliver(self, item: Item) -> Any:
        self._used = True
        if item.kind == "data":
            return item.payload
        self._at_eof = True
        if item.kind == "eof":
            raise StopIteration
        error = item.payload
        error.add_note(
            f"(raised while loading epoch {item.generation} in the AsynchronousDataAccessor "
            "worker process)"
        )
        raise error

    def _live_worker(self) -> WorkerProcess:
        if self._worker is None:
            raise createPoptorchError(
                "This AsynchronousDataAccessor has been terminated: create a new one (or, for a "
                "poptorch.DataLoader, iterate the DataLoader again) to load more data."
            )
        return self._worker
