"""Batch structures: what a loader may yield, and reading and rebuilding its tensors.

A *batch* here is what a torch ``DataLoader`` yields and what PopTorch's asynchronous loader
accepts: a tensor, a flat list/tuple of tensors, a dict of tensors, or an object of a type
registered with ``poptorch.registerCustomArgParser`` (whose parser yields its tensors and
rebuilds it from them). Dimension 0 of every tensor is the batch dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..executor.custom_args import parser_for

__all__ = ["Batch", "batch_rows", "check_batch", "concat", "map_batch"]

Batch = Any  # Tensor | list[Tensor] | tuple[Tensor, ...] | dict[Any, Tensor] | a custom type


def check_batch(batch: Batch) -> None:
    """Check that ``batch`` is a tensor, a flat container of tensors or a registered custom type.

    Args:
        batch: one element yielded by a dataset or a data loader.

    Raises:
        AssertionError: an element of the container is not a tensor (PopTorch's message).

    >>> check_batch((torch.zeros(2), torch.ones(2)))
    """
    if isinstance(batch, torch.Tensor):
        return
    parser = parser_for(batch)
    if parser is not None:
        values: Iterable[Any] = parser.yieldTensors(batch)
    elif isinstance(batch, dict):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = [batch]
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise AssertionError(
                f"Tensor at index {index} is not a torch tensor ({type(value)}). "
                "AsynchronousDataAccessor expects data to be organised as a flat 1D container "
                "of tensors (or a type registered with poptorch.registerCustomArgParser)."
            )


def _tensors(batch: Batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    parser = parser_for(batch)
    if parser is not None:
        return list(parser.yieldTensors(batch))
    if isinstance(batch, dict):
        return list(batch.values())
    return list(batch)


def _rebuild(template: Batch, tensors: list[torch.Tensor]) -> Batch:
    """A batch with ``template``'s structure holding ``tensors``, in ``_tensors`` order."""
    if isinstance(template, torch.Tensor):
        return tensors[0]
    parser = parser_for(template)
    if parser is not None:
        return parser.reconstruct(template, iter(tensors))
    if isinstance(template, dict):
        return dict(zip(template, tensors))
    return type(template)(tensors)


def map_batch(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """``batch`` with ``fn`` applied to each of its tensors.

    >>> map_batch({"x": torch.arange(4)}, lambda t: t[:2])
    {'x': tensor([0, 1])}
    """
    return _rebuild(batch, [fn(t) for t in _tensors(batch)])


def zip_batches(
    batches: Sequence[Batch], fn: Callable[[list[torch.Tensor]], torch.Tensor]
) -> Batch:
    """One batch whose tensor ``i`` is ``fn`` of tensor ``i`` of every batch in ``batches``."""
    columns = zip(*(_tensors(batch) for batch in batches))
    return _rebuild(batches[0], [fn(list(column)) for column in columns])


def concat(batches: Sequence[Batch]) -> Batch:
    """``batches`` concatenated along the batch dimension (the one batch itself if alone).

    >>> concat([torch.arange(2), torch.arange(2, 3)]).tolist()
    [0, 1, 2]
    """
    if len(batches) == 1:
        return batches[0]
    return zip_batches(batches, torch.cat)


def batch_rows(batch: Batch) -> int:
    """Number of rows (size of dimension 0) of ``batch``.

    >>> batch_rows({"x": torch.zeros(3, 2), "y": torch.zeros(3)})
    3
    """
    return len(_tensors(batch)[0])
