"""The contiguous block of a dataset that one process reads (several processes, PopRun).

[Note: distributed partitioning]
With ``Options.Distributed.numProcesses = P`` each process reads its own contiguous block::

    drop_last=True, step = combined batch size, per_proc = step * (N // (step * P))

        index:  0 ........ per_proc ........ 2*per_proc ... P*per_proc ... N
                [ process 0 ][ process 1 ] ... [ process P-1 ][ leftover ]

    drop_last=False: the N elements are spread as evenly as possible; the first N % P
    processes get one element more (the user pads the short last batches).

All processes must see the same number of batches or a collective would hang, hence the
whole-batch blocks. With ``shuffle=True`` the *global* indices are permuted each epoch by a
generator seeded with ``Options.randomSeed`` (identical in every process, so the blocks stay
disjoint), and every other epoch the blocks slide by the leftover count so that the leftover
elements are used too.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SubDataset", "partition", "process_block"]


def process_block(
    num_elements: int, step: int, num_processes: int, process_id: int, drop_last: bool
) -> tuple[int, int, int]:
    """Where process ``process_id`` reads: ``(offset, length, leftover)``.

    Args:
        num_elements: length of the whole dataset.
        step: combined batch size (elements per model call).
        num_processes: ``Options.Distributed.numProcesses``.
        process_id: ``Options.Distributed.processId``.
        drop_last: whether incomplete combined batches are dropped.

    Returns:
        The first global index of the block, its length and the number of elements no process
        reads this epoch (``drop_last`` only; 0 otherwise).

    >>> process_block(100, 16, 3, 1, True)
    (32, 32, 4)
    """
    if drop_last:
        per_proc = step * (num_elements // (step * num_processes))
        leftover = num_elements - per_proc * num_processes
        return process_id * per_proc, per_proc, leftover
    sizes = [
        num_elements // num_processes + (num_elements % num_processes > proc)
        for proc in range(num_processes)
    ]
    return sum(sizes[:process_id]), sizes[process_id], 0


class SubDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The block of ``dataset`` one process reads (see [Note: distributed partitioning]).

    Args:
        dataset: the whole map-style dataset.
        step: combined batch size.
        num_processes: number of processes sharing the dataset.
        process_id: this process's index.
        drop_last: whether incomplete combined batches are dropped.
        seed: ``Options.randomSeed`` (required before ``shuffle_global_indices``).

    >>> sub = SubDataset(list(range(10)), 2, 2, 1, True, None)
    >>> [sub[i] for i in range(len(sub))]
    [4, 5, 6, 7]
    """

    def __init__(
        self,
        dataset: Any,
        step: int,
        num_processes: int,
        process_id: int,
        drop_last: bool,
        seed: int | None,
    ) -> None:
        self._dataset = dataset
        self._base_offset, self._length, self._leftover = process_block(
            len(dataset), step, num_processes, process_id, drop_last
        )
        # Shared memory (like the permutation below) so that persistent data-loader worker
        # processes, forked in an earlier epoch, see the current block and permutation.
        self._offset = torch.tensor([self._base_offset]).share_memory_()
        self._seed = seed
        self._generator: torch.Generator | None = None
        self._global_indices: torch.Tensor | None = None

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for a block of {self._length}")
        global_index = index + int(self._offset[0])
        if self._global_indices is not None:
            global_index = int(self._global_indices[global_index])
        return self._dataset[global_index]

    def shuffle_global_indices(self) -> None:
        """Draw this epoch's permutation of the whole dataset (the same in every process)."""
        if self._generator is None:
            if self._seed is None:
                raise AssertionError(
                    "Seed must be set when shuffling so that all instances end up with the "
                    "same shuffled global indices."
                )
            self._generator = torch.Generator().manual_seed(self._seed)
        permutation = torch.randperm(len(self._dataset), generator=self._generator)
        if self._global_indices is None:
            self._global_indices = permutation.share_memory_()
        else:
            self._global_indices.copy_(permutation)

    def swap_range(self) -> None:
        """Alternate the block between ``[base, base+len)`` and ``[base+L, base+L+len)``."""
        if int(self._offset[0]) == self._base_offset:
            self._offset[0] = self._base_offset + self._leftover
        else:
            self._offset[0] = self._base_offset


def partition(
    options: Any, dataset: Any, combined: int | None, shuffle: bool | None, drop_last: bool | None
) -> SubDataset:
    """This process's block of ``dataset`` (see [Note: distributed partitioning]).

    Args:
        options: the ``poptorch.Options`` (``Distributed`` and ``randomSeed``).
        dataset: the whole map-style dataset.
        combined: the combined batch size.
        shuffle: whether the loader shuffles (the global permutation then needs the seed).
        drop_last: whether incomplete combined batches are dropped.

    Raises:
        AssertionError: shuffling without ``randomSeed``, or no batching (PopTorch's checks).
    """
    seed = options.random_seed if options.exists("random_seed") else None
    if shuffle and seed is None:
        raise AssertionError(
            "When using auto_distributed_partitioning you must set "
            "poptorch.Options.randomSeed() to ensure that tensors are in the same order in "
            "all processes."
        )
    if combined is None:
        raise AssertionError(
            "batch_size=None not allowed when using auto_distributed_partitioning."
        )
    return SubDataset(
        dataset,
        combined,
        options.Distributed.numProcesses,
        options.Distributed.processId,
        bool(drop_last),
        seed,
    )
