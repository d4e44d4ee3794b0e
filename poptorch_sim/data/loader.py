"""``poptorch.DataLoader``: a torch DataLoader whose batches are one model call's worth of data."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from ..enums import DataLoaderMode
from ..errors import createPoptorchError
from ..logger import logger
from ..options import Options
from .accessor import AsynchronousDataAccessor
from .process_block import SubDataset
from .rebatch import combine_batches
from .workers import capped_num_workers, shutdown_workers

__all__ = ["DataLoader", "combined_batch_size"]


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


def combined_batch_size(options: Any, batch_size: int | None) -> tuple[int | None, int | None]:
    """Batches per model call and rows per model call for a micro-batch of ``batch_size``.

    One model call consumes ``deviceIterations x (replicationFactor // input_group_size) x
    gradientAccumulation`` micro-batches, laid out ``[DI, GA, R // G, mb]`` (§2.1).

    Args:
        options: a ``poptorch.Options``.
        batch_size: the micro-batch size, or None for no batching.

    Returns:
        ``(num_batches_to_combine, combined_batch_size)``, both None if ``batch_size`` is None.

    >>> class O:
    ...     device_iterations, replication_factor, input_group_size = 2, 4, 2
    ...     class Training:
    ...         gradient_accumulation = 3
    >>> combined_batch_size(O, 5)
    (12, 60)
    """
    if batch_size is None:
        return None, None
    groups = options.replication_factor // getattr(options, "input_group_size", 1)
    count = options.device_iterations * groups * options.Training.gradient_accumulation
    return count, batch_size * count


def _check_options(options: Any) -> None:
    if not isinstance(options, Options):
        raise AssertionError(
            f"poptorch.DataLoader expects a poptorch.Options as its first argument, got "
            f"{type(options).__name__}: pass the Options the model will be compiled with"
        )


def _batch_sampler_len(batch_sampler: Any) -> int | None:
    try:
        length = len(batch_sampler)
    except (TypeError, NotImplementedError):
        return None
    return None if length is NotImplemented else length


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
            batch_size = self._check_batch_sampler(
                options, batch_sampler, batch_size, shuffle, auto_distributed_partitioning
            )
            self.batch_sampler_drop_last = drop_last
            drop_last = None  # type: ignore[assignment]  # torch requires it unset
        elif shuffle is None:
            shuffle = False
        _check_options(options)
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
            self._check_iterable(options, auto_distributed_partitioning, num_workers, kwargs)
        else:
            self._warn_incomplete(options, dataset, batch_sampler, batch_size, drop_last)
            if options.Distributed.numProcesses > 1 and auto_distributed_partitioning:
                dataset, shuffle = self._partition(options, dataset, shuffle, drop_last)

        mode = DataLoaderMode(mode)
        worker_batch_size, drop_last, mode = self._plan_rebatching(
            mode, batch_size, drop_last, rebatched_worker_size
        )
        if batch_size is None and not self._is_user_batch_sampler_set:
            drop_last = False  # torch rejects drop_last without batching; nothing to drop
        super().__init__(
            dataset,
            batch_size=worker_batch_size,
            shuffle=shuffle,
            batch_sampler=batch_sampler,
            num_workers=capped_num_workers(num_workers, self._is_iterable),
            drop_last=drop_last,
            persistent_workers=persistent_workers,
            **kwargs,
        )
        self._async_options = dict(async_options or {})
        if mode != DataLoaderMode.Sync:
            if "rebatched_size" in self._async_options:
                raise AssertionError(
                    "You cannot use DataLoaderMode.AsyncRebatched and manually specify the "
                    "rebatched_size in async_options"
                )
            self._async_mode = True
            self._accessor = self._create_accessor()

    # ---- construction helpers --------------------------------------------------------------
    @staticmethod
    def _check_batch_sampler(
        options: Any,
        batch_sampler: Any,
        batch_size: int | None,
        shuffle: bool | None,
        auto_distributed_partitioning: bool,
    ) -> int | None:
        if batch_size != 1 or shuffle:
            raise createPoptorchError(
                "`batch_sampler` option is mutually exclusive with batch_size, shuffle."
            )
        if options.Distributed.numProcesses > 1 and auto_distributed_partitioning:
            raise createPoptorchError(
                "`batch_sampler` option is mutually exclusive with "
                "auto_distributed_partitioning=True."
            )
        return getattr(batch_sampler, "batch_size", batch_size)

    @staticmethod
    def _check_iterable(
        options: Any, auto_partitioning: bool, num_workers: int, kwargs: dict[str, Any]
    ) -> None:
        if auto_partitioning and options.Distributed.numProcesses != 1:
            raise AssertionError("auto_distributed_partitioning not supported for IterableDataset")
        if num_workers > 1 and "worker_init_fn" not in kwargs:
            logger.warning(
                "IterableDataset used with num_workers=%d but no worker_init_fn specified: as a "
                "result the DataLoader will return %d times each element in the dataset (See "
                "torch.utils.data.IterableDataset's documentation for more information)",
                num_workers,
                num_workers,
            )

    def _warn_incomplete(
        self,
        options: Any,
        dataset: Any,
        batch_sampler: Any,
        batch_size: int | None,
        drop_last: bool | None,
    ) -> None:
        """PopTorch's warnings when ``drop_last=False`` leaves an incomplete last batch."""
        if self._is_user_batch_sampler_set:
            if self.batch_sampler_drop_last:
                return
            self._warn_incomplete_sampler(batch_sampler, batch_size)
            return
        per_step = (self._combined_batch_size or 0) * options.Distributed.numProcesses
        if drop_last or not per_step or len(dataset) % per_step == 0:
            return
        logger.warning(
            "The number of elements in the dataset (%d) is not divisible by the number of "
            "elements processed per step (%d) and drop_last=False. The last tensor will have a "
            "batch size of %d. To avoid having to handle this special case switch to "
            "drop_last=True",
            len(dataset),
            per_step,
            len(dataset) % per_step,
        )

    def _warn_incomplete_sampler(self, batch_sampler: Any, batch_size: int | None) -> None:
        count = self._num_batches_to_combine or 1
        length = _batch_sampler_len(batch_sampler)
        if length is None:
            logger.warning(
                "The `batch_sampler` __len__ method is not implemented and drop_last=False. The "
                "last tensor may be incomplete - batch size < %d. To avoid having to handle this "
                "special case switch to drop_last=True.",
                count,
            )
        elif length % count:
            logger.warning(
                "The number of batches generated by the batch sampler (%d) is not divisible by "
                "the number of batches elements processed per step (%d) and drop_last=False. The "
                "last tensor will have a batch size of %d. To avoid having to handle this special "
                "case switch to drop_last=True. Batch size = %d, combined batch size = %d .",
                length,
                count,
                (length % count) * (batch_size or 1),
                batch_size or 1,
                self._combined_batch_size,
            )

    def _partition(
        self, options: Any, dataset: Any, shuffle: bool | None, drop_last: bool | None
    ) -> tuple[SubDataset, bool]:
        """This process's block of ``dataset``; shuffling moves from torch to the block."""
        seed = options.random_seed if options.exists("random_seed") else None
        if shuffle and seed is None:
            raise AssertionError(
                "When using auto_distributed_partitioning you must set "
                "poptorch.Options.randomSeed() to ensure that tensors are in the same order in "
                "all processes."
            )
        if self._combined_batch_size is None:
            raise AssertionError(
                "batch_size=None not allowed when using auto_distributed_partitioning."
            )
        sub = SubDataset(
            dataset,
            self._combined_batch_size,
            options.Distributed.numProcesses,
            options.Distributed.processId,
            bool(drop_last),
            seed,
        )
        # The permutation is global (the same in every process); shuffling again inside the
        # block would make the processes' blocks overlap.
        self._shuffle_map_style_data_in_distributed_env = bool(shuffle)
        return sub, False

    def _plan_rebatching(
        self,
        mode: DataLoaderMode,
        batch_size: int | None,
        drop_last: bool | None,
        rebatched_worker_size: int | None,
    ) -> tuple[int | None, bool | None, DataLoaderMode]:
        """Worker batch size, torch's drop_last and the mode, after deciding on re-batching.

        ``AsyncRebatched``, and ``Async`` with ``drop_last=False`` (whose short last batch a
        plain accessor cannot return), re-batch in the accessor: the workers load
        ``rebatched_worker_size`` rows and keep their leftovers, the accessor drops or returns
        the final short batch.
        """
        combined = self._combined_batch_size
        self._rebatched_size: int | None = None
        worker_batch_size = 1 if self._is_user_batch_sampler_set else combined
        real_drop_last = (
            self.batch_sampler_drop_last if self._is_user_batch_sampler_set else drop_last
        )
        wants_rebatch = mode == DataLoaderMode.AsyncRebatched or (
            mode == DataLoaderMode.Async and not real_drop_last
        )
        if not wants_rebatch or combined is None or combined <= 1:
            return worker_batch_size, drop_last, mode
        if rebatched_worker_size is not None:
            if rebatched_worker_size > combined:
                raise AssertionError(
                    f"The rebatched_worker_size ({rebatched_worker_size}) must be <= to the "
                    f"combined batch size ({combined})"
                )
            worker_batch_size = rebatched_worker_size
        self._rebatched_size = combined
        self.rebatched_drop_last = bool(real_drop_last)
        torch_drop_last = None if self._is_user_batch_sampler_set else False
        return worker_batch_size, torch_drop_last, DataLoaderMode.Async

    def _create_accessor(self) -> AsynchronousDataAccessor:
        self._embedding_accessor = True
        try:
            return AsynchronousDataAccessor(
                self, **self._async_options, rebatched_size=self._rebatched_size
            )
        finally:
            self._embedding_accessor = False

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
        if self._rebatched_size:
            num_elements = len(self.dataset)
            length = num_elements // self._rebatched_size
            if not self.rebatched_drop_last and num_elements % self._rebatched_size:
                length += 1
            return length
        length = super().__len__()
        count = self._num_batches_to_combine
        if self._is_user_batch_sampler_set and count not in (None, 1):
            rounding = math.floor if self.batch_sampler_drop_last else math.ceil
            return int(rounding(length / count))
        return length

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
