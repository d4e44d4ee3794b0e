"""``PipelineRuntime``: runs a ``StagedProgram`` on one worker thread per IPU, as a schedule says.

The caller's side of the runtime: it starts the IPU workers, hands each its action list for a
run, feeds the micro-batches in, collects the program outputs, and turns the first worker failure
into a ``poptorch_sim.Error`` after stopping the others. One run::

    caller ──Job, inputs──► IPU 0 worker ──activations──► IPU 1 worker
      ▲                          │      ◄──gradients────       │
      └──(ok, Output | Finished | Failed)── report queue ◄─────┘

[Note: one thread for a sharded program]
A sharded program computes on one IPU at a time, so on the CPU one worker thread runs every
stage, in the order of the sharded schedule placed on a single IPU; traces, thread counters and
failures still name each stage's own IPU. Per-IPU threads would each keep an OpenMP team, and
with the caller's team beside the computing one libgomp counts more threads than CPUs and every
team sleeps at its barriers (See [Note: idle teams slow every team]): ViT's eager inference took
10-30% longer in a thread beside the caller's idle team than in the caller's own thread
(``benchmarks/RESULTS.md``). For the same reason the caller's team is freed when such a run
starts; its next parallel op starts a new one. Workers on GPUs keep a thread each. A pipelined
program on the CPU runs the same way where its trials measured it fastest (See [Note: cores
follow the work]): one more worker, started when a trial first asks for it, holds every stage's
executor beside the per-IPU workers (a run uses one set or the other, and the executors' state
lasts one run), and runs the sharded schedule placed on one IPU: each micro-batch's forward
through every stage, then its backward, as eager PyTorch computes them. The same ops meet the
same values (each parameter's gradients still accumulate in micro-batch order, each stage
steps after its last backward), but only one micro-batch's activations are alive at a time,
where the pipelined schedule placed on one IPU keeps up to one per stage: measured on dev-zen4,
quiet, the two orders alternating in one process (medians of 5-7 runs), Llama training took
3,248 against 3,934 ms, GPT-2 5,106 against 5,841 ms, ResNet-50 blocks 1,112 against 1,161 ms,
T5 1,366 against 1,389 ms, BERT the same. A run on one thread is fed every micro-batch at once
(its action order computes them one after another) and reports its outputs when it finishes,
and a worker hands the values for a stage it holds itself straight to its stash: no thread is
woken between two stages or two micro-batches. In ViT's sharded inference
(``benchmarks/models.py``, dev-zen4, a compile running beside it) the worker's waits for inputs
went from 2.7-5.6 ms to 0.8-0.9 ms a call; on the quiet machine, where a wake-up is quick, the
difference was within the noise.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..errors import Error
from ..logger import logger
from ..profiling.trace import TraceRecorder
from ..program import StagedProgram
from .actions import Action
from .cores import CoreShare
from .in_place import in_place_module
from .intra_op import pinned_threads_per_ipu, release_team, restore_default_threads
from .pool import (
    default_devices,
    make_executors,
    make_side_workers,
    make_workers,
    start_workers,
    stop_workers,
)
from .rng import MicroBatchStream
from .routes import HOST, routes_of
from .schedules import SCHEDULES, Schedule, make_schedule
from .side_by_side import independent_micro_batches, side_actions
from .stage import StageExecutor, prepare_backward
from .threads import POLL_S
from .worker import Abort, Failed, Finished, IpuWorker, Job, Output, Transfer

__all__ = ["PipelineRuntime", "default_devices"]

ABORT_GRACE_S = 30.0  # how long a failing run waits for the other workers to stop


class PipelineRuntime:
    """Executes a ``StagedProgram``: forward (and backward, in training) of every micro-batch.

    Each IPU is one worker thread holding the parameters of its stages; activations flow
    forward and gradients backward between the threads, so different micro-batches are in
    different stages at the same time. Threads are joined by ``close()`` (or leaving ``with``).

    Args:
        program: the stages; their modules are moved to their IPU's device.
        training: run backward from ``program.loss_name`` and call ``step`` per stage.
        schedule: ``"1f1b"`` (default), ``"fill_drain"`` or ``"sharded"``; ``program.sharded``
            forces ``"sharded"`` (one micro-batch at a time); inference pipelines use the
            forward-only schedule.
        devices: ``{ipu: device}``; default ``cuda:(ipu mod n)`` with CUDA, else CPU.
        threads_per_ipu: intra-op threads per worker, pinned (default
            ``POPTORCH_SIM_THREADS_PER_IPU``; else the caller's cores are lent to the workers one
            compute action at a time, see [Note: cores follow the work]).
        trace: records every action per IPU (see ``poptorch_sim.profiling.trace``).

    Raises:
        Error: the program is malformed, training without a loss, unknown schedule, a worker
            failed to start.

    >>> from torch import nn
    >>> from poptorch_sim.program import StageSpec, StagedProgram
    >>> class Double(nn.Module):
    ...     def forward(self, x):
    ...         return (2 * x,)
    >>> program = StagedProgram([StageSpec(0, 0, Double(), ("x",), ("y",))], ("x",), ("y",))
    >>> with PipelineRuntime(program, training=False, devices={0: torch.device("cpu")}) as rt:
    ...     rt.run([{"x": torch.ones(2)}])
    [{'y': tensor([2., 2.])}]
    """

    def __init__(
        self,
        program: StagedProgram,
        *,
        training: bool,
        schedule: str = "1f1b",
        devices: dict[int, torch.device] | None = None,
        threads_per_ipu: int | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        self.program, self.training, self.trace = program, training, trace
        self.routes = routes_of(program)
        self.schedule_name = "sharded" if program.sharded else schedule
        self._check_mode()
        if training:
            prepare_backward()
        self.stage_ipus = tuple(spec.ipu for spec in program.stages)
        ipus = sorted(set(self.stage_ipus))
        self.devices = self._devices(ipus, devices)
        self._main_threads = torch.get_num_threads()
        # See [Note: one thread for a sharded program]
        all_cpu = all(d.type == "cpu" for d in self.devices.values())
        on_cpu = len(ipus) > 1 and all_cpu
        sharded = self.schedule_name == "sharded"
        # See [Note: micro-batches side by side]
        side = (
            on_cpu
            and not training
            and independent_micro_batches(spec.module for spec in program.stages)
        )
        self.cores = CoreShare(
            ipus,
            self._main_threads,
            pinned_threads_per_ipu(threads_per_ipu),
            serial=sharded,
            one_thread=on_cpu,
            side_by_side=side,
        )
        self._given = dict(self.cores.threads)  # the split the workers run with
        self._cost_s: dict[int, float] = {}  # per IPU, the current run's (see Finished.cost_s)
        self._mean_threads: dict[int, float] = {}  # per IPU, the current run's
        self._reports: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._executors = make_executors(program, self.routes, self.devices, training=training)
        if not training and all_cpu:
            self._prepare_in_place()
        self._always_one_thread = on_cpu and sharded
        # the worker sets, built when first used: one worker per IPU ("split"), one for all
        # ("one thread") or one per core on whole micro-batches ("side by side")
        self._sets: dict[str, dict[int, IpuWorker]] = {}
        self._threads: list[IpuWorker] = []  # every worker started, for close()
        self._finalizer = weakref.finalize(self, stop_workers, self._threads)
        self._kind = "one thread" if self._always_one_thread else "split"
        self._workers = self._worker_set(self._kind)  # the current run's
        self._by_stage = {s: w for w in self._workers.values() for s in w.stages}
        self._schedules: dict[int, Schedule] = {}
        self._one_thread_schedules: dict[int, Schedule] = {}
        self._run_id = 0
        self._pending: set[int] = set()  # IPUs whose worker has not finished the current run
        self._broken: str | None = None

    # -- construction ----------------------------------------------------------------------------

    def _check_mode(self) -> None:
        if self.schedule_name not in SCHEDULES or self.schedule_name == "forward":
            raise Error(
                f"unknown pipeline schedule {self.schedule_name!r} "
                "(known schedules: '1f1b', 'fill_drain', 'sharded')"
            )
        if self.training and (self.routes.loss_stage is None or self.routes.loss_stage == HOST):
            raise Error(
                f"training needs the program's loss_name to name a stage output, got "
                f"loss_name={self.program.loss_name!r}"
            )

    def _devices(
        self, ipus: list[int], devices: dict[int, torch.device] | None
    ) -> dict[int, torch.device]:
        if devices is None:
            return default_devices(ipus)
        missing = [ipu for ipu in ipus if ipu not in devices]
        if missing:
            raise Error(f"devices has no entry for IPUs {missing} (given: {sorted(devices)})")
        return {ipu: torch.device(devices[ipu]) for ipu in ipus}

    def _prepare_in_place(self) -> None:
        """Give each stage the graph that computes its host-only outputs into destinations
        (See [Note: outputs computed in place])."""
        for index, executor in self._executors.items():
            sent = {n for names in self.routes.outputs_to[index].values() for n in names}
            host_only = set(self.routes.to_host[index]) - sent
            spec = executor.spec
            executor.in_place = in_place_module(spec.module, spec.outputs, host_only)

    def _start_threads(self, one_thread: bool) -> dict[int, int]:
        """The threads a worker set starts on: the split, or every core for the one thread that
        a pipelined program's trials try (a sharded one keeps its policy's count)."""
        if one_thread and not self._always_one_thread:
            return dict.fromkeys(self.devices, self.cores.cores)
        return dict(self.cores.threads)

    def _worker_set(self, kind: str) -> dict[int, IpuWorker]:
        """The workers of one thread per IPU (``split``), of one thread for all (``one
        thread``) or of one thread per core (``side by side``); started when first asked for
        (a failure to start closes the runtime)."""
        if kind not in self._sets:
            one_thread = kind == "one thread"
            if kind == "side by side":
                workers = make_side_workers(
                    self.program,
                    self._executors,
                    self.routes,
                    self.cores.cores,
                    self._reports,
                    self.trace,
                )
            else:
                workers = make_workers(
                    self.program,
                    self._executors,
                    self.routes,
                    self.devices,
                    self._start_threads(one_thread),
                    self._reports,
                    self.trace,
                    budget=None if one_thread else self.cores.budget,
                    one_thread=one_thread,
                )
            self._threads.extend(workers.values())
            try:
                start_workers(list(workers.values()), self._reports)
            except BaseException:
                self.close()
                raise
            finally:
                restore_default_threads(self._main_threads)  # [Note: per-thread intra-op threads]
            self._sets[kind] = workers
        return self._sets[kind]

    # -- public API ----------------------------------------------------------------------------

    def schedule(self, num_microbatches: int) -> Schedule:
        """The schedule a run of ``num_microbatches`` micro-batches follows (printable grid)."""
        if num_microbatches not in self._schedules:
            self._schedules[num_microbatches] = make_schedule(
                self.schedule_name,
                len(self.program.stages),
                num_microbatches,
                training=self.training,
                stage_ipus=self.stage_ipus,
            )
        return self._schedules[num_microbatches]

    def _worker_actions(
        self, schedule: Schedule, kind: str, first: int = 0
    ) -> dict[int, tuple[Action, ...]]:
        """Each worker's actions for a run of ``schedule`` on the micro-batches from ``first``:
        its IPU's, or with one thread for all every stage's, in the order of the sharded
        schedule placed on that one IPU (See [Note: one thread for a sharded program]), or side
        by side those of every ``copies``-th micro-batch (See [Note: micro-batches side by
        side])."""
        if kind == "split":
            return {ipu: shifted(schedule.ipu_actions[ipu], first) for ipu in self._workers}
        home, m = min(self.devices), schedule.num_microbatches
        if m not in self._one_thread_schedules:
            self._one_thread_schedules[m] = make_schedule(
                "sharded",
                len(self.program.stages),
                m,
                training=self.training,
                stage_ipus=(home,) * len(self.program.stages),
            )
        actions = shifted(self._one_thread_schedules[m].ipu_actions[home], first)
        if kind == "one thread":
            (only,) = self._workers
            return {only: actions}
        copies = len(self._workers)
        return {copy: side_actions(actions, copies, copy) for copy in self._workers}

    def stage_executors(self) -> dict[int, StageExecutor]:
        """Each stage's executor by stage index (e.g. to attach a memory probe between runs)."""
        return dict(self._executors)

    def run(
        self,
        micro_batches: list[dict[str, torch.Tensor]],
        *,
        loss_scale: float = 1.0,
        step: Callable[[int], None] | None = None,
        into: list[dict[str, torch.Tensor]] | None = None,
        streams: list[MicroBatchStream] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """Run every micro-batch through the pipeline (forward, and backward in training).

        Gradients accumulate (sum) into each parameter's ``.grad`` over the micro-batches;
        backward starts from ``loss * loss_scale``. ``step(stage)`` runs on the stage's worker
        thread right after its last backward, while other stages may still be draining.

        Args:
            micro_batches: one ``{input name: tensor}`` per micro-batch.
            loss_scale: multiplies the loss gradient (e.g. ``1 / gradientAccumulation``).
            step: per-stage optimizer step (training only).
            into: per micro-batch, tensors that program outputs may be computed into
                (inference on the CPU; See [Note: outputs computed in place]).
            streams: per micro-batch, the random stream its stages draw from (See [Note: a
                random stream per model]); None draws from torch's generators.

        Returns:
            For each micro-batch, ``{name: detached tensor on the CPU}`` for
            ``program.output_names``.

        Raises:
            Error: a stage failed (names stage, IPU, micro-batch and graph node; chained from
                the original exception), bad inputs, or the runtime is closed.
        """
        self._check_usable()
        self._check_inputs(micro_batches)
        if not micro_batches:
            return []
        if into is not None and len(into) != len(micro_batches):
            raise Error(
                f"into has {len(into)} entries for {len(micro_batches)} micro-batches; give one "
                "dict of destinations per micro-batch"
            )
        if streams is not None and len(streams) != len(micro_batches):
            raise Error(
                f"streams has {len(streams)} entries for {len(micro_batches)} micro-batches; "
                "give one random stream per micro-batch"
            )
        resplit, self._given = self._given != self.cores.threads, dict(self.cores.threads)
        count, lent = len(micro_batches), self.cores.budget is not None
        results: list[dict[str, torch.Tensor]] = []
        first, probe_s = 0, None
        probe = self.cores.probe(count)  # See [Note: trials that cost a fraction of a call]
        if probe is not None:
            first = probe.count
            results, seconds = self._run_part(
                probe.mode, micro_batches, 0, first, loss_scale, None, into, streams
            )
            probe_s = seconds / first
        mode = self.cores.mode()  # See [Note: cores follow the work]
        rest, seconds = self._run_part(
            mode, micro_batches, first, count, loss_scale, step, into, streams
        )
        results += rest
        seconds_per_mb = seconds / (count - first)
        # the share of the cores its compute kept busy (See [Note: trials that cost a fraction
        # of a call])
        used = sum(self._cost_s.values()) / (seconds * self.cores.cores) if seconds > 0 else None
        # a run may have left a worker's count as default (every run with lent cores)
        scale = count / (count - first)
        self._share_cores(resplit or lent, seconds_per_mb, probe_s, scale, used)
        return [self._assemble(m, results[m], micro_batches[m]) for m in range(len(results))]

    def _run_part(
        self,
        mode: str,
        micro_batches: list[dict[str, torch.Tensor]],
        first: int,
        last: int,
        loss_scale: float,
        step: Callable[[int], None] | None,
        into: list[dict[str, torch.Tensor]] | None,
        streams: list[MicroBatchStream] | None,
    ) -> tuple[list[dict[str, torch.Tensor]], float]:
        """Run micro-batches ``first`` to ``last - 1`` in ``mode`` (one run of the workers):
        their results, in order, and the seconds they took (after starting the mode's workers,
        if this is their first run). A call's probe is one such run, the rest of it another
        (See [Note: trials that cost a fraction of a call])."""
        schedule = self.schedule(last - first)
        self._run_id += 1
        job_abort = threading.Event()
        if mode in ("one thread", "side by side"):
            self._kind = mode
        else:
            self._kind = "one thread" if self._always_one_thread else "split"
        workers = self._worker_set(self._kind)
        switched, self._workers = workers is not self._workers, workers
        self._by_stage = {s: w for w in self._workers.values() for s in w.stages}
        start = time.perf_counter()
        if self._kind != "split":
            release_team()  # the caller's: See [Note: one thread for a sharded program]
        per_worker = self._worker_actions(schedule, self._kind, first)
        # one thread runs the actions in order: no need to feed a serial run one at a time
        serial = schedule.serial and self._kind == "split"
        whole = {"one thread": self.cores.cores, "side by side": 1}.get(mode)  # every worker's
        for ipu, worker in self._workers.items():
            threads = whole if whole is not None else self.cores.threads[ipu]
            job = Job(
                self._run_id,
                per_worker[ipu],
                loss_scale,
                step,
                job_abort,
                serial,
                threads,
                lend=mode == "lent",
                recount=switched,
                into=tuple(into) if into is not None else None,
                streams=tuple(streams) if streams is not None else None,
            )
            worker.inbox.put(job)
        self._pending = set(self._workers)
        self._cost_s, self._mean_threads = {}, {}
        try:
            results = self._drive(serial, micro_batches, first, last, job_abort)
            return results, time.perf_counter() - start
        except Error:
            raise  # a stage failed; _drive already stopped the run
        except BaseException:  # KeyboardInterrupt included: stop the workers, then re-raise
            try:
                self._abort(job_abort)
            except BaseException:
                self._broken = "interrupted again while stopping a run"
                raise
            raise

    def close(self) -> None:
        """Stop and join the worker threads; safe to call twice."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether ``close`` has run."""
        return not self._finalizer.alive

    def __enter__(self) -> PipelineRuntime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- one run --------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.closed:
            raise Error("this PipelineRuntime is closed; build a new one")
        if self._broken is not None:
            raise Error(
                f"this PipelineRuntime is unusable ({self._broken}); close it and build a new one"
            )

    def _check_inputs(self, micro_batches: list[dict[str, torch.Tensor]]) -> None:
        want = set(self.program.input_names)
        for m, values in enumerate(micro_batches):
            if set(values) != want:
                raise Error(
                    f"micro-batch {m} has inputs {sorted(values)} but the program takes "
                    f"{sorted(want)}"
                )

    def _feed(self, m: int, values: dict[str, torch.Tensor]) -> None:
        """Send the program inputs of micro-batch ``m`` to every stage that reads them (side by
        side: to the stages of the worker computing ``m``)."""
        side = self._workers[m % len(self._workers)] if self._kind == "side by side" else None
        for spec in self.program.stages:
            names = self.routes.inputs_from[spec.index].get(HOST, ())
            if names or spec.index == 0:
                payload: dict[str, torch.Tensor | None] = {n: values[n] for n in names}
                transfer = Transfer(self._run_id, "act", spec.index, m, HOST, payload)
                (side or self._by_stage[spec.index]).inbox.put(transfer)

    def _drive(
        self,
        serial: bool,
        micro_batches: list[dict[str, torch.Tensor]],
        first: int,
        count: int,
        job_abort: threading.Event,
    ) -> list[dict[str, torch.Tensor]]:
        """Feed the inputs of micro-batches ``first`` to ``count - 1`` (one at a time when
        serial), collect their outputs until every worker finished."""
        last = len(self.program.stages) - 1
        fed = count if not serial else first + 1
        for m in range(first, fed):
            self._feed(m, micro_batches[m])
        results: list[dict[str, torch.Tensor]] = [{} for _ in range(first, count)]
        pending = self._pending
        while pending:
            try:
                ok, payload = self._reports.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(pending, job_abort)
                continue
            if getattr(payload, "run_id", self._run_id) != self._run_id:
                continue  # a late report of an aborted run
            if not ok:
                pending.discard(payload.worker)
                self._abort(job_abort)
                raise payload.failure.error() from payload.failure.exc
            if isinstance(payload, Output):
                results[payload.mb - first].update(payload.values)
                if payload.stage == last and fed < count:
                    self._feed(fed, micro_batches[fed])
                    fed += 1
            elif isinstance(payload, Finished):
                for output in payload.outputs:  # deferred by the worker (see worker._report)
                    results[output.mb - first].update(output.values)
                self._cost_s[payload.ipu] = payload.cost_s
                self._mean_threads[payload.ipu] = payload.threads
                pending.discard(payload.ipu)
        return results

    def _share_cores(
        self,
        resplit: bool,
        seconds_per_mb: float,
        probe_s: float | None,
        scale: float,
        used: float | None,
    ) -> None:
        """After a call: record the workers' measured work (``scale`` times that of the run
        after the probe: a whole call's), the times per micro-batch of the run after the probe
        and of the probe, and the share of the cores its compute kept busy (See [Note: cores
        follow the work]).

        A run whose workers took a new thread count (every run with lent cores) left that count
        as the process-wide default: restore it (See [Note: per-thread intra-op threads]).
        """
        if resplit:
            restore_default_threads(self._main_threads)
        cost = {ipu: spent * scale for ipu, spent in self._cost_s.items()}
        self.cores.observe(cost, self._mean_threads, seconds_per_mb, probe_s, used)

    def _check_alive(self, pending: set[int], job_abort: threading.Event) -> None:
        """A worker thread that vanished mid-run would leave the caller waiting for ever."""
        dead = [ipu for ipu in sorted(pending) if not self._workers[ipu].thread.is_alive()]
        if dead:
            job_abort.set()
            for worker in self._workers.values():
                worker.inbox.put(Abort(self._run_id))
            self._broken = f"the worker threads of IPUs {dead} died"
            raise Error(
                f"the worker threads of IPUs {dead} stopped in the middle of a run; "
                "close this PipelineRuntime and build a new one"
            )

    def _abort(self, job_abort: threading.Event) -> None:
        """Tell every worker to drop the run; wait (bounded) until the pending ones stopped."""
        pending = self._pending
        job_abort.set()
        for worker in self._workers.values():
            worker.inbox.put(Abort(self._run_id))
        deadline = time.monotonic() + ABORT_GRACE_S
        while pending and time.monotonic() < deadline:
            try:
                ok, payload = self._reports.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if getattr(payload, "run_id", None) != self._run_id:
                continue
            if isinstance(payload, Failed):
                pending.discard(payload.worker)
            elif isinstance(payload, Finished):
                pending.discard(payload.ipu)
        if pending:
            self._broken = f"IPU workers {sorted(pending)} did not stop after a failed run"
            logger.warning("%s within %.0f s", self._broken, ABORT_GRACE_S)

    def _assemble(
        self, m: int, produced: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Micro-batch ``m``'s outputs in ``output_names`` order (inputs may pass through)."""
        out = {}
        for name in self.program.output_names:
            out[name] = produced[name] if name in produced else inputs[name].detach()
        return out


def shifted(actions: tuple[Action, ...], first: int) -> tuple[Action, ...]:
    """``actions`` on micro-batches ``first`` on: each micro-batch index plus ``first``."""
    if not first:
        return actions
    return tuple(a if a.mb is None else replace(a, mb=a.mb + first) for a in actions)
