"""One IPU worker thread: interprets its schedule's action list for the stages placed on its IPU.

Workers never raise across threads: every outcome goes on the shared report queue as
``(ok, payload)`` — ``(True, Ready | Output | Finished)`` or ``(False, Failed)`` — and the caller
decides what to raise (``pipeline.py``). Program outputs travel inside ``Finished`` unless the
run is serial (see ``IpuWorker._report``). Every blocking wait in a worker either has a timeout
(``threads.POLL_S``) after which it checks the run's abort flag, or is woken by a pill
(``STOP``, ``Abort``). See [Note: worker threads].

Messages in a worker's inbox::

    Job        start a run: the action list, loss scale, step callback, abort flag
    Transfer   activations ("act") or gradients ("grad") for (stage, mb) from a stage / the host
    Abort      stop the current run (tagged with its run id; stale ones are dropped)
    STOP       leave the thread
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..profiling.trace import TraceRecorder
from . import worker_memory
from .actions import Action, ActionKind
from .cores import CoreBudget
from .failure import StageFailure, graph_node_of
from .intra_op import release_team, set_worker_threads
from .rng import MicroBatchStream
from .routes import HOST, Routes
from .stage import StageExecutor
from .threads import POLL_S, attempt

__all__ = [
    "STOP",
    "Job",
    "Transfer",
    "Abort",
    "Ready",
    "Output",
    "Finished",
    "Failed",
    "IpuWorker",
]

STOP = "STOP"

Values = dict[str, torch.Tensor | None]


@dataclass(frozen=True)
class Job:
    """One run of a worker's action list."""

    run_id: int
    actions: tuple[Action, ...]
    loss_scale: float
    step: Callable[[int], None] | None
    abort: threading.Event = field(default_factory=threading.Event)
    serial: bool = False  # the caller feeds micro-batch m+1 on the last stage's Output of m
    threads: int | None = None  # intra-op threads for this run (See [Note: cores follow the work])
    lend: bool = False  # compute actions borrow their threads from the worker's budget
    recount: bool = False  # show the thread count on the trace again (other workers ran since)
    into: tuple[dict[str, torch.Tensor], ...] | None = None  # per mb: outputs' destinations
    streams: tuple[MicroBatchStream, ...] | None = None  # per mb: its random stream


@dataclass(frozen=True)
class Transfer:
    """Values sent to ``stage`` for micro-batch ``mb`` by stage ``src`` (``HOST`` = the host)."""

    run_id: int
    kind: str
    stage: int
    mb: int
    src: int
    values: Values


@dataclass(frozen=True)
class Abort:
    run_id: int


@dataclass(frozen=True)
class Ready:
    ipu: int


@dataclass(frozen=True)
class Output:
    """Program outputs made by ``stage`` for ``mb`` (the last stage always reports, maybe empty)."""

    run_id: int
    stage: int
    mb: int
    values: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Finished:
    """A worker's end of a run; ``outputs`` holds the ``Output`` it deferred (see ``_report``),
    ``cost_s`` the CPU seconds its thread spent in forward, backward and step actions times the
    intra-op threads it ran each with, ``threads`` its mean threads over their wall time."""

    run_id: int
    ipu: int
    aborted: bool
    outputs: tuple[Output, ...] = ()
    cost_s: float = 0.0
    threads: float = 0.0


@dataclass(frozen=True)
class Failed:
    """A worker's failed run; ``worker`` is the reporting worker's ``ipu`` (where one thread
    runs several IPUs' stages, not necessarily the failed stage's IPU)."""

    run_id: int
    failure: StageFailure
    worker: int


class _Aborted(Exception):
    def __init__(self, leave: bool = False) -> None:
        super().__init__("aborted")
        self.leave = leave


_CATEGORY = {
    ActionKind.F: "fwd",
    ActionKind.B: "bwd",
    ActionKind.STEP: "step",
    ActionKind.SEND_F: "send",
    ActionKind.SEND_B: "send",
    ActionKind.RECV_F: "recv",
    ActionKind.RECV_B: "recv",
}
_COMPUTE = frozenset((ActionKind.F, ActionKind.B, ActionKind.STEP))
_PHASE = {
    "fwd": "forward",
    "bwd": "backward",
    "step": "optimizer step",
    "send": "send",
    "recv": "receive",
}


class IpuWorker:
    """The thread of one IPU and the state of the stages it holds.

    Args:
        ipu: the IPU id (its reports carry it; a copy of micro-batches side by side: its number).
        stages: the executors of the stages placed on this IPU, by stage index.
        routes: the program's routes.
        device: where this IPU's parameters and activations live.
        threads: intra-op threads for this worker (outside compute actions, when lent).
        reports: the queue shared by all workers and read by the caller.
        trace: where actions are timestamped, if anywhere.
        budget: where each compute action borrows its threads from (None: ``threads``).
        ipu_of: the IPU of each stage, where one thread runs the stages of several IPUs (a
            sharded program on the CPU, See [Note: one thread for a sharded program]); traces
            and failures name the stage's IPU. Default: every stage on ``ipu``.
        track: the trace track of this thread's spans under each IPU ("": the IPU's own; a
            copy of micro-batches side by side, See [Note: micro-batches side by side]).
    """

    def __init__(
        self,
        ipu: int,
        stages: dict[int, StageExecutor],
        routes: Routes,
        device: torch.device,
        threads: int,
        reports: queue.Queue[tuple[bool, Any]],
        trace: TraceRecorder | None,
        budget: CoreBudget | None = None,
        ipu_of: dict[int, int] | None = None,
        track: str = "",
    ) -> None:
        self.ipu, self.stages, self.routes, self.device = ipu, stages, routes, device
        self.track = track
        self.ipu_of = ipu_of if ipu_of is not None else dict.fromkeys(stages, ipu)
        self._ipus = sorted(set(self.ipu_of.values()))  # the IPUs whose stages this thread runs
        self.threads, self.reports, self.trace = threads, reports, trace
        self.budget = budget
        self._running = threads  # the intra-op threads this thread has now
        self._lending = False  # this run's compute actions borrow from budget
        self._widest = threads  # the most intra-op threads this run has used
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.peers: dict[int, queue.Queue[Any]] = {}  # stage -> inbox of its IPU
        self.last_stage = len(routes.inputs_from) - 1
        self._stash: dict[tuple[str, int, int], dict[int, Values]] = {}
        self._held: dict[tuple[ActionKind, int, int], Values] = {}
        self._outputs: list[Output] = []  # deferred to the Finished report (see _report)
        # this run's compute actions: thread-ns of CPU, ns and thread-ns of wall time
        self._cost_ns = self._wall_ns = self._thread_wall_ns = 0
        self.thread = threading.Thread(
            target=self._main,
            name=f"poptorch_sim IPU {', '.join(map(str, self._ipus))}",
            daemon=True,
        )

    # -- thread body ----------------------------------------------------------------------------

    def _main(self) -> None:
        ok, exc = attempt(self._start_up)
        if not ok:  # reported, never raised across threads
            first = min(self.stages)
            failure = StageFailure(first, self.ipu_of[first], None, "worker start-up", exc)
            self.reports.put((False, Failed(0, failure, self.ipu)))
            return
        self.reports.put((True, Ready(self.ipu)))
        while True:
            msg = self.inbox.get()  # idle: woken by a Job or the STOP pill
            if msg is STOP:
                return
            if isinstance(msg, Job) and not self._run(msg):
                return

    def _start_up(self) -> None:
        set_worker_threads(self.threads)
        worker_memory.enter()
        self._running = self.threads
        self._count_threads(self.threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def _run(self, job: Job) -> bool:
        """Run one job; returns False when the thread must leave (STOP arrived)."""
        leave, action = False, None
        self._cost_ns = self._wall_ns = self._thread_wall_ns = 0
        self._widest = self._running
        try:
            self._set_threads(job)
            for action in job.actions:
                if job.abort.is_set():
                    raise _Aborted()
                self._traced(action, job)
            outputs = tuple(self._outputs)
            cost_s = self._cost_ns / 1e9
            threads = self._thread_wall_ns / self._wall_ns if self._wall_ns else 0.0
            report: tuple[bool, Any] = (
                True,
                Finished(job.run_id, self.ipu, False, outputs, cost_s, threads),
            )
        except _Aborted as stop:
            leave = stop.leave
            report = (True, Finished(job.run_id, self.ipu, aborted=True))
        except BaseException as exc:  # reported, never raised across threads
            report = (False, Failed(job.run_id, self._describe(action, exc), self.ipu))
        finally:
            self._stash.clear()
            self._held.clear()
            self._outputs.clear()
            for executor in self.stages.values():
                executor.discard()
            if self._widest > 1:  # going idle: See [Note: idle teams slow every team]
                release_team()
        self.reports.put(report)  # last: the caller may return as soon as it reads this
        return not leave

    def _set_threads(self, job: Job) -> None:
        """Take the run's intra-op thread count (See [Note: cores follow the work])."""
        if job.threads is not None:
            self.threads = job.threads
        self._lending = job.lend and self.budget is not None
        if job.recount:
            self._count_threads(self._running)
        if not self._lending:
            self._use_threads(self.threads)

    def _use_threads(self, count: int) -> None:
        """Run on ``count`` intra-op threads from now on; the trace's counter shows each change."""
        if count == self._running:
            return
        set_worker_threads(count)
        self._running = count
        self._widest = max(self._widest, count)
        self._count_threads(count)

    def _count_threads(self, count: int) -> None:
        if self.trace is not None:
            for ipu in self._ipus:
                self.trace.count(ipu, "threads", count)

    def _describe(self, action: Action | None, exc: BaseException) -> StageFailure:
        stage = action.stage if action is not None else min(self.stages)
        category = _CATEGORY[action.kind] if action is not None else "run"
        phase = _PHASE.get(category, category)
        node = None
        if action is not None and action.kind is ActionKind.F:
            try:
                node = graph_node_of(exc, self.stages[stage].spec.module)
            except Exception:  # naming the node is best effort; the failure itself is reported
                node = None
        ipu = self.ipu_of[stage]
        return StageFailure(stage, ipu, action.mb if action else None, phase, exc, node)

    def _traced(self, action: Action, job: Job) -> None:
        if action.kind not in _COMPUTE:
            self._spanned(action, job)
            return
        budget = self.budget if self._lending else None
        if budget is not None:  # See [Note: cores follow the work]
            self._use_threads(budget.take(self.ipu))
        try:
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            self._spanned(action, job)
            cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        finally:
            if budget is not None:
                budget.give(self.ipu)
        self._cost_ns += cpu * self._running
        self._wall_ns += wall
        self._thread_wall_ns += wall * self._running

    def _spanned(self, action: Action, job: Job) -> None:
        if self.trace is None:
            self._do(action, job)
        else:
            category = _CATEGORY[action.kind]
            with self.trace.span(
                self.ipu_of[action.stage],
                repr(action),
                category,
                stage=action.stage,
                mb=action.mb,
                track=self.track,
            ):
                self._do(action, job)

    # -- actions ----------------------------------------------------------------------------------

    def _do(self, action: Action, job: Job) -> None:
        s, kind = action.stage, action.kind
        m = action.mb if action.mb is not None else -1
        if kind is ActionKind.RECV_F:
            self._held[(kind, s, m)] = self._gather("act", s, m, self._act_sources(s), job)
        elif kind is ActionKind.F:
            inputs = self._held.pop((ActionKind.RECV_F, s, m))
            into = job.into[m] if job.into is not None else None
            stream = job.streams[m] if job.streams is not None else None
            outputs = self.stages[s].forward(m, inputs, into, stream)  # type: ignore[arg-type]
            self._held[(kind, s, m)] = dict(outputs)
        elif kind is ActionKind.SEND_F:
            self._send_activations(s, m, job)
        elif kind is ActionKind.RECV_B:
            self._held[(kind, s, m)] = self._gather("grad", s, m, self.routes.downstream(s), job)
        elif kind is ActionKind.B:
            grads = self._held.pop((ActionKind.RECV_B, s, m), {})
            seeds = {name: g for name, g in grads.items() if g is not None}
            input_grads = self.stages[s].backward(m, seeds, job.loss_scale)
            if self.routes.upstream(s):
                self._held[(kind, s, m)] = input_grads
        elif kind is ActionKind.SEND_B:
            self._send_gradients(s, m, job.run_id)
        elif kind is ActionKind.STEP and job.step is not None:
            job.step(s)

    def _act_sources(self, stage: int) -> list[int]:
        sources = list(self.routes.inputs_from[stage])
        return sources if stage != 0 or HOST in sources else [*sources, HOST]

    def _send_activations(self, s: int, m: int, job: Job) -> None:
        outputs = self._held.pop((ActionKind.F, s, m))
        for consumer, names in self.routes.outputs_to[s].items():
            values: Values = {name: outputs[name].detach() for name in names}  # type: ignore[union-attr]
            self._send(Transfer(job.run_id, "act", consumer, m, s, values))
        if self.routes.to_host[s] or s == self.last_stage:
            to_host = {n: outputs[n].detach().to("cpu") for n in self.routes.to_host[s]}  # type: ignore[union-attr]
            self._report(Output(job.run_id, s, m, to_host), job)

    def _report(self, output: Output, job: Job) -> None:
        """Send ``output`` to the caller now if it feeds the next micro-batch, else with Finished.

        Waking the caller's thread costs the sender 0.1-0.2 ms with the GIL held (measured with
        ``py-spy --gil`` on the 2-core build VM: 7% of a 2-stage 1F1B run went to
        ``Queue.put`` → ``Condition.notify`` for per-micro-batch outputs), on the critical path
        of the last stage. Only a serial run needs the caller woken per micro-batch.
        """
        if job.serial and output.stage == self.last_stage:
            self.reports.put((True, output))
        else:
            self._outputs.append(output)

    def _send_gradients(self, s: int, m: int, run_id: int) -> None:
        grads = self._held.pop((ActionKind.B, s, m), {})
        for producer in self.routes.upstream(s):
            names = self.routes.inputs_from[s][producer]
            values = {name: grads.get(name) for name in names}
            self._send(Transfer(run_id, "grad", producer, m, s, values))

    def _send(self, transfer: Transfer) -> None:
        """Hand ``transfer`` to its stage's worker; one held by this thread goes straight to the
        stash (no queue, no lock)."""
        inbox = self.peers[transfer.stage]
        if inbox is not self.inbox:
            inbox.put(transfer)
            return
        key = (transfer.kind, transfer.stage, transfer.mb)
        self._stash.setdefault(key, {})[transfer.src] = transfer.values

    # -- receiving --------------------------------------------------------------------------------

    def _gather(self, kind: str, stage: int, mb: int, sources: list[int], job: Job) -> Values:
        """Wait until every source has sent ``kind`` for (stage, mb); merge onto this device.

        Gradients for one value from several consumers are summed.
        """
        key = (kind, stage, mb)
        while not set(sources) <= self._stash.get(key, {}).keys():
            self._take_one(job)
        merged: Values = {}
        for values in self._stash.pop(key, {}).values():
            for name, value in values.items():
                if value is None:
                    merged.setdefault(name, None)
                    continue
                value = value.to(self.device)
                previous = merged.get(name)
                merged[name] = value if previous is None else previous + value
        return merged

    def _take_one(self, job: Job) -> None:
        try:
            msg = self.inbox.get(timeout=POLL_S)
        except queue.Empty:
            msg = None
        if msg is STOP:
            raise _Aborted(leave=True)
        if job.abort.is_set() or (isinstance(msg, Abort) and msg.run_id == job.run_id):
            raise _Aborted()
        if isinstance(msg, Transfer) and msg.run_id == job.run_id:
            self._stash.setdefault((msg.kind, msg.stage, msg.mb), {})[msg.src] = msg.values
