"""Bytes saved for backward: counted the same way at compile (estimate) and at run (probe).

[Note: counting saved bytes]
Autograd hands every tensor it keeps for backward to ``saved_tensors_hooks``' pack hook. The
bytes a micro-batch keeps are the bytes those tensors reference, with aliases counted once:
per storage, the union of the byte ranges the saved views cover. Counting whole storages
would be wrong for views (a micro-batch's input is a slice of the host batch); counting each
tensor would count ``q``, ``k`` and ``v`` views of one projection, or a tensor saved by two
ops, twice. Parameters and buffers are weights, not activations, and are left out.

The same ``SavedBytes`` counter serves the estimate (a stage's forward on meta tensors at
compile, see ``activations.py``) and the measurement (the runtime's real forward on its worker
thread, see ``probe.py``), so the two differ only where the runs differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..runtime.checkpoints import is_checkpoint

__all__ = ["SavedBytes", "storage_key", "tensor_bytes", "weight_storages"]


def storage_key(t: torch.Tensor) -> int:
    """An id of ``t``'s storage, the same for every view of it while it lives (meta too)."""
    return int(t.untyped_storage()._cdata)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements (``numel × itemsize``)."""
    return t.numel() * t.element_size()


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``[start, end)`` of ``t``'s storage that ``t`` covers."""
    size = t.element_size()
    start = t.storage_offset() * size
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * size


def _union(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for lo, hi in sorted(ranges):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


class SavedBytes:
    """Collects tensors and counts the bytes they reference (see [Note: counting saved bytes]).

    Args:
        exclude: storages never counted (the stage's parameters and buffers).

    >>> counter = SavedBytes()
    >>> x = torch.zeros(4, 3)
    >>> counter.add(x[:2]); counter.add(x[1:3]); counter.add(x[:2])
    >>> counter.total()
    36
    """

    def __init__(self, exclude: Iterable[int] = ()) -> None:
        self.exclude = frozenset(exclude)
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self._segment: dict[int, list[tuple[int, int]]] = {}  # since the last cut
        self._closed: list[int] = []  # bytes of each segment before the last cut

    def add(self, t: torch.Tensor) -> None:
        """Count ``t`` (a tensor autograd saved, or a value a stage keeps)."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return
        key = storage_key(t)
        if key not in self.exclude:
            self._ranges.setdefault(key, []).append(_extent(t))
            self._segment.setdefault(key, []).append(_extent(t))

    def total(self) -> int:
        """Bytes referenced, each byte of each storage counted once."""
        return sum(_union(ranges) for ranges in self._ranges.values())

    def cut(self) -> None:
        """End a segment: what is added next counts towards the next one (see ``segments``)."""
        self._closed.append(self._open())
        self._segment = {}

    def _open(self) -> int:
        return sum(_union(r) for r in self._segment.values())

    def segment_bytes(self) -> list[int]:
        """Bytes of each segment between cuts, in order (one, ``total()``, when never cut)."""
        return [*self._closed, self._open()]

    def largest_segment(self) -> int:
        """Bytes of the largest segment between cuts (``total()`` when never cut)."""
        return max(self.segment_bytes())

    @contextmanager
    def segments(self) -> Iterator[SavedBytes]:
        """``saving()``, cut at each ``recomputationCheckpoint``: a recomputation's segments.

        See [Note: recomputing one segment at a time] in ``estimate.py``.
        """
        with self.saving(), _Cuts(self):
            yield self

    @contextmanager
    def saving(self) -> Iterator[SavedBytes]:
        """Count every tensor autograd saves for backward inside the block."""

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.add(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            yield self


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class _Cuts(TorchFunctionMode):
    """Cuts ``counter`` where the stage's code reaches a ``recomputationCheckpoint``."""

    def __init__(self, counter: SavedBytes) -> None:
        super().__init__()
        self._counter = counter

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        if is_checkpoint(func):
            self._counter.cut()
        return func(*args, **(kwargs or {}))


def weight_storages(module: torch.nn.Module) -> set[int]:
    """Storage ids of ``module``'s parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return {storage_key(t) for t in tensors if t.layout == torch.strided}
