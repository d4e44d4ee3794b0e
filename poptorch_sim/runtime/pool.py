"""The IPU workers of one ``PipelineRuntime``: built from the program, started, stopped.

One ``IpuWorker`` per IPU holds the ``StageExecutor`` of every stage placed on it, on that IPU's
device. Starting waits until each worker has set its intra-op threads and said ``Ready``;
stopping sends each the ``STOP`` pill and joins them (See [Note: worker threads]).
"""

from __future__ import annotations

import queue
import time
from typing import Any

import torch

from ..errors import Error
from ..profiling.trace import TraceRecorder
from ..program import StagedProgram
from . import worker_memory
from .cores import CoreBudget
from .failure import StageFailure
from .routes import HOST, Routes
from .side_by_side import track_of
from .stage import StageExecutor
from .threads import POLL_S, join_all
from .worker import STOP, IpuWorker, Ready

__all__ = [
    "START_TIMEOUT_S",
    "default_devices",
    "make_executors",
    "make_workers",
    "make_side_workers",
    "start_workers",
    "stop_workers",
]

START_TIMEOUT_S = 60.0  # workers must report ready within this


def default_devices(ipus: list[int]) -> dict[int, torch.device]:
    """IPU ``i`` → ``cuda:(i mod n)`` when CUDA has ``n`` devices, else the CPU."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return {ipu: torch.device("cuda", ipu % count) for ipu in ipus}
    return {ipu: torch.device("cpu") for ipu in ipus}


def make_executors(
    program: StagedProgram,
    routes: Routes,
    devices: dict[int, torch.device],
    *,
    training: bool,
) -> dict[int, StageExecutor]:
    """Each stage's executor by stage index, its module moved to its IPU's device."""
    executors: dict[int, StageExecutor] = {}
    for spec in program.stages:
        spec.module.to(devices[spec.ipu])
        from_stages = frozenset(name for name in spec.inputs if routes.producer[name] != HOST)
        executors[spec.index] = StageExecutor(
            spec,
            training=training,
            loss_name=program.loss_name,
            from_stages=from_stages,
            recompute=bool(program.meta.get("recompute", False)),
        )
    _key_streams(executors, routes)
    return executors


def _key_streams(executors: dict[int, StageExecutor], routes: Routes) -> None:
    """Where a stage that draws does not follow every earlier one that draws, each draws from
    a stream of its own (See [Note: a random stream per model] in rng.py)."""
    earlier: dict[int, set[int]] = {}  # per stage, the stages it takes values from, transitively
    for s in sorted(executors):
        earlier[s] = set()
        for src in routes.upstream(s):
            earlier[s] |= {src, *earlier[src]}
    drawing = [s for s in sorted(executors) if executors[s].draws]
    if any(t not in earlier[s] for i, s in enumerate(drawing) for t in drawing[:i]):
        for s in drawing:
            executors[s].stream_key = s


def make_workers(
    program: StagedProgram,
    executors: dict[int, StageExecutor],
    routes: Routes,
    devices: dict[int, torch.device],
    threads: dict[int, int],
    reports: queue.Queue[tuple[bool, Any]],
    trace: TraceRecorder | None,
    *,
    budget: CoreBudget | None = None,
    one_thread: bool = False,
) -> dict[int, IpuWorker]:
    """One (unstarted) worker per IPU of ``devices`` holding its stages' ``executors``; with a
    ``budget``, the compute actions of workers on the CPU borrow their threads from it (a GPU's
    work does not run on the cores). With ``one_thread``, one worker, under the first IPU, runs
    every stage (See [Note: one thread for a sharded program]). Sets of workers that never run
    at the same time may share the executors (their state lasts one run)."""
    homes = {ipu: min(devices) if one_thread else ipu for ipu in devices}
    ipu_of = {spec.index: spec.ipu for spec in program.stages}
    held: dict[int, dict[int, StageExecutor]] = {home: {} for home in homes.values()}
    for spec in program.stages:
        held[homes[spec.ipu]][spec.index] = executors[spec.index]
    workers: dict[int, IpuWorker] = {}
    for home, stages in held.items():
        device = devices[home]
        workers[home] = IpuWorker(
            home,
            stages,
            routes,
            device,
            threads[home],
            reports,
            trace,
            budget if device.type == "cpu" else None,
            {index: ipu_of[index] for index in stages},
        )
    for worker in workers.values():
        worker.peers = {s.index: workers[homes[s.ipu]].inbox for s in program.stages}
    return workers


def make_side_workers(
    program: StagedProgram,
    executors: dict[int, StageExecutor],
    routes: Routes,
    copies: int,
    reports: queue.Queue[tuple[bool, Any]],
    trace: TraceRecorder | None,
) -> dict[int, IpuWorker]:
    """``copies`` (unstarted) CPU workers on one intra-op thread each, keyed 0, 1, ...; each
    holds every stage's executor and computes whole micro-batches (See [Note: micro-batches
    side by side])."""
    ipu_of = {spec.index: spec.ipu for spec in program.stages}
    workers: dict[int, IpuWorker] = {}
    for copy in range(copies):
        worker = IpuWorker(
            copy,
            dict(executors),
            routes,
            torch.device("cpu"),
            1,
            reports,
            trace,
            ipu_of=ipu_of,
            track=track_of(copy),
        )
        worker.peers = dict.fromkeys(executors, worker.inbox)
        worker.thread.name += f" side {copy}"
        workers[copy] = worker
    return workers


def start_workers(workers: list[IpuWorker], reports: queue.Queue[tuple[bool, Any]]) -> None:
    """Start the threads and wait until each has set its intra-op threads.

    Raises:
        Error: a worker failed to start, or did not report ready within ``START_TIMEOUT_S``.
    """
    for worker in workers:
        worker.thread.start()
    waiting, deadline = {w.ipu for w in workers}, time.monotonic() + START_TIMEOUT_S
    while waiting:
        if time.monotonic() > deadline:
            raise Error(
                f"IPU workers {sorted(waiting)} did not start within {START_TIMEOUT_S:.0f} s"
            )
        try:
            ok, payload = reports.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if not ok:
            failure: StageFailure = payload.failure
            raise failure.error() from failure.exc
        if isinstance(payload, Ready):
            waiting.discard(payload.ipu)


def stop_workers(workers: list[IpuWorker]) -> None:
    """Stop and join every worker thread (also run by the finalizer if ``close`` was skipped)."""
    for worker in workers:
        worker.inbox.put(STOP)
    join_all(worker.thread for worker in workers)
    worker_memory.trim()
