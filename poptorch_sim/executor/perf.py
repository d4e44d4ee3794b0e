"""Performance counters of the last run: PopTorch's ``getPerfCounters`` layout and latencies.

PopTorch reports, per event, one list per input (or output) tensor holding one host time per
step: every micro-batch of every replica for inputs (``DI x GA x R``), and for outputs only the
micro-batches whose outputs return to the host (``OutputMode``):

    mode     output steps            which micro-batches ([DI, GA, R] order)
    All      DI x GA x R             all
    EveryN   DI / N x GA x R         those of device iterations N-1, 2N-1, ...
    Final    R                       the last of each replica
    Sum      R                       the last of each replica (when the sum is complete)

Simulated: the host runs micro-batches one after another, so a micro-batch's input counts as
requested when the previous micro-batch's outputs were collected (the run's start for the first)
and its output when its own outputs were collected; inputs are views of host memory and outputs
host tensors, so ``input_complete`` equals ``input`` and ``output_complete`` equals ``output``.
With synthetic data nothing crosses the host boundary: every list is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PerfRecord", "counters", "latency"]

EVENTS = ("input", "input_complete", "output", "output_complete")


@dataclass(frozen=True)
class PerfRecord:
    """The times of one run: its start and when each micro-batch's outputs were collected."""

    start: float
    collected: tuple[float, ...]
    num_inputs: int
    num_outputs: int
    mode: str  # OutputMode name
    period: int
    gradient_accumulation: int
    replicas: int
    synthetic: bool = False


def _returned(record: PerfRecord, index: int) -> bool:
    per_iteration = record.gradient_accumulation * record.replicas
    d, within = divmod(index, per_iteration)
    iterations = len(record.collected) // per_iteration
    if record.mode == "All":
        return True
    if record.mode == "EveryN":
        return (d + 1) % record.period == 0
    return d == iterations - 1 and within >= per_iteration - record.replicas  # Final, Sum


def counters(record: PerfRecord | None) -> dict[str, list[list[float]]]:
    """``getPerfCounters()`` of a run (``[[]]`` per event before any run)."""
    if record is None:
        return {event: [[]] for event in EVENTS}
    if record.synthetic:
        inputs: list[float] = []
        outputs: list[float] = []
    else:
        inputs = [record.start, *record.collected[:-1]]
        outputs = [t for i, t in enumerate(record.collected) if _returned(record, i)]
    n_in, n_out = max(record.num_inputs, 1), max(record.num_outputs, 1)
    return {
        "input": [list(inputs) for _ in range(n_in)],
        "input_complete": [list(inputs) for _ in range(n_in)],
        "output": [list(outputs) for _ in range(n_out)],
        "output_complete": [list(outputs) for _ in range(n_out)],
    }


Reduce = Callable[[list[float]], float]


def latency(
    perf: dict[str, list[list[float]]],
    start: str,
    start_reduce: Reduce,
    end: str,
    end_reduce: Reduce,
) -> tuple[float, float, float]:
    """``(min, max, mean)`` seconds from ``start`` to ``end`` events, step by step.

    Each step's time is the reduction over tensors; when there are fewer end steps than start
    steps (``OutputMode.Final``, gradient accumulation), each end step is paired with the
    earliest of its group of start steps, as PopTorch pairs them.
    """
    starts = [start_reduce(list(ts)) for ts in zip(*perf[start])]
    ends = [end_reduce(list(ts)) for ts in zip(*perf[end])]
    if not ends or not starts:
        return (0.0, 0.0, 0.0)
    factor = max(len(starts) // len(ends), 1)
    groups = [min(starts[i : i + factor]) for i in range(0, len(starts), factor)]
    durations = [e - s for s, e in zip(groups, ends)]
    return (min(durations), max(durations), sum(durations) / len(durations))
