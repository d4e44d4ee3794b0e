"""Re-batching: concatenating and re-cutting batches along the batch dimension.

The batch structures themselves (tensors, flat containers, registered custom types) are
``batch.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .batch import Batch, batch_rows, concat, map_batch

__all__ = ["combine_batches", "rebatch"]


def combine_batches(batches: Iterable[Batch], count: int, drop_last: bool) -> Iterator[Batch]:
    """Concatenate every ``count`` consecutive batches into one.

    Args:
        batches: batches of any size (for example one per ``batch_sampler`` draw).
        count: how many batches make one combined batch.
        drop_last: drop a final group of fewer than ``count`` batches instead of yielding it.

    Returns:
        An iterator of combined batches, in order.

    >>> import torch
    >>> [b.tolist() for b in combine_batches([torch.tensor([i]) for i in range(5)], 2, True)]
    [[0, 1], [2, 3]]
    """
    group: list[Batch] = []
    for batch in batches:
        group.append(batch)
        if len(group) == count:
            yield concat(group)
            group = []
    if group and not drop_last:
        yield concat(group)


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

    >>> import torch
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
        yield concat(pending)


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
                return concat(head), pending[index + 1 :]
            continue
        head.append(map_batch(batch, lambda t, n=needed: t[:n]))
        rest = map_batch(batch, lambda t, n=needed: t[n:])
        return concat(head), [rest, *pending[index + 1 :]]
    raise AssertionError(f"internal: fewer than {size} rows pending")
