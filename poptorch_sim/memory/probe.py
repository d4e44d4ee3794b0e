"""Measures what the simulator really holds: bytes saved for backward per IPU during a run.

A ``SavedProbe`` is attached to the runtime's stage executors only while ``measure`` runs (the
executors check for it with one attribute test, so an unprobed run costs nothing). On each
worker thread it counts, with the estimate's rule ([Note: counting saved bytes]), the bytes a
forward saves (or, with recomputation, the inputs it keeps), adds them to its IPU's live total
until that micro-batch's backward has run, and keeps the peak (with recomputation, the kept
values plus the largest segment recomputed in a backward).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .saved import SavedBytes, weight_storages

__all__ = ["SavedProbe"]


class SavedProbe:
    """Live and peak bytes saved for backward, per IPU, as the worker threads run.

    Args:
        stages: the program's ``StageSpec`` list (for each stage's IPU and weights).
    """

    def __init__(self, stages: Iterable[Any]) -> None:
        self._ipu = {s.index: s.ipu for s in stages}
        self._weights = {s.index: weight_storages(s.module) for s in stages}
        self._lock = threading.Lock()
        self.live = dict.fromkeys(self._ipu.values(), 0)
        self.peak = dict.fromkeys(self._ipu.values(), 0)
        self.per_micro_batch: dict[int, int] = {}
        self.at_once: dict[int, int] = {}  # per IPU, the most one whole recomputation saved
        self._held: dict[tuple[int, int], int] = {}

    def _counter(self, stage: int) -> SavedBytes:
        return SavedBytes(self._weights[stage])

    def _hold(self, stage: int, mb: int, nbytes: int) -> None:
        ipu = self._ipu[stage]
        with self._lock:
            self._held[(stage, mb)] = nbytes
            self.per_micro_batch[stage] = max(self.per_micro_batch.get(stage, 0), nbytes)
            self.live[ipu] += nbytes
            self.peak[ipu] = max(self.peak[ipu], self.live[ipu])

    @contextmanager
    def forward(self, stage: int, mb: int) -> Iterator[None]:
        """Count what autograd saves during stage ``stage``'s forward of micro-batch ``mb``."""
        counter = self._counter(stage)
        with counter.saving():
            yield
        self._hold(stage, mb, counter.total())

    def keep(self, stage: int, mb: int, values: Iterable[Any]) -> None:
        """Count the values a recomputing stage keeps instead (its inputs)."""
        counter = self._counter(stage)
        for v in values:
            if isinstance(v, torch.Tensor):
                counter.add(v)
        self._hold(stage, mb, counter.total())

    @contextmanager
    def recompute(self, stage: int, mb: int) -> Iterator[None]:
        """Count a backward's recomputed forward, its largest segment between marks held on
        top of the kept values.

        Simulated: the simulator recomputes every segment before differentiating any, an IPU
        one at a time (see [Note: recomputing one segment at a time] in ``estimate.py``); the
        probe counts each segment's bytes as this run saves them, and adds the largest, what
        an IPU holds (``at_once`` keeps what the simulator held).
        """
        counter = self._counter(stage)
        with counter.segments():
            yield
        ipu = self._ipu[stage]
        with self._lock:
            self.peak[ipu] = max(self.peak[ipu], self.live[ipu] + counter.largest_segment())
            self.at_once[ipu] = max(self.at_once.get(ipu, 0), counter.total())

    def release(self, stage: int, mb: int) -> None:
        """Micro-batch ``mb``'s backward on ``stage`` has run: its saved tensors are freed."""
        with self._lock:
            nbytes = self._held.pop((stage, mb), 0)
            self.live[self._ipu[stage]] -= nbytes
