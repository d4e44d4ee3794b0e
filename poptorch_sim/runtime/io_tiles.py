"""IO tiles: overlapped IO as a load / compute / store pipeline, each stage a thread of its own.

[Note: IO tiles]
With ``Options.TensorLocations.numIOTiles(n)`` and inputs or outputs marked by
``set_overlap_for_input/output``, an IPU gives ``n`` of its 1472 tiles to host IO only, and
the host → IPU copy of micro-batch ``i+1`` and the IPU → host copy of ``i-1`` run while ``i``
computes. Here the three phases are three threads with a bounded hand-over queue between each,
so a micro-batch is in exactly one phase at a time and the compute thread never copies::

    callers ──► load thread ──[depth]──► compute thread ──[depth]──► store thread ──► callers
                host slice → device     the program on one          device outputs → new
                buffer (dtype converted) micro-batch                 host tensors (demoted)

    clock     t0     t1     t2     t3     t4
    load      L0     L1     L2     L3
    compute          C0     C1     C2     C3
    store                   S0     S1     S2     S3

``depth`` is PopTorch's ``defaultPrefetchBufferingDepth`` (1 unless set through
``Options._Popart``): how many loaded micro-batches may wait for compute (and computed ones for
the store). Load and store are real copies, not sleeps: every input leaf is copied into a new
device buffer, converting float64 to float32 as the host does for an IPU, and every output leaf
into a new host tensor with the IPU's int64 → int32 / float64 → float32 demotion. On CUDA both
copies go through pinned host memory on a CUDA stream of their own, ordered with the compute
stream by events (``cuda_copies.py``).

How ``numIOTiles`` maps onto threads: the IPU's intra-op threads (``threads``) are shared in
proportion to tiles. The compute thread keeps ``round(threads × (1472 − n) / 1472)`` (at least
1), the load and the store thread get ``ceil(threads × n / 1472 / 2)`` each (at least 1). On a
2-thread IPU compute keeps both threads (the IO threads are extra, mostly copying memory); on
16 threads and ``n = 192`` compute keeps 14 and each IO thread gets 2.

Calls from several threads share the pipeline: each call's micro-batches enter in order, the
compute thread takes them first come, first served, and a failure ends only the call it belongs
to (its later micro-batches are skipped, other calls carry on).
"""

from __future__ import annotations

import atexit
import math
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import Error
from ..profiling.trace import TraceRecorder
from ..profiling.utilisation import write_report
from .cuda_copies import Copies
from .intra_op import release_team, restore_default_threads, set_worker_threads
from .threads import JOIN_TIMEOUT_S, POLL_S, attempt, join_all, polled_put, start_thread

__all__ = ["IoTiles", "TILES_PER_IPU", "thread_split"]

TILES_PER_IPU = 1472  # a Mk2 GC200
STOP: Any = "STOP"

Compute = Callable[[Any, int], list[Any]]
Mapper = Callable[[Any, Callable[[torch.Tensor], torch.Tensor]], Any]


def thread_split(threads: int, num_io_tiles: int) -> tuple[int, int]:
    """``(compute threads, threads of each IO thread)`` for an IPU of ``threads`` intra-op threads.

    >>> thread_split(16, 192)
    (14, 2)
    >>> thread_split(2, 32)
    (2, 1)
    """
    compute = max(1, round(threads * (TILES_PER_IPU - num_io_tiles) / TILES_PER_IPU))
    io = max(1, math.ceil(threads * num_io_tiles / TILES_PER_IPU / 2))
    return compute, io


class _Call:
    """One caller's micro-batches in the pipeline; finished when each is stored or skipped."""

    def __init__(self, count: int) -> None:
        self.results: list[list[Any] | None] = [None] * count
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._remaining = count
        self._lock = threading.Lock()
        if count == 0:
            self.done.set()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc

    def finish_one(self) -> None:
        with self._lock:
            self._remaining -= 1
            if self._remaining == 0:
                self.done.set()


@dataclass
class _Item:
    """One micro-batch on its way through load, compute and store."""

    call: _Call
    index: int
    replica: int
    values: Any  # host inputs, then device inputs, then device outputs, then host outputs
    events: list[Any] = field(default_factory=list)  # CUDA: keeps copies ordered across streams


@dataclass(frozen=True)
class _Phase:
    name: str
    work: tuple[tuple[str, Callable[[_Item], None]], ...]  # (trace track, step) in order
    inbox: queue.Queue[_Item]
    outbox: queue.Queue[_Item] | None
    threads: int


class IoTiles:
    """The IO tiles of one IPU: runs micro-batches through load, compute and store threads.

    Args:
        compute: ``compute(device_inputs, replica) -> output leaves`` for one micro-batch.
        map_tensors: ``map_tensors(inputs, fn)`` applies ``fn`` to every tensor of a
            micro-batch's inputs, keeping their structure.
        device: where the program computes (the load target).
        num_io_tiles: ``Options.TensorLocations.numIOTiles``.
        threads: the IPU's intra-op threads, shared as [Note: IO tiles] says.
        depth: micro-batches that may wait between two phases (``defaultPrefetchBufferingDepth``).
        ipu: the IPU id (names the threads and the trace tracks).
        trace: where load / compute / store spans go (tracks ``IPU n load`` etc.), if anywhere.
        report: on ``close``, write ``trace`` there (Chrome-trace JSON) with its utilisation plot
            beside it (the same name, ``.png``).
        overlap: ``False`` does the same copies just in time instead: one thread runs load,
            compute and store of one micro-batch after the other, as an IPU without IO tiles
            does (the baseline of ``benchmarks/overlap_io.py``).

    >>> io = IoTiles(lambda x, r: [2 * x], lambda x, fn: fn(x), torch.device("cpu"), 32, 1)
    >>> io.run([(0, torch.ones(2)), (0, torch.zeros(2))])
    [[tensor([2., 2.])], [tensor([0., 0.])]]
    >>> io.close()
    """

    def __init__(
        self,
        compute: Compute,
        map_tensors: Mapper,
        device: torch.device,
        num_io_tiles: int,
        threads: int,
        *,
        depth: int = 1,
        ipu: int = 0,
        trace: TraceRecorder | None = None,
        report: str | None = None,
        overlap: bool = True,
    ) -> None:
        if depth < 1:
            raise Error(f"the IO prefetch depth must be at least 1, got {depth}")
        self.device, self.ipu, self.trace = device, ipu, trace
        self.num_io_tiles = num_io_tiles
        self.compute_threads, self.io_threads = thread_split(threads, num_io_tiles)
        self._to_load: queue.Queue[_Item] = queue.Queue()
        loaded: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        computed: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        self._handovers = (loaded, computed)
        stop = threading.Event()
        # The threads hold the pipeline, never this object: a model dropped without destroy()
        # lets it be collected, and the finalizer stops and joins them.
        pipeline = _Pipeline(compute, map_tensors, device, ipu, trace, stop)
        load, compute_step, store = (
            ("load", pipeline.load),
            ("compute", pipeline.compute),
            ("store", pipeline.store),
        )
        phases = [
            _Phase("load", (load,), self._to_load, loaded, self.io_threads),
            _Phase("compute", (compute_step,), loaded, computed, self.compute_threads),
            _Phase("store", (store,), computed, None, self.io_threads),
        ]
        if not overlap:  # just in time: every phase on the compute thread, with all its threads
            phases = [_Phase("serial", (load, compute_step, store), self._to_load, None, threads)]
        ready = threading.Semaphore(0)
        main_threads = torch.get_num_threads()
        self._threads = [
            start_thread(pipeline.loop, f"poptorch_sim IPU {ipu} {p.name}", p, ready)
            for p in phases
        ]
        for _ in self._threads:
            ready.acquire(timeout=JOIN_TIMEOUT_S)
        restore_default_threads(main_threads)  # See [Note: per-thread intra-op threads]
        inboxes = [p.inbox for p in phases]
        self._finalizer = weakref.finalize(
            self, _shutdown, stop, inboxes, self._threads, trace, report
        )
        atexit.register(self._finalizer)

    # -- the caller's side ----------------------------------------------------------------------

    def run(self, micro_batches: Sequence[tuple[int, Any]]) -> list[list[Any]]:
        """Run ``(replica, host inputs)`` micro-batches; return each one's host output leaves.

        Safe to call from several threads at once: their micro-batches share the pipeline.

        Raises:
            Error: a phase failed for one of these micro-batches (chained from the original
                exception), or the IO tiles are closed.
        """
        if self.closed:
            raise Error("these IO tiles are closed (the model was destroyed); wrap it again")
        call = _Call(len(micro_batches))
        for index, (replica, values) in enumerate(micro_batches):
            self._to_load.put(_Item(call, index, replica, values))
        try:
            while not call.done.wait(POLL_S):
                self._check_alive()
        except BaseException as exc:
            call.fail(exc)  # the pipeline skips what is left of this call
            raise
        if call.error is not None:
            if isinstance(call.error, Error):
                raise call.error
            raise Error(str(call.error)) from call.error
        return call.results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop and join the three threads; safe to call twice."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether ``close`` has run."""
        return not self._finalizer.alive

    def _check_alive(self) -> None:
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            raise Error(f"the IO threads {dead} stopped; destroy the model and wrap it again")


class _Pipeline:
    """The threads' side of the IO tiles: what each phase does to a micro-batch."""

    def __init__(
        self,
        compute: Compute,
        map_tensors: Mapper,
        device: torch.device,
        ipu: int,
        trace: TraceRecorder | None,
        stop: threading.Event,
    ) -> None:
        self._compute, self._map = compute, map_tensors
        self.device, self.ipu, self.trace, self.stop = device, ipu, trace, stop
        self._copies = Copies(device)

    def loop(self, phase: _Phase, ready: threading.Semaphore) -> None:
        """A phase's thread: run its steps on each micro-batch of its inbox until STOP."""
        try:
            set_worker_threads(phase.threads)  # See [Note: per-thread intra-op threads]
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
        finally:
            ready.release()
        while not self.stop.is_set():
            try:
                item = phase.inbox.get_nowait()
            except queue.Empty:  # going idle: See [Note: idle teams slow every team]
                if phase.threads > 1:
                    release_team()
                item = phase.inbox.get()  # idle threads block here; close() sends STOP
            if item is STOP:
                return
            for name, work in phase.work:
                if item.call.error is not None:
                    break
                ok, exc = attempt(self._timed, name, item, work)
                if not ok:  # reported to the item's caller, never raised here
                    item.call.fail(_describe(self.ipu, name, item.index, exc))
            if item.call.error is not None or phase.outbox is None:
                item.values = None
                item.call.finish_one()
            elif not polled_put(phase.outbox, item, self.stop):
                return

    def _timed(self, name: str, item: _Item, work: Callable[[_Item], None]) -> None:
        if self.trace is None:
            work(item)
            return
        with self.trace.span(
            self.ipu, f"{name[0].upper()}{item.index}", name, mb=item.index, track=name
        ):
            work(item)

    def load(self, item: _Item) -> None:
        item.values = self._map(item.values, self._copies.load)

    def compute(self, item: _Item) -> None:
        self._copies.before_compute()
        with torch.no_grad():
            item.values = self._compute(item.values, item.replica)
        self._copies.after_compute(item.events)

    def store(self, item: _Item) -> None:
        stored = [
            self._copies.store(v, item.events) if isinstance(v, torch.Tensor) else v
            for v in item.values
        ]
        item.values = self._copies.finish_store(stored)
        item.call.results[item.index] = item.values


def _describe(ipu: int, phase: str, index: int, exc: BaseException) -> BaseException:
    """The caller's error: which phase of which of its micro-batches failed, chained from
    ``exc`` (a staged program's own Error names the stage; its micro-batch count restarts at 0
    for each micro-batch the compute phase runs)."""
    error = Error(
        f"IPU {ipu} failed in the {phase} of micro-batch {index} (overlapped IO): "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def _shutdown(
    stop: threading.Event,
    inboxes: list[queue.Queue[Any]],
    workers: list[threading.Thread],
    trace: TraceRecorder | None,
    report: str | None,
) -> None:
    stop.set()
    for inbox in inboxes:
        try:
            inbox.put_nowait(STOP)
        except queue.Full:
            pass  # its thread is busy and sees ``stop`` after this item
    join_all(workers)
    if trace is not None and report is not None and trace.events:
        write_report(trace, report)
