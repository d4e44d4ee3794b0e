"""``poptorch._utils``: the private PopTorch helpers that PopTorch's own add-on packages import
(``poptorch_geometric`` batches its collated tensors with ``combine_batch_tensors_gen``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

__all__ = ["combine_batch_tensors_gen"]


def combine_batch_tensors_gen(batches: Sequence[Sequence[torch.Tensor]]) -> Iterator[torch.Tensor]:
    """For each tensor position, the tensors of every batch at that position joined on dim 0.

    >>> [t.tolist() for t in combine_batch_tensors_gen([[torch.ones(1)], [torch.zeros(2)]])]
    [[1.0, 0.0, 0.0]]
    """
    if not batches:
        return
    for position in range(len(batches[0])):
        yield torch.cat([batch[position] for batch in batches])
