"""The loading loop that prefetches batches, epoch by epoch, into a bounded queue.

``Prefetcher`` runs it on a daemon thread of the caller's process; the AsynchronousDataAccessor
runs the same loop on the main thread of its worker process (``worker_main.py``, whose
subclass puts into the shared ring and takes the consumer's requests from a pipe).

[Note: prefetch epochs]
The producer (one daemon thread) and the consumer (the caller's thread) agree on epochs through
a *generation* number. Every queue item carries the generation of the epoch it belongs to::

    producer:  open epoch g ─► put (g, data) ... (g, data) ─► put (g, eof)
               ─► load_indefinitely: open epoch g+1 at once and keep prefetching
               ─► otherwise (or after an error): wait until the consumer asks for g+1
    consumer:  iter(): finished epoch g          -> wants g+1 (already being prefetched)
                       stopped part-way through g -> wants g+1: the producer abandons its
                                                     iterator, items of g still queued are
                                                     skipped as stale
                       nothing read yet          -> nothing changes

The producer only ever moves forward (it restarts when ``wanted > generation``), so it is at
most one epoch ahead and never produces an epoch twice. Every blocking call polls a stop flag,
so ``close()`` always returns; failures travel as queue items and are re-raised by the consumer
(See [Note: worker threads]).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..runtime.threads import POLL_S, join_all, polled_put

__all__ = ["Item", "Prefetcher", "StartupResult"]


class Item(NamedTuple):
    """One queue entry: ``kind`` is ``"data"``, ``"eof"`` or ``"error"``."""

    generation: int
    kind: str
    payload: Any = None


class StartupResult(NamedTuple):
    """How the first element went: ``kind`` is ``"ok"``, ``"empty"`` or ``"error"``."""

    kind: str
    error: BaseException | None = None


class Prefetcher:
    """Loads epochs of ``open_epoch()`` on a daemon thread into a queue of ``buffer_size`` items.

    Args:
        open_epoch: returns a fresh iterator over one epoch; returns None when its owner is gone.
        close_epoch: called on the producer thread with a finished or abandoned iterator, and
            ``final=True`` once when the thread ends, to stop the worker processes behind it.
        buffer_size: queue capacity, in batches (end-of-epoch markers take a slot too).
        load_indefinitely: start the next epoch as soon as one ends.
        early_preload: keep loading past the first batch before the first ``iter()``.
        check_first: validates the first element; raises to fail the start.
        name: thread name.
    """

    def __init__(
        self,
        open_epoch: Callable[[], Iterator[Any] | None],
        close_epoch: Callable[[Iterator[Any] | None, bool], None],
        buffer_size: int,
        load_indefinitely: bool,
        early_preload: bool,
        check_first: Callable[[Any], None],
        name: str,
    ) -> None:
        self._open_epoch = open_epoch
        self._close_epoch = close_epoch
        self._check_first = check_first
        self._load_indefinitely = load_indefinitely
        self.queue: queue.Queue[Item] = queue.Queue(maxsize=max(1, buffer_size))
        self._cond = threading.Condition()
        self._stop = False
        self._go = early_preload
        self._wanted = 0
        self._startup: StartupResult | None = None
        self._first_iterator: Iterator[Any] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- consumer side ---------------------------------------------------------------------
    def start(self) -> StartupResult:
        """Start the thread and wait until the first element is loaded (or failed to load).

        The first epoch's iterator is opened here, on the caller's thread: a torch loader
        forks its (persistent) worker processes then, and forking from the main thread is safer
        than from a background thread while other threads run.
        """
        try:
            self._first_iterator = self._open_epoch()
        except Exception as error:  # reported like any other start failure
            self._first_iterator = None
            self._startup = StartupResult("error", error)
            return self._startup
        self._thread.start()
        with self._cond:
            while self._startup is None:
                self._cond.wait(POLL_S)
        return self._startup

    def request_epoch(self, generation: int) -> None:
        """Ask for epoch ``generation`` (and allow loading past the first element)."""
        with self._cond:
            self._go = True
            self._wanted = max(self._wanted, generation)
            self._cond.notify_all()

    def get(self) -> Item:
        """Next queue item; raises RuntimeError if the thread died without saying why."""
        while True:
            try:
                return self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self.queue.empty():
                    raise RuntimeError(
                        "the AsynchronousDataAccessor loading thread has stopped"
                    ) from None

    def close(self) -> None:
        """Stop the thread, wait for it (and its worker processes) to finish."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return
        self._drain()
        join_all(
            [self._thread],
            why=" (the AsynchronousDataAccessor's dataset is probably blocked inside "
            "__getitem__/__next__); leaving it as a daemon thread",
        )

    def _drain(self) -> None:
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return

    # ---- producer side ---------------------------------------------------------------------
    def _wait_for(self, predicate: Callable[[], bool]) -> bool:
        """Block until ``predicate()`` or stop; returns False on stop."""
        with self._cond:
            while not self._stop and not predicate():
                self._cond.wait(POLL_S)
            return not self._stop

    def _put(self, item: Item) -> bool:
        """Put ``item``; returns False if stopped or the epoch was abandoned meanwhile."""
        return polled_put(self.queue, item, lambda: self._stop or self._wanted > item.generation)

    def _set_startup(self, result: StartupResult) -> None:
        with self._cond:
            self._startup = result
            self._cond.notify_all()

    def _run(self) -> None:
        iterator, self._first_iterator = self._first_iterator, None
        generation = 0
        try:
            if not self._load_first(iterator):
                return
            while True:
                ended = "error"  # opening the epoch failed (already reported)
                if iterator is not None:
                    ended = self._load_epoch(iterator, generation)
                    self._close_epoch(iterator, False)
                    iterator = None
                generation = self._next_generation(generation, ended)
                if generation < 0:
                    return
                try:
                    iterator = self._open_epoch()
                except Exception as error:  # reported to the consumer; wait for the next epoch
                    self._put(Item(generation, "error", error))
                    continue
                if iterator is None:  # the owner is gone
                    return
        except BaseException as error:  # reported to the consumer, never lost
            if self._startup is None:
                self._set_startup(StartupResult("error", error))
            else:
                self._put(Item(generation, "error", error))
        finally:
            self._close_epoch(iterator, True)

    def _load_first(self, iterator: Iterator[Any] | None) -> bool:
        """Load epoch 0's first element and report the start; False if there is nothing."""
        if iterator is None:
            self._set_startup(StartupResult("error", RuntimeError("the dataset is gone")))
            return False
        try:
            first = next(iterator)
        except StopIteration:
            self._set_startup(StartupResult("empty"))
            return False
        self._check_first(first)
        self.queue.put(Item(0, "data", first))
        self._set_startup(StartupResult("ok"))
        return True

    def _load_epoch(self, iterator: Iterator[Any], generation: int) -> str:
        """Load one epoch; returns ``"eof"``, ``"error"``, ``"reset"`` or ``"stop"``."""
        while True:
            if not self._wait_for(lambda: self._go):
                return "stop"
            if self._wanted > generation:
                return "reset"
            try:
                batch = next(iterator)
            except StopIteration:
                if self._put(Item(generation, "eof")):
                    return "eof"
                return "stop" if self._stop else "reset"
            except Exception as error:  # reported to the consumer
                self._put(Item(generation, "error", error))
                return "error"
            if not self._put(Item(generation, "data", batch)):
                return "stop" if self._stop else "reset"

    def _next_generation(self, generation: int, ended: str) -> int:
        """The epoch to load next, or -1 to stop."""
        if ended == "stop" or self._stop:
            return -1
        if ended == "eof" and self._load_indefinitely:
            return generation + 1
        if ended == "reset":
            return self._wanted
        # End of data without load_indefinitely, or an error: wait for the consumer.
        if not self._wait_for(lambda: self._wanted > generation):
            return -1
        return self._wanted
