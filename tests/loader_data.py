"""Datasets, samplers and batch types that the loader tests send to worker processes.

A worker started by the fork server (or spawned) imports the module that defines what it
unpickles; this one imports nothing the server has not loaded already (torch, poptorch_sim),
where a test module would import pytest in every worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

import poptorch_sim as poptorch

# ---- custom batch types (test_custom_batches.py) ----------------------------------------------
BATCH = 4  # the sampler's largest batch, which the collate function pads every batch to


class Pair:
    """A user's batch type: two tensors as attributes."""

    def __init__(self, data: torch.Tensor, label: torch.Tensor) -> None:
        self.data = data
        self.label = label


class PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct: Pair) -> Iterator[torch.Tensor]:
        yield struct.data
        yield struct.label

    def reconstruct(
        self, original_structure: Pair, tensor_iterator: Iterator[torch.Tensor]
    ) -> Pair:
        return type(original_structure)(*tensor_iterator)


poptorch.registerCustomArgParser(Pair, PairParser())


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Element i: a (2, 1) tensor of i and the label i."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((2, 1), float(i)), torch.tensor([i])


class GrowingBatches(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """Batches of 1, 2, ..., BATCH indices, then 1, 2, ... again, in order."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.batch_size = BATCH

    def __iter__(self) -> Iterator[list[int]]:
        start, size = 0, 1
        while start < self.length:
            yield list(range(start, min(start + size, self.length)))
            start += size
            size = size % BATCH + 1

    def __len__(self) -> int:
        return sum(1 for _ in self)


class PadTo:
    """Stacks a batch padded with zeros to ``BATCH`` rows, as ``Pair`` or as a tuple."""

    def __init__(self, as_pair: bool) -> None:
        self.as_pair = as_pair

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        pad = BATCH - len(items)
        data = torch.stack([d for d, _ in items] + [torch.zeros(2, 1)] * pad)
        label = torch.stack([lb for _, lb in items] + [torch.zeros(1, dtype=torch.long)] * pad)
        return Pair(data, label) if self.as_pair else (data, label)


# ---- datasets of test_dataloader.py -------------------------------------------------------------
class DictDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((2,), float(i)), "label": torch.tensor(i)}


class FailingDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Raises ValueError for every index >= ``fail_at``."""

    def __init__(self, n: int, fail_at: int) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= self.fail_at:
            raise ValueError(f"cannot load item {i}")
        return torch.tensor([i])


class CountingIterable(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.arange(self.n))


class CountingDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` items; each load appends a byte to the file ``log``, so loads made in a worker
    process are counted too (``loads``)."""

    def __init__(self, n: int, log: str) -> None:
        self.n, self.log = n, log
        open(log, "wb").close()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.log, "ab") as f:
            f.write(b".")
        return torch.tensor([i])

    @property
    def loads(self) -> int:
        return os.path.getsize(self.log)


class SecondEpochFails:
    """An iterable whose second ``iter()`` raises."""

    def __init__(self) -> None:
        self.epochs = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.epochs += 1
        if self.epochs == 2:
            raise OSError("the shard for epoch 2 is missing")
        return iter([torch.tensor([0]), torch.tensor([1])])


# ---- datasets of test_accessor_process.py -------------------------------------------------------
class Unpicklable(Exception):
    """An exception that cannot cross to the parent process (it holds a lock)."""

    def __init__(self) -> None:
        super().__init__("the shard reader broke")
        self.lock = threading.Lock()


class BreaksAtTwo:
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield torch.tensor([0])
        yield torch.tensor([1])
        raise Unpicklable()


class Pids(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= len(self):
            raise IndexError(i)  # iter() over a map-style dataset stops here
        return torch.tensor([os.getpid(), i])
