"""Custom batch types (``registerCustomArgParser``) through ``poptorch.DataLoader`` and the
``AsynchronousDataAccessor``, compared with the plain torch loop: batches of a dynamic batch
sampler, padded by the collate function, combined over device iterations."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from loader_data import BATCH, GrowingBatches, PadTo, Pair, Rows

import poptorch_sim as poptorch
from poptorch_sim.enums import DataLoaderMode


def fields(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return (batch.data, batch.label) if isinstance(batch, Pair) else tuple(batch)


def torch_loop(as_pair: bool, device_iterations: int, drop_last: bool) -> list[Any]:
    """What the plain torch loop gives, ``device_iterations`` batches joined per model call."""
    batches = list(
        torch.utils.data.DataLoader(
            Rows(), batch_sampler=GrowingBatches(len(Rows())), collate_fn=PadTo(as_pair)
        )
    )
    groups = [
        batches[i : i + device_iterations] for i in range(0, len(batches), device_iterations)
    ]
    if drop_last and len(groups[-1]) < device_iterations:
        groups.pop()
    return [tuple(torch.cat(column) for column in zip(*map(fields, g))) for g in groups]


def check(got: list[Any], as_pair: bool, expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for batch, want in zip(got, expected):
        assert isinstance(batch, Pair) == as_pair
        for tensor, wanted in zip(fields(batch), want):
            torch.testing.assert_close(tensor, wanted, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["Sync", "Async", "AsyncRebatched"])
@pytest.mark.parametrize("device_iterations", [1, 3], ids=["di1", "di3"])
@pytest.mark.parametrize("as_pair", [True, False], ids=["custom", "tuple"])
@pytest.mark.parametrize("drop_last", [True, False], ids=["drop-last", "keep-last"])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
def test_custom_batches_through_the_dataloader_equal_torch(
    mode: str, device_iterations: int, as_pair: bool, drop_last: bool, num_workers: int
) -> None:
    loader = poptorch.DataLoader(
        poptorch.Options().deviceIterations(device_iterations),
        Rows(),
        batch_sampler=GrowingBatches(len(Rows())),
        collate_fn=PadTo(as_pair),
        num_workers=num_workers,
        drop_last=drop_last,
        mode=DataLoaderMode[mode],
    )
    try:
        expected = torch_loop(as_pair, device_iterations, drop_last)
        check(list(loader), as_pair, expected)
        check(list(loader), as_pair, expected)  # a second epoch
        assert len(loader) == len(expected)
    finally:
        loader.terminate()


@pytest.mark.parametrize("rebatched_size", [None, 2 * BATCH], ids=["as-loaded", "rebatched"])
def test_custom_batches_through_the_accessor_equal_torch(rebatched_size: int | None) -> None:
    sync = poptorch.DataLoader(
        poptorch.Options(),
        Rows(),
        batch_sampler=GrowingBatches(len(Rows())),
        collate_fn=PadTo(True),
    )
    accessor = poptorch.AsynchronousDataAccessor(sync, rebatched_size=rebatched_size)
    try:
        expected = torch_loop(True, 1 if rebatched_size is None else 2, True)
        check(list(accessor), True, expected)
    finally:
        accessor.terminate()


def test_a_custom_batch_with_a_non_tensor_fails_to_start() -> None:
    with pytest.raises(poptorch.Error, match="failed to start") as info:
        poptorch.AsynchronousDataAccessor([Pair(torch.zeros(1), "label")])  # type: ignore[arg-type]
    assert "Tensor at index 1 is not a torch tensor" in str(info.value.__cause__)
