"""Timing shared by the kernel benchmarks: interleaved medians and the table row."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class Row(NamedTuple):
    """One line of the table: medians in seconds."""

    op: str
    size: str
    ours: float
    reference: float
    reference_name: str
    identical: bool


def interleaved(
    ours: Callable[[], Any], ref: Callable[[], Any], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``ref``, timed alternately after one warm-up each."""
    ours()
    ref()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, bucket in ((ours, times[0]), (ref, times[1])):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])
