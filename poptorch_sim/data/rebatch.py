"""Batch structures and re-batching: concatenating and splitting batches along the batch dimension.

A *batch* here is what a torch ``DataLoader`` yields and what PopTorch's asynchronous loader
accepts: a tensor, a flat list/tuple of tensors, or a dict of tensors. Dimension 0 of every
tensor is the batch dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["Batch", "check_batch", "batch_rows", "combine_batches", "rebatch"]

Batch = (
    Any  # torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...] | dict[Any, torch.Tensor]
)


def check_batch(batch: Batch) -> None:
    """Check that ``batch`` is a tensor, a flat list/tuple of tensors or a dict of tensors.

    Args:
        batch: one element yielded by a dataset or a data loader.

    Raises:
        AssertionError: an element of the container is not a tensor (PopTorch's message).

    >>> check_batch((torch.zeros(2), torch.ones(2)))
    """
    if isinstance(batch, torch.Tensor):
        return
    if isinstance(batch, dict):
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = [batch]
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise AssertionError(
                f"Tensor at index {index} is not a torch tensor ({type(value)}). "
                "AsynchronousDataAccessor expects data to be organised as a flat 1D container "
                "of tensors."
            )


def _tensors(batch: Batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return list(batch.values())
    return list(batch)


def _map(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {key: fn(value) for key, value in batch.items()}
    return type(batch)(fn(value) for value in batch)


def _zip_map(batches: Sequence[Batch], fn: Callable[[list[torch.Tensor]], torch.Tensor]) -> Batch:
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return fn(list(batches))
    if isinstance(first, dict):
        return {key: fn([b[key] for b in batches]) for key in first}
    columns = zip(*batches)
    return type(first)(fn(list(column)) for column in columns)


def batch_rows(batch: Batch) -> int:
    """Number of rows (size of dimension 0) of ``batch``.

    >>> batch_rows({"x": torch.zeros(3, 2), "y": torch.zeros(3)})
    3
    """
    return len(_tensors(batch)[0])


def _concat(batches: Sequence[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    return _zip_map(batches, torch.cat)


def combine_batches(batches: Iterable[Batch], count: int, drop_last: bool) -> Iterator[Batch]:
    """Concatenate every ``count`` consecutive batches into one.

    Args:
        batches: batches of any size (for example one per ``batch_sampler`` draw).
        count: how many batches make one combined batch.
        drop_last: drop a final group of fewer than ``count`` batches instead of yielding it.

    Returns:
        An iterator of combined batches, in order.

    >>> [b.tolist() for b in combine_batches([torch.tensor([i]) for i in range(5)], 2, True)]
    [[0, 1], [2, 3]]
    """
    group: list[Batch] = []
    for batch in batches:
        group.append(batch)
        if len(group) == count:
            yield _concat(group)
            group = []
    if group and not drop_last:
        yield _concat(group)


def rebatch(batches: Iterable[Batch], size: int, drop_last: bool) -> Iterator[Batch]:
    """Re-cut a stream of batches of any sizes into batches of exactly ``size`` rows.

    Rows keep their order. Rows left over at the end (fewer than ``size``) are yielded as one
    short batch unless ``drop_last``.

    Args:
        batches: batches of any number of rows, all with the same structure.
        size: rows per output batch.
        drop_last: drop the final short batch.

    Returns:
        An iterator of batches of ``size`` rows (plus possibly one shorter last batch).

    >>> [b.tolist() for b in rebatch([torch.arange(3), torch.arange(3, 5)], 2, False)]
    [[0, 1], [2, 3], [4]]
    """
    pending: list[Batch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch_rows(batch)
        while rows >= size:
            head, pending = _take(pending, size)
            rows -= size
            yield head
    if rows and not drop_last:
        yield _concat(pending)


def _take(pending: list[Batch], size: int) -> tuple[Batch, list[Batch]]:
    """Split ``pending`` (at least ``size`` rows in total) into ``size`` rows and the rest."""
    head: list[Batch] = []
    needed = size
    for index, batch in enumerate(pending):
        rows = batch_rows(batch)
        if rows <= needed:
            head.append(batch)
            needed -= rows
            if needed == 0:
                return _concat(head), pending[index + 1 :]
            continue
        head.append(_map(batch, lambda t, n=needed: t[:n]))
        rest = _map(batch, lambda t, n=needed: t[n:])
        return _concat(head), [rest, *pending[index + 1 :]]
    raise AssertionError(f"internal: fewer than {size} rows pending")
