"""Replicas of a single-IPU program computing at the same time, one thread each, as R processes.

[Note: replicas on threads]
``replicationFactor(R)`` in one process used to run the replicas' micro-batches one after the
other on the caller's thread, so R replicas took R times as long as one even with idle cores;
R processes (``poprun``) each compute their replica at once. Here each replica gets a thread of
its own with ``cores // R`` intra-op threads (or ``POPTORCH_SIM_THREADS_PER_IPU``: a replica is
an IPU) and its own shallow copy of the model, made as the device copy is (see [Note: what the
device copies] in device_tree.py): the same ``Parameter`` objects, its own module objects and,
with ``broadcastBuffers(False)``, its own buffers; every other attribute is the model's object,
as PopTorch's replicas run one graph traced from the one model. A device iteration::

    replica thread r:  for a in GA: forward(mb[a, r]); grads[a, r] = autograd.grad(loss * scale)
    caller:            for a in GA: for r in R: p.grad += grads[a, r]; collect outputs[a, r]
                       optimizer step

The caller takes each micro-batch's gradients in PopTorch's [GA, R] order and adds them as
``loss.backward()`` on its thread would have (first one assigned, then added in place), so the
accumulated gradients, outputs and weights are the ones the one-thread loop computes, to the bit
where the intra-op thread count does not change an op's result. A replica thread is at most two
micro-batches ahead of the caller (bounded queues), so at most ``2R`` gradient sets wait.

Measured (``taskset -c 0,1 python3 benchmarks/scale_out.py --quick --skip-sizes``, 2026-11-25,
commit b103392, two cores of an idle 16-core Intel Xeon, torch 2.11, load average 1.2): one
process with 2 replicas did 1.92x the samples/s of one replica (18,151 against 9,433); two
processes with one replica each, 1.35x. A call ends once every replica thread has marked its
job done; it used to wait for one more result instead, a whole poll interval (50 ms) whenever a
thread marked its job done just after the caller took its last result, which on a 2-vCPU AMD
EPYC Zen 4 (dev-zen4, quiet, the same command without ``taskset``, 2026-11-26) held 2 replicas
to 0.68-0.91x of one replica in four runs; waiting for the mark itself: 1.44-1.73x in three.

Replicas run on threads only where that cannot change what the loop computes; otherwise (and
when a model cannot be copied) the one-thread loop runs, as before:

    the model                                              why one thread
    draws random numbers in forward (dropout, ...)         draws would interleave across replicas
    has buffers shared by the replicas (broadcastBuffers)  their updates would interleave
    has a loss that is not one of forward's outputs        found by a process-wide recorder
    has hooks on a parameter's gradient                    they expect ``.backward()``
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import Error
from ..ipu_context import running_on_ipu
from ..ops.control import training_graph
from ..runtime import worker_memory
from ..runtime.intra_op import (
    pinned_threads_per_ipu,
    release_team,
    restore_default_threads,
    set_worker_threads,
)
from ..runtime.threads import (
    JOIN_TIMEOUT_S,
    POLL_S,
    join_all,
    polled_get,
    polled_put,
    start_thread,
)
from .device_tree import device_tree
from .inputs import BoundArgs
from .replica_groups import GroupedVariable, grouped_variables
from .replicas import ReplicaBuffers

__all__ = ["ReplicaThreads", "replica_copies"]

_STOP = object()

Result = tuple[list[Any], list[torch.Tensor | None] | None]  # output leaves, gradients


def replica_copies(
    model: nn.Module, replicas: int, buffers: ReplicaBuffers | None
) -> list[nn.Module]:
    """One copy of ``model`` per replica sharing its parameters (and replica r's buffers).

    Each copy is made as the device copy is (``device_tree``): its own module objects holding
    the model's parameters and its own buffers, every other attribute object (a Lightning
    trainer, a loss function) the model's own. Nothing is deep-copied, so no ``__getstate__``
    or ``__deepcopy__`` drops an attribute that ``forward`` reads.
    """
    copies = []
    for r in range(replicas):
        replica, memo = device_tree(model, shared=model.parameters())
        if buffers is not None:
            for (module, name), buf in zip(buffers.slots, buffers.sets[r]):
                memo[id(module)]._buffers[name] = buf
        copies.append(replica)
    return copies


class _Job:
    """One replica's micro-batches of a device iteration."""

    def __init__(self, micro_batches: list[BoundArgs], training: bool, scale: float) -> None:
        self.micro_batches, self.training, self.scale = micro_batches, training, scale
        self.abort = threading.Event()  # the caller gave the job up (or took every result)
        self.done = threading.Event()  # the thread left the job


class _Replica:
    """What one replica thread holds (never the ``ReplicaThreads``, so that a dropped program
    is collected and its finalizer stops the threads)."""

    def __init__(
        self,
        module: nn.Module,
        params: list[nn.Parameter],
        loss_leaf: int | None,
        threads: int,
        ready: threading.Semaphore,
        index: int = 0,
        grouped: list[GroupedVariable] | None = None,
    ) -> None:
        self.module, self.params, self.loss_leaf = module, params, loss_leaf
        self.index, self.grouped = index, grouped or []
        self.threads, self.ready = threads, ready
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.results: queue.Queue[Any] = queue.Queue(maxsize=2)

    def main(self) -> None:
        set_worker_threads(self.threads)
        worker_memory.enter()
        self.ready.release()
        while True:
            job = self.inbox.get()
            if job is _STOP:
                return
            position = 0  # the replica's micro-batch being computed
            try:
                for result in self._compute(job):
                    if not self._put((True, result), job):
                        break
                    position += 1
            except BaseException as exc:  # reported, never raised across threads
                self._put((False, (position, exc)), job)
            finally:
                if self.threads > 1:  # going idle: See [Note: idle teams slow every team]
                    release_team()
                job.done.set()

    def _compute(self, job: _Job) -> Iterator[Result]:
        for mb in job.micro_batches:
            grouped = grouped_variables(self.grouped, self.module, self.index)
            with running_on_ipu(), training_graph(job.training), grouped:
                with torch.set_grad_enabled(job.training):
                    out = self.module(*mb.args, **mb.kwargs)
            leaves = pytree.tree_leaves(out)
            grads = None
            if job.training and self.loss_leaf is not None:
                loss = leaves[self.loss_leaf]
                if loss.grad_fn is not None:
                    seed = torch.full_like(loss, job.scale)
                    grads = list(torch.autograd.grad(loss, self.params, seed, allow_unused=True))
            yield [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves], grads

    def _put(self, item: Any, job: _Job) -> bool:
        """Hand ``item`` to the caller; False when the caller gave the job up."""
        return polled_put(self.results, item, job.abort) and not job.abort.is_set()


class ReplicaThreads:
    """The replica threads of one program. See [Note: replicas on threads].

    Args:
        model: the device copy of the model.
        replicas: R.
        buffers: per-replica buffers (``broadcastBuffers(False)``) or None.
        loss_leaf: index of the final loss among forward's output leaves (training).
        grouped: replica-grouped parameters (each replica computes with its group's value).
    """

    def __init__(
        self,
        model: nn.Module,
        replicas: int,
        buffers: ReplicaBuffers | None,
        loss_leaf: int | None,
        grouped: list[GroupedVariable] | None = None,
    ) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        main = torch.get_num_threads()
        pinned = pinned_threads_per_ipu(None)
        self.threads_per_replica = pinned if pinned is not None else max(1, main // replicas)
        ready = threading.Semaphore(0)
        self._replicas = [
            _Replica(module, self.params, loss_leaf, self.threads_per_replica, ready, r, grouped)
            for r, module in enumerate(replica_copies(model, replicas, buffers))
        ]
        self._threads = [
            start_thread(rep.main, f"poptorch_sim replica {r}")
            for r, rep in enumerate(self._replicas)
        ]
        for _ in self._threads:
            ready.acquire(timeout=JOIN_TIMEOUT_S)
        restore_default_threads(main)  # See [Note: per-thread intra-op threads]
        inboxes = [rep.inbox for rep in self._replicas]
        self._finalizer = weakref.finalize(self, _shutdown, inboxes, self._threads)

    @property
    def modules(self) -> list[nn.Module]:
        """Each replica's copy of the model."""
        return [rep.module for rep in self._replicas]

    def current(self) -> bool:
        """Whether the copies still hold the model's parameters (not replaced since)."""
        now = [p for p in self.model.parameters() if p.requires_grad]
        return len(now) == len(self.params) and all(a is b for a, b in zip(now, self.params))

    def close(self) -> None:
        """Stop and join the threads."""
        self._finalizer()

    def run(
        self,
        items: list[tuple[int, BoundArgs]],
        training: bool,
        loss_scale: float,
        collect: Callable[[list[Any]], None],
    ) -> None:
        """One device iteration's ``(replica, micro-batch)`` items, in [GA, R] order.

        Raises:
            Error: a replica failed (names it and its micro-batch; chained from the original).
        """
        per_replica: list[list[BoundArgs]] = [[] for _ in self._replicas]
        for r, mb in items:
            per_replica[r].append(mb)
        jobs = [_Job(mbs, training, loss_scale) for mbs in per_replica]
        for rep, job in zip(self._replicas, jobs):
            rep.inbox.put(job)
        try:
            for r, _mb in items:
                leaves, grads = self._take(r)
                if grads is not None:
                    _accumulate(self.params, grads)
                collect(leaves)
        finally:
            for job in jobs:
                job.abort.set()
            self._drain(jobs)

    def _take(self, r: int) -> Result:
        thread = self._threads[r]
        got, outcome = polled_get(self._replicas[r].results, lambda: not thread.is_alive())
        if not got:
            raise Error(f"the thread of replica {r} stopped in the middle of a run")
        ok, payload = outcome
        if ok:
            return payload  # type: ignore[no-any-return]
        mb, exc = payload
        raise Error(f"replica {r} failed on its micro-batch {mb}: {exc}") from exc

    def _drain(self, jobs: list[_Job]) -> None:
        """Wait until every thread has left its job, emptying its result queue (after a failure
        a thread may be waiting for room in it); the next run starts from empty queues. A thread
        that has handed over its last result is waited for only until it marks its job done."""
        for rep, thread, job in zip(self._replicas, self._threads, jobs):
            while not job.done.is_set() and thread.is_alive():
                _empty(rep.results)
                job.done.wait(POLL_S)
            _empty(rep.results)


def _empty(results: queue.Queue[Any]) -> None:
    while not results.empty():
        results.get_nowait()


def _accumulate(params: list[nn.Parameter], grads: list[torch.Tensor | None]) -> None:
    """``p.grad`` += each gradient, as autograd's ``AccumulateGrad`` does in ``.backward()``."""
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)
            else:
                p.grad.add_(g)


def _shutdown(inboxes: list[queue.Queue[Any]], threads: list[threading.Thread]) -> None:
    for inbox in inboxes:
        inbox.put(_STOP)
    join_all(threads, why=" (a replica still inside its model call)")
