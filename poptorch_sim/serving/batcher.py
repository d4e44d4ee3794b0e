"""``Batcher``: the request-batching service under ``Runner`` and ``PackRunner``.

[Note: the batching service]
Callers ``submit`` requests (anything with a ``future``) to a bounded queue; ``feeders`` feeder
threads each gather one batch at a time and serve it with one model call::

    submit ──► [bounded queue] ──► feeder: gather ──► policy.call(batch) ──► each future's result
                                     ▲   │ no room in this batch
                                     └── held (oldest first, opens the next batch)

Gathering (one feeder at a time, so batches fill in arrival order): place the held requests,
else wait for a first one; then add from the queue until the batch is ``full``, ``max_held``
requests are held back for lack of room, or ``timeout_s`` has passed since the batch got its
first request.

What is a batch (``policy.open()``: rows or slots, when it is full, whether a cancelled request
takes room) and one model call (``policy.call``) belong to the adapter; futures whose request
runs (``Future.running()``) get the call's results. A failing call goes to the failure policy:
``fail_all`` hands the error to every running future of the batch; ``retry_alone`` runs each
request of a batch alone so only the failing ones' callers hear of it.

Stopping is one mechanism, a ``threading.Event`` that every wait polls (See [Note: worker
threads]): ``close()`` sets it under the submit lock, so nothing is queued behind it. Then with
``drain=True`` the feeders run every queued request before leaving, and ``close`` waits for
them; with ``drain=False`` they finish the batch in hand, and ``close`` fails the requests still
waiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, Protocol, TypeVar

from ..runtime.threads import (
    LONG_JOIN_TIMEOUT_S,
    POLL_S,
    Outcome,
    attempt,
    join_all,
    polled_get,
    start_thread,
)

__all__ = [
    "Batch",
    "BatchPolicy",
    "Batcher",
    "Closed",
    "FailurePolicy",
    "fail_all",
    "retry_alone",
]


class Queued(Protocol):
    """A request: whatever it carries, the future its result goes to."""

    @property
    def future(self) -> Future[Any]: ...


R = TypeVar("R", bound=Queued)


class Batch(Protocol[R]):
    """The requests of one model call, in the order ``BatchPolicy.call`` returns their results."""

    requests: list[R]

    @property
    def full(self) -> bool:
        """Whether gathering can stop without waiting for the timeout."""
        ...

    def add(self, request: R) -> bool:
        """Take ``request`` (or drop it, if it was cancelled); False when it does not fit."""
        ...


B = TypeVar("B", bound=Batch[Any])


class BatchPolicy(Protocol[B]):
    """What a batch is and how one is run."""

    def open(self) -> B:
        """A new, empty batch."""
        ...

    def call(self, batch: B) -> list[Any]:
        """Run the model once on ``batch``; each request's result, in ``batch.requests`` order."""
        ...


FailurePolicy = Callable[["Batcher[Any]", Batch[Any], BaseException], None]


class Closed(Exception):
    """``submit`` on a closed ``Batcher``."""


def _running(requests: list[Any]) -> list[Any]:
    return [r for r in requests if r.future.running()]


def fail_all(batcher: Batcher[Any], batch: Batch[Any], error: BaseException) -> None:
    """Every running request of the failed batch gets ``error``."""
    for request in _running(batch.requests):
        request.future.set_exception(error)


def retry_alone(batcher: Batcher[Any], batch: Batch[Any], error: BaseException) -> None:
    """Run each request of the failed batch alone: only the failing ones get their error."""
    if len(batch.requests) == 1:
        fail_all(batcher, batch, error)
        return
    for request in batch.requests:
        alone = batcher.policy.open()
        alone.add(request)
        batcher.finish(alone, attempt(batcher.policy.call, alone), fail_all)


class Batcher(Generic[B]):
    """A bounded request queue served in batches by feeder threads (See [Note: the batching
    service]).

    Args:
        policy: makes batches and runs them.
        max_queue: requests that may wait in the queue.
        timeout_s: how long a batch may wait to fill after it got its first request.
        max_held: requests held back for lack of room that end a batch's gathering.
        on_failure: ``fail_all`` or ``retry_alone``.
        feeders: feeder threads (model calls that may run at once).
        name: thread names: ``name`` for one feeder, else ``f"{name} {i}"``.
        drain: ``close()`` runs the queued requests (True) or fails them (False).
        join_timeout_s: how long ``close()`` waits for the feeders (None: as long as it takes).
    """

    def __init__(
        self,
        policy: BatchPolicy[B],
        *,
        max_queue: int,
        timeout_s: float,
        max_held: int,
        on_failure: FailurePolicy,
        feeders: int = 1,
        name: str,
        drain: bool,
        join_timeout_s: float | None = LONG_JOIN_TIMEOUT_S,
    ) -> None:
        self.policy, self.on_failure = policy, on_failure
        self.timeout_s, self.max_held, self.drain = timeout_s, max_held, drain
        self.join_timeout_s = join_timeout_s
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self.held: list[Any] = []  # taken from the queue, in no batch yet, oldest first
        self.stop = threading.Event()
        self._submit_lock = threading.Lock()
        self._gather_lock = threading.Lock()
        names = [name] if feeders == 1 else [f"{name} {i}" for i in range(feeders)]
        self.threads = [start_thread(self._feed, n) for n in names]

    # -- callers ----------------------------------------------------------------------------------

    def submit(self, request: Any, timeout: float | None) -> None:
        """Queue ``request``, waiting up to ``timeout`` s for room (None: as long as it takes).

        Raises:
            Closed: ``close`` has begun.
            queue.Full: no room within ``timeout``.
        """
        with self._submit_lock:  # checked and queued at once: nothing lands behind close()
            if self.stop.is_set():
                raise Closed()
            self.queue.put(request, timeout=timeout)

    def close(self, error: Callable[[], BaseException]) -> None:
        """Stop the feeders and join them; requests left waiting get ``error()`` (not drained)."""
        with self._submit_lock:
            self.stop.set()
        join_all(self.threads, self.join_timeout_s)
        with self._gather_lock:
            left, self.held = self.held, []
        while True:
            try:
                left.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for request in left:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(error())

    def finish(self, batch: B, outcome: Outcome, on_failure: FailurePolicy) -> None:
        """Complete the running futures of ``batch`` with the call's ``outcome``."""
        ok, payload = outcome
        if not ok:
            on_failure(self, batch, payload)
            return
        for request, result in zip(batch.requests, payload):
            if request.future.running():
                request.future.set_result(result)

    # -- feeders ----------------------------------------------------------------------------------

    def _feed(self) -> None:
        while True:
            with self._gather_lock:
                if self.stop.is_set() and not (self.drain and self._waiting()):
                    return
                batch = self._gather()
            if batch is not None and batch.requests:
                self.finish(batch, attempt(self.policy.call, batch), self.on_failure)

    def _waiting(self) -> bool:
        return bool(self.held) or not self.queue.empty()

    def _gather(self) -> B | None:
        """One batch in arrival order, or None when no request came within ``POLL_S``."""
        if not self.held:
            got, first = polled_get(self.queue, self.stop, POLL_S)
            if not got:
                return None
            self.held.append(first)
        batch = self.policy.open()
        held, self.held = self.held, []
        for request in held:
            if batch.full or not batch.add(request):
                self.held.append(request)
        if not batch.requests:
            return batch  # the first request was cancelled
        deadline = time.monotonic() + self.timeout_s
        while not batch.full and len(self.held) < self.max_held:
            left = deadline - time.monotonic()
            got, request = polled_get(self.queue, self.stop, max(0.0, left))
            if not got:
                break
            if not batch.add(request):
                self.held.append(request)
        return batch
