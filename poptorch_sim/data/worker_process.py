"""The AsynchronousDataAccessor's worker process: loads batches ahead into a shared ring.

[Note: the accessor's worker process]
As PopTorch's, the accessor loads data in a separate *process*, so that decoding and collating
never compete with the model for the interpreter lock::

    parent (the accessor)                      worker process (forked)
    ---------------------                      -----------------------
    start()  ── fork ─────────────────────►    open epoch 0, load the first element
             ◄── ("startup", ok|empty|error)   (the loading loop of prefetch.py, run on
    request_epoch(g) ── ("epoch", g) ──────►    the worker's only thread; see
    get():  slot, item ◄── data pipe ───────    [Note: prefetch epochs])
            indices_mem[slot] = 0  (free)      put: wait until indices_mem[slot] == 0,
                                                    indices_mem[slot] = 1, send (slot, item)
    close() ── ("stop",) ──► join; SIGINT, then SIGTERM if it does not exit

``indices_mem`` is a ``buffer_size``-long uint8 tensor in shared memory: slot ``i`` is 1 while
the batch loaded into it waits to be read, so at most ``buffer_size`` batches (end-of-epoch
markers included) are loaded ahead. A batch's tensors are written into the slot's own shared
memory (``ring.py``) and the pipe carries only a small pickle of the batch's structure; the
parent copies the tensors out before freeing the slot, so a returned batch is never
overwritten by a later one.

The worker exits quietly on SIGINT (Ctrl-C in a notebook reaches every process), when asked to
stop, and when its parent is gone (the command pipe closes). Failures of the dataset travel to
the parent as items and are raised there (an exception that cannot be pickled is replaced by a
RuntimeError carrying its type, message and traceback).

Simulated: the worker is always forked (``sharing_strategy`` is checked but not used: PopTorch
starts it with forkserver, spawn or fork and pickles the dataset for the first two).
"""

from __future__ import annotations

import atexit
import os
import signal
import traceback
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing

from ..logger import logger
from ..runtime.threads import POLL_S
from .prefetch import Item, Prefetcher, StartupResult
from .ring import SlotReader, SlotWriter, new_ring_name, remove_slots

__all__ = ["RingFlags", "WorkerProcess"]

_JOIN_S = 10.0  # how long a stopping worker may take before SIGINT, then SIGTERM


class RingFlags:
    """The ring's slot flags (``indices_mem``), shared by the parent and the worker."""

    def __init__(self, buffer_size: int) -> None:
        self.indices_mem = torch.zeros(max(1, buffer_size), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.indices_mem)


class WorkerProcess:
    """The parent's handle on the worker process; the same interface as ``Prefetcher``.

    Args:
        open_epoch, close_epoch, buffer_size, load_indefinitely, early_preload, check_first:
            as ``Prefetcher``'s; called in the worker process.
        name: the process name.
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
        self._data_buffers = RingFlags(buffer_size)
        self._ring = new_ring_name()
        self._reader = SlotReader(self._ring)
        self._loader_args = (
            open_epoch,
            close_epoch,
            buffer_size,
            load_indefinitely,
            early_preload,
            check_first,
        )
        ctx = torch.multiprocessing.get_context("fork")
        self._data, child_data = ctx.Pipe(duplex=False)
        child_commands, self._commands = ctx.Pipe(duplex=False)
        self._child_ends = (child_data, child_commands)
        self._process = ctx.Process(target=self._main, name=name, daemon=False)
        self._closed = False
        self._early: list[tuple[Any, ...]] = []

    # ---- parent side -----------------------------------------------------------------------
    def start(self) -> StartupResult:
        """Fork the worker and wait until it has loaded the first element (or failed to)."""
        logger.debug("AsynchronousDataAccessor parent process: %d", os.getpid())
        self._process.start()
        for end in self._child_ends:
            end.close()
        _live.add(self)
        _exit_hook_registered()
        while True:
            message = self._receive()
            if message is None:
                return StartupResult(
                    "error", RuntimeError(f"the worker process died ({self._exit_text()})")
                )
            if message[0] == "startup":
                error = _loads(self._reader, message[2], 0, None)
                return StartupResult(message[1], None if message[2] is None else error.payload)
            self._early.append(message)  # the first element comes before the startup report

    def request_epoch(self, generation: int) -> None:
        """Ask for epoch ``generation`` (and allow loading past the first element)."""
        self._send(("epoch", generation))

    def get(self) -> Item:
        """The next item, in order; raises RuntimeError if the worker died without saying why."""
        message = self._early.pop(0) if self._early else self._receive()
        if message is None:
            raise RuntimeError(
                f"the AsynchronousDataAccessor worker process has stopped ({self._exit_text()})"
            )
        _, slot, generation, blob = message
        try:
            return _loads(self._reader, blob, generation, slot)
        finally:
            self._data_buffers.indices_mem[slot] = 0  # read: the worker may reuse the slot

    def close(self) -> None:
        """Stop the worker (and its data loader's processes) and wait for it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        if self._process.pid is None:
            return
        self._send(("stop",))
        self._process.join(_JOIN_S)
        if self._process.exitcode is None:  # blocked inside the dataset: interrupt it
            os.kill(self._process.pid, signal.SIGINT)
            self._process.join(_JOIN_S)
        if self._process.exitcode is None:
            logger.warning(
                "AsynchronousDataAccessor: the worker process %d did not stop; terminating it",
                self._process.pid,
            )
            self._process.terminate()
            self._process.join()
        self._data.close()
        self._commands.close()
        self._reader.close()
        remove_slots(self._ring, len(self._data_buffers))

    def _send(self, command: tuple[Any, ...]) -> None:
        try:
            self._commands.send(command)
        except (BrokenPipeError, OSError):  # the worker is gone: get() reports it
            pass

    def _receive(self) -> Any:
        """The next message from the worker, or None once it has exited and sent nothing."""
        while True:
            try:
                if self._data.poll(POLL_S):
                    return self._data.recv()
            except EOFError:
                return None
            if self._process.exitcode is not None and not self._data.poll(0):
                return None

    def _exit_text(self) -> str:
        code = self._process.exitcode
        if code is not None and code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit code {code}"

    # ---- worker side -----------------------------------------------------------------------
    def _main(self) -> None:
        self._data.close()
        self._commands.close()
        data, commands = self._child_ends
        logger.debug("AsynchronousDataAccessor worker process: %d", os.getpid())
        loader = _WorkerLoop(*self._loader_args)
        writer = SlotWriter(self._ring)
        loader.connect(data, commands, self._data_buffers.indices_mem, writer)
        try:
            loader._run()
        except KeyboardInterrupt:
            # Ctrl-C: leave quietly, as the interpreter may already be half torn down (see
            # torch's [Data Loader Multiprocessing Shutdown Logic]).
            pass
        finally:
            writer.close()
            if loader.parent_gone:
                remove_slots(self._ring, len(self._data_buffers))


class _WorkerLoop(Prefetcher):
    """``Prefetcher``'s loading loop, run on the worker's own thread: its queue is the ring
    and the pipe, and the consumer's requests arrive as commands."""

    def __init__(self, *loader_args: Any) -> None:
        """``loader_args``: ``Prefetcher``'s, but its name (``WorkerProcess._loader_args``)."""
        super().__init__(*loader_args, name="AsynchronousDataAccessor-worker")
        self.queue = self  # type: ignore[assignment]  # _load_first puts the first element
        self._seq = 0

    def connect(
        self, data: Connection, commands: Connection, flags: torch.Tensor, writer: SlotWriter
    ) -> None:
        self._data_out, self._commands_in, self._flags = data, commands, flags
        self._writer = writer
        self.parent_gone = False
        try:
            self._first_iterator = self._open_epoch()
        except Exception as error:  # reported like any other start failure
            self._set_startup(StartupResult("error", error))
            self._stop = True

    def put(self, item: Item) -> None:
        self._put(item)

    def _run(self) -> None:
        if self._startup is None:
            super()._run()

    def _poll(self, timeout: float) -> None:
        try:
            if not self._commands_in.poll(timeout):
                return
            command = self._commands_in.recv()
        except (EOFError, OSError):  # the parent is gone
            self._stop = self.parent_gone = True
            return
        if command[0] == "stop":
            self._stop = True
        elif command[0] == "epoch":
            self._go = True
            self._wanted = max(self._wanted, command[1])

    def _wait_for(self, predicate: Callable[[], bool]) -> bool:
        while not self._stop and not predicate():
            self._poll(POLL_S)
        return not self._stop

    def _put(self, item: Item) -> bool:
        slot = self._seq % len(self._flags)
        while True:
            self._poll(0)
            if self._stop or self._wanted > item.generation:
                return False
            if int(self._flags[slot]) == 0:
                break
            self._poll(POLL_S)
        self._flags[slot] = 1
        self._seq += 1
        return self._write(("item", slot, item.generation, _dumps(self._writer, item, slot)))

    def _set_startup(self, result: StartupResult) -> None:
        self._startup = result
        error = None
        if result.error is not None:
            error = _dumps(self._writer, Item(0, "error", result.error), None)
        self._write(("startup", result.kind, error))

    def _write(self, message: tuple[Any, ...]) -> bool:
        try:
            self._data_out.send(message)
        except (BrokenPipeError, OSError):  # the parent is gone
            self._stop = self.parent_gone = True
            return False
        return True


def _dumps(writer: SlotWriter, item: Item, slot: int | None) -> bytes:
    """``item`` pickled (tensors as shared-memory handles); an item that cannot be pickled
    becomes an error item carrying its type, message and traceback."""
    try:
        return writer.dumps(item, slot)
    except Exception as error:
        payload = item.payload
        if item.kind != "error":
            payload = error
        text = "".join(traceback.format_exception(payload))
        replacement = RuntimeError(
            f"{type(payload).__name__}: {payload}\n(in the AsynchronousDataAccessor worker "
            f"process, which could not send it to the parent process)\n{text}"
        )
        return writer.dumps(Item(item.generation, "error", replacement), slot)


def _loads(reader: SlotReader, blob: bytes, generation: int, slot: int | None) -> Item:
    """The item ``blob`` (and the slot) holds, or an error item if it cannot be read here."""
    try:
        return reader.loads(blob, slot)  # type: ignore[no-any-return]
    except Exception as error:
        return Item(generation, "error", RuntimeError(f"a batch could not be read: {error}"))


# Live workers are stopped at exit before multiprocessing joins its (non-daemon) children:
# the hook is registered after multiprocessing's own, so it runs first.
_live: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()
_hook = False


def _exit_hook_registered() -> None:
    global _hook
    if not _hook:
        _hook = True
        atexit.register(_close_live)


def _close_live() -> None:
    for worker in list(_live):
        try:
            worker.close()
        except Exception:  # exiting must not raise
            pass
