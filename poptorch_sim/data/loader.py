"""``poptorch.DataLoader``: a torch DataLoader whose batches are one model call's worth of data."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from ..enums import DataLoaderMode
from .accessor import AsynchronousDataAccessor
from .arguments import (
    check_batch_sampler,
    check_iterable,
    check_options,
    warn_incomplete,
    warn_incomplete_sampler,
)
from .combined import combined_batch_size, loader_length, plan_rebatching
from .process_block import partition
from .rebatch import combine_batches
from .workers import capped_num_workers, shutdown_workers

__all__ = ["DataLoader"]


class _AsyncEpoch:
    """An epoch of an asynchronous ``DataLoader``: the accessor's iterator, holding the loader.

    The loader holds its accessor and terminates it when it is collected; the accessor holds the
    loader only weakly, so that dropping the loader stops the worker process. In
    ``for batch in poptorch.DataLoader(opts, ds, mode=DataLoaderMode.Async)`` the loader is a
    temporary: this iterator keeps it alive (as PopTorch's accessor keeps its loader) until the
    loop lets go of the iterator.
    """

    def __init__(self, loader: DataLoader, accessor: AsynchronousDataAccessor) -> None:
        self._loader = loader
        self._accessor = accessor

    def __iter__(self) -> _AsyncEpoch:
        return self

    def __next__(self) -> Any:
        return next(self._accessor)

    def __len__(self) -> int:
        return len(self._accessor)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_loader", "_accessor"):
            raise AttributeError(name)
        return getattr(self._accessor, name)


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A torch ``DataLoader`` that yields exactly one model call's worth of data per batch.

    Each batch holds ``combinedBatchSize = batch_size x deviceIterations x (replicationFactor //
    input_group_size) x gradientAccumulation`` consecutive elements, which is the host batch
    ``trainingModel``/``inferenceModel`` expect. In a distributed run
    (``Options.Distributed.numProcesses > 1``) each process reads its own contiguous block of the
    dataset (see [Note: distributed partitioning] in ``process_block.py``). With
    ``mode=DataLoaderMode.Async`` batches are prefetched by an
    :class:`AsynchronousDataAccessor`; with ``AsyncRebatched`` the workers load
    ``rebatched_worker_size`` rows at a time and the accessor re-cuts them to the combined size.

    Simulated: ``num_workers`` larger than the number of CPU cores this process may use is capped
    at that number for map-style datasets (logged once at debug level): batches and their order
    are unchanged, only fewer processes compete for the cores. ``terminate()`` also shuts down
    the persistent worker processes of a ``Sync`` loader (they restart on the next iteration).

    Args:
        options: the ``poptorch.Options`` the model is compiled with (frozen by this call).
        dataset: a map-style ``Dataset`` or an ``IterableDataset``.
        batch_size: the micro-batch size (default 1); None disables batching.
        shuffle: shuffle every epoch (default False).
        num_workers: worker processes loading the data (default 0: load in this process).
        drop_last: drop the last incomplete combined batch (default True, unlike torch).
        persistent_workers: keep worker processes between epochs (default ``num_workers > 0``).
        auto_distributed_partitioning: split the dataset between processes (default True).
        mode: ``DataLoaderMode.Sync`` (default), ``Async`` or ``AsyncRebatched``.
        async_options: keyword arguments for the ``AsynchronousDataAccessor``.
        rebatched_worker_size: rows per worker batch with ``AsyncRebatched`` (default: the
            combined batch size; must not exceed it).
        batch_sampler: yields lists of indices; ``num_batches_to_combine`` of its batches are
            concatenated into one combined batch. Exclusive with ``batch_size``/``shuffle``.
        **kwargs: passed on to ``torch.utils.data.DataLoader``.

    Raises:
        poptorch.Error: ``batch_sampler`` combined with ``batch_size``/``shuffle`` or with
            distributed auto-partitioning.
        AssertionError: PopTorch's checks (options type, distributed shuffling without
            ``randomSeed``, ``rebatched_worker_size`` too large, ...).

    >>> from poptorch_sim.options import Options
    >>> ds = torch.utils.data.TensorDataset(torch.arange(8))
    >>> [b[0].tolist() for b in DataLoader(Options().deviceIterations(2), ds, batch_size=2)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    """

    def __init__(
        self,
        options: Any,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options: dict[str, Any] | None = None,
        rebatched_worker_size: int | None = None,
        batch_sampler: torch.utils.data.Sampler[Sequence[int]]
        | Iterable[Sequence[int]]
        | None = None,
        **kwargs: Any,
    ) -> None:
        self._accessor: AsynchronousDataAccessor | None = None
        self._embedding_accessor = False
        self._async_mode = False
        self._is_user_batch_sampler_set = batch_sampler is not None
        if self._is_user_batch_sampler_set:
            batch_size = check_batch_sampler(
                options, batch_sampler, batch_size, shuffle, auto_distributed_partitioning
            )
            self.batch_sampler_drop_last = drop_last
        elif shuffle is None:
            shuffle = False
        check_options(options)
        options._freeze()
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self._options = options
        self._num_batches_to_combine, self._combined_batch_size = combined_batch_size(
            options, batch_size
        )
        self._is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._shuffle_map_style_data_in_distributed_env = False
        if self._is_iterable:
            check_iterable(options, auto_distributed_partitioning, num_workers, kwargs)
        else:
            self._warn_incomplete(options, dataset, batch_sampler, batch_size, drop_last)
            if options.Distributed.numProcesses > 1 and auto_distributed_partitioning:
                dataset = partition(
                    options, dataset, self._combined_batch_size, shuffle, drop_last
                )
                # The permutation is global (the same in every process); shuffling again inside
                # the block would make the processes' blocks overlap.
                self._shuffle_map_style_data_in_distributed_env = bool(shuffle)
                shuffle = False

        self._plan = plan_rebatching(
            DataLoaderMode(mode),
            self._combined_batch_size,
            drop_last,
            self._is_user_batch_sampler_set,
            rebatched_worker_size,
        )
        self._rebatched_size = self._plan.rebatched_size
        self.rebatched_drop_last = self._plan.rebatched_drop_last
        torch_drop_last = self._plan.torch_drop_last
        if batch_size is None and not self._is_user_batch_sampler_set:
            torch_drop_last = False  # torch rejects drop_last without batching; nothing to drop
        super().__init__(
            dataset,
            batch_size=self._plan.worker_batch_size,
            shuffle=shuffle,
            batch_sampler=batch_sampler,
            num_workers=capped_num_workers(num_workers, self._is_iterable),
            drop_last=torch_drop_last,  # type: ignore[arg-type]  # None with a batch_sampler
            persistent_workers=persistent_workers,
            **kwargs,
        )
        self._async_options = dict(async_options or {})
        if self._plan.mode != DataLoaderMode.Sync:
            if "rebatched_size" in self._async_options:
                raise AssertionError(
                    "You cannot use DataLoaderMode.AsyncRebatched and manually specify the "
                    "rebatched_size in async_options"
                )
            self._async_mode = True
            self._accessor = self._create_accessor()

    def _warn_incomplete(
        self,
        options: Any,
        dataset: Any,
        batch_sampler: Any,
        batch_size: int | None,
        drop_last: bool,
    ) -> None:
        if not self._is_user_batch_sampler_set:
            per_step = (self._combined_batch_size or 0) * options.Distributed.numProcesses
            warn_incomplete(dataset, per_step, drop_last)
        elif not drop_last:
            count = self._num_batches_to_combine or 1
            warn_incomplete_sampler(batch_sampler, count, batch_size, self._combined_batch_size)

    def _create_accessor(self) -> AsynchronousDataAccessor:
        self._embedding_accessor = True
        try:
            return AsynchronousDataAccessor(
                self, **self._async_options, rebatched_size=self._rebatched_size
            )
        finally:
            self._embedding_accessor = False

    def __getstate__(self) -> dict[str, Any]:
        """What is pickled to send the loader to the accessor's worker process: not the
        accessor, nor torch's persistent iterator (processes and pipes of this process)."""
        state = self.__dict__.copy()
        state["_accessor"] = None
        state["_iterator"] = None
        return state

    # ---- iteration -------------------------------------------------------------------------
    def _open_epoch(self) -> Iterator[Any]:
        """A synchronous iterator over one epoch (holds no reference to the loader)."""
        if self._shuffle_map_style_data_in_distributed_env:
            self.dataset.shuffle_global_indices()
            self.dataset.swap_range()
        iterator = super().__iter__()
        count = self._num_batches_to_combine
        if self._is_user_batch_sampler_set and count not in (None, 1):
            return combine_batches(iterator, count, bool(self.batch_sampler_drop_last))
        return iterator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if not self._async_mode:
            return self._open_epoch()
        if self._accessor is None:
            self._accessor = self._create_accessor()
        return _AsyncEpoch(self, iter(self._accessor))

    def __len__(self) -> int:
        user_sampler = self._is_user_batch_sampler_set
        count = self._num_batches_to_combine if user_sampler else None
        drop_last = self.batch_sampler_drop_last if user_sampler else self.rebatched_drop_last
        num_elements = 0 if self._is_iterable and not self._rebatched_size else len(self.dataset)
        torch_length = 0 if self._rebatched_size and count is None else super().__len__()
        return loader_length(self._plan, drop_last, num_elements, torch_length, count)

    @property
    def combinedBatchSize(self) -> int | None:
        """Elements consumed from the dataset by one model call (None without batching)."""
        return self._combined_batch_size

    @property
    def options(self) -> Any:
        """The ``poptorch.Options`` this loader was built with."""
        return self._options

    def terminate(self) -> None:
        """Stop the asynchronous worker process and the loader's worker processes (idempotent).

        Iterating the loader again afterwards starts them afresh.
        """
        accessor = getattr(self, "_accessor", None)
        if accessor is not None:
            self._accessor = None
            accessor.terminate()
        if getattr(self, "_iterator", None) is not None:
            shutdown_workers(None, self, final=True)

    def __del__(self) -> None:
        try:
            self.terminate()
        except Exception:  # during interpreter shutdown module globals may be gone
            pass
