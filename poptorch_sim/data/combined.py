"""The combined batch: the user's batches one model call takes, and how they are re-batched.

One model call consumes ``deviceIterations x (replicationFactor // input_group_size) x
gradientAccumulation`` micro-batches, laid out ``[DI, GA, R // G, mb]`` (§2.1). A loader yields
them as one *combined batch*, made one of three ways::

    how                                   when                              where
    ------------------------------------  --------------------------------  -----------------
    torch batches of the combined size    Sync/Async, no batch_sampler      torch's workers
    count user batches concatenated        a batch_sampler                   combine_batches
    worker batches re-cut to the size      AsyncRebatched, or Async with     the accessor's
                                           drop_last=False                   worker (rebatch)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..enums import DataLoaderMode

__all__ = ["RebatchPlan", "combined_batch_size", "loader_length", "plan_rebatching"]


def combined_batch_size(options: Any, batch_size: int | None) -> tuple[int | None, int | None]:
    """Batches per model call and rows per model call for a micro-batch of ``batch_size``.

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


class RebatchPlan(NamedTuple):
    """How a loader makes its combined batches (see the module's table)."""

    worker_batch_size: int | None  # torch's batch_size
    torch_drop_last: bool | None  # torch's drop_last
    mode: DataLoaderMode  # AsyncRebatched becomes Async: the accessor re-batches
    rebatched_size: int | None = None  # rows per re-cut batch (None: no re-batching)
    rebatched_drop_last: bool = True  # drop the final short re-cut batch


def plan_rebatching(
    mode: DataLoaderMode,
    combined: int | None,
    drop_last: bool | None,
    user_sampler: bool,
    rebatched_worker_size: int | None,
) -> RebatchPlan:
    """Decide whether the accessor re-batches, and what torch's loader is asked for.

    ``AsyncRebatched``, and ``Async`` with ``drop_last=False`` (whose short last batch a plain
    accessor cannot return), re-batch in the accessor: the workers load
    ``rebatched_worker_size`` rows and keep their leftovers, the accessor drops or returns the
    final short batch.

    Args:
        mode: the loader's mode.
        combined: the combined batch size (None without batching).
        drop_last: the user's ``drop_last`` (for a ``batch_sampler``, the loader's own).
        user_sampler: whether the user gave a ``batch_sampler``.
        rebatched_worker_size: the user's ``rebatched_worker_size``.

    Raises:
        AssertionError: ``rebatched_worker_size`` exceeds the combined batch size.

    >>> plan_rebatching(DataLoaderMode.AsyncRebatched, 4, True, False, 1).rebatched_size
    4
    """
    plan = RebatchPlan(1 if user_sampler else combined, None if user_sampler else drop_last, mode)
    wants_rebatch = mode == DataLoaderMode.AsyncRebatched or (
        mode == DataLoaderMode.Async and not drop_last
    )
    if not wants_rebatch or combined is None or combined <= 1:
        return plan
    worker_batch_size = plan.worker_batch_size
    if rebatched_worker_size is not None:
        if rebatched_worker_size > combined:
            raise AssertionError(
                f"The rebatched_worker_size ({rebatched_worker_size}) must be <= to the "
                f"combined batch size ({combined})"
            )
        worker_batch_size = rebatched_worker_size
    torch_drop_last = None if user_sampler else False
    return RebatchPlan(
        worker_batch_size, torch_drop_last, DataLoaderMode.Async, combined, bool(drop_last)
    )


def loader_length(
    plan: RebatchPlan,
    drop_last: bool,
    num_elements: int,
    torch_length: int,
    count: int | None,
) -> int:
    """Combined batches per epoch.

    Args:
        plan: the loader's ``RebatchPlan``.
        drop_last: whether an incomplete last combined batch is dropped.
        num_elements: the dataset's length.
        torch_length: the length of torch's loader (its batches per epoch).
        count: user batches per combined batch with a ``batch_sampler``, else None (the
            sampler's batches, not the elements, are then combined).

    >>> loader_length(RebatchPlan(2, False, DataLoaderMode.Async, 4, False), False, 10, 5, None)
    3
    """
    if count is None:
        if not plan.rebatched_size:
            return torch_length
        length = num_elements // plan.rebatched_size
        if not drop_last and num_elements % plan.rebatched_size:
            length += 1
        return length
    rounding = math.floor if drop_last else math.ceil
    return int(rounding(torch_length / count))
