"""The AsynchronousDataAccessor's worker process, seen from the parent: start, read, stop.

[Note: the accessor's worker process]
As PopTorch's, the accessor loads data in a separate *process*, so that decoding and collating
never compete with the model for the interpreter lock::

    parent (the accessor)                      worker process (worker_main.py)
    ---------------------                      -------------------------------
    start()  ── start (sharing.py) ────────►   open epoch 0, load the first element
             ◄── ("startup", ok|empty|error)   (the loading loop of prefetch.py, run on
    unlink the ring's files                     the worker's main thread; see
    request_epoch(g) ── ("epoch", g) ──────►    [Note: prefetch epochs])
    get():  slot, item ◄── data pipe ───────
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
stop, and when its parent is gone (the command pipe closes, or see [Note: a worker never
outlives its owner] in ``owner_watch.py``). Failures of the dataset travel to the parent as
items and are raised there (an exception that cannot be pickled is replaced by a RuntimeError
carrying its type, message and traceback).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import random
import signal
import threading
import weakref
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from ..enums import SharingStrategy
from ..errors import createPoptorchError
from ..executor.custom_args import registered_parsers
from ..logger import logger
from ..runtime.threads import POLL_S
from .epoch_source import EpochSource
from .prefetch import Item, StartupResult
from .ring import SlotReader, create_ring, new_ring_name, open_flags, unlink_ring
from .sharing import (
    dump_to_file,
    main_module_hidden,
    preload_in_fork_server,
    references,
    start_context,
)
from .worker_main import WorkerSpec, worker_main

__all__ = ["RingFlags", "WorkerProcess"]

_JOIN_S = 10.0  # how long a stopping worker may take before SIGINT, then SIGTERM


class RingFlags:
    """The ring's slot flags (``indices_mem``), shared by the parent and the worker."""

    def __init__(self, ring: str, buffer_size: int) -> None:
        self.indices_mem = open_flags(ring, buffer_size)

    def __len__(self) -> int:
        return len(self.indices_mem)


class WorkerProcess:
    """The parent's handle on the worker process; the same interface as ``Prefetcher``.

    Args:
        source: the epochs to load (see ``EpochSource``).
        buffer_size, load_indefinitely, early_preload: as ``Prefetcher``'s.
        sharing_strategy: how the process is started (see [Note: sharing strategies]).
        name: the process name.
    """

    def __init__(
        self,
        source: EpochSource,
        buffer_size: int,
        load_indefinitely: bool,
        early_preload: bool,
        sharing_strategy: SharingStrategy,
        name: str,
    ) -> None:
        self._strategy = SharingStrategy(sharing_strategy)
        self._settings = (max(1, buffer_size), load_indefinitely, early_preload)
        self._ring = new_ring_name()
        self._source_file: str | None = None
        self._closed = False
        self._early: list[tuple[Any, ...]] = []
        create_ring(self._ring, self._settings[0])
        self._data_buffers = RingFlags(self._ring, self._settings[0])
        self._reader = SlotReader(self._ring, self._settings[0])
        self._context = start_context(self._strategy)
        self._data, child_data = self._context.Pipe(duplex=False)
        child_commands, self._commands = self._context.Pipe(duplex=False)
        self._child_ends = (child_data, child_commands)
        self._name = name
        self._source: EpochSource | None = source  # dropped once sent: it may hold our owner
        self._process: BaseProcess | None = None

    # ---- parent side -----------------------------------------------------------------------
    def start(self) -> StartupResult:
        """Start the worker and wait until it has loaded the first element (or failed to).

        Raises:
            poptorch.Error: what must be sent to the worker cannot be pickled.
        """
        logger.debug("AsynchronousDataAccessor parent process: %d", os.getpid())
        _live.add(self)
        _exit_hook_registered()
        source, self._source = self._source, None
        try:
            spec = self._spec(source)
            needs = references(spec) if self._strategy != SharingStrategy.Fork else None
            hide_main = needs is not None and not needs.main
            if self._context.get_start_method() == "forkserver" and needs is not None:
                preload_in_fork_server(needs.libraries)
            self._process = self._context.Process(  # type: ignore[attr-defined]
                target=worker_main, args=(spec, *self._child_ends), name=self._name
            )
            del source, spec
            with main_module_hidden(hide_main):
                self._process.start()
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            if self._strategy == SharingStrategy.Fork:
                raise
            raise createPoptorchError(_cannot_send(self._strategy, error)) from error
        finally:
            for end in self._child_ends:
                end.close()
        try:
            return self._startup()
        finally:
            unlink_ring(self._ring)  # see [Note: ring files outlive nobody]

    def _spec(self, source: EpochSource | None) -> WorkerSpec:
        buffer_size, load_indefinitely, early_preload = self._settings
        fork = self._strategy == SharingStrategy.Fork
        if self._strategy == SharingStrategy.FileSystem:
            self._source_file = dump_to_file(source)
        return WorkerSpec(
            source=self._source_file or source,
            ring=self._ring,
            buffer_size=buffer_size,
            load_indefinitely=load_indefinitely,
            early_preload=early_preload,
            owner=os.getpid(),
            death_signal=self._strategy == SharingStrategy.ForkServer
            or threading.current_thread() is threading.main_thread(),
            rng_state=(torch.get_rng_state(), random.getstate()),
            parsers={} if fork else _picklable_parsers(),
            start_method=multiprocessing.get_start_method(),
            close_in_child=(self._data.fileno(), self._commands.fileno()) if fork else (),
        )

    def _startup(self) -> StartupResult:
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
        if self._process is not None and self._process.pid is not None:
            self._stop_process(self._process)
        self._data.close()
        self._commands.close()
        self._reader.close()
        unlink_ring(self._ring)
        if self._source_file is not None:
            os.unlink(self._source_file)

    def _stop_process(self, process: BaseProcess) -> None:
        self._send(("stop",))
        process.join(_JOIN_S)
        if process.exitcode is None:  # blocked inside the dataset: interrupt it
            os.kill(process.pid, signal.SIGINT)  # type: ignore[arg-type]
            process.join(_JOIN_S)
        if process.exitcode is None:
            logger.warning(
                "AsynchronousDataAccessor: the worker process %d did not stop; terminating it",
                process.pid,
            )
            process.terminate()
            process.join()

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
            if self._exitcode() is not None and not self._data.poll(0):
                return None

    def _exitcode(self) -> int | None:
        return None if self._process is None else self._process.exitcode

    def _exit_text(self) -> str:
        code = self._exitcode()
        if code is not None and code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit code {code}"


def _picklable_parsers() -> dict[type, Any]:
    """The registered custom batch parsers that can be sent to a worker that is not forked."""
    parsers = {}
    for cls, parser in registered_parsers().items():
        try:
            pickle.dumps((cls, parser))
        except Exception:  # the worker cannot rebuild such batches; the rest still work
            continue
        parsers[cls] = parser
    return parsers


def _cannot_send(strategy: SharingStrategy, error: Exception) -> str:
    return (
        f"AsynchronousDataAccessor: the dataset cannot be sent to its worker process, which "
        f"sharing_strategy=SharingStrategy.{strategy.name} starts as a new process: "
        f"{type(error).__name__}: {error}. Define the dataset's classes and functions at module "
        "level so that they can be pickled, or pass "
        "sharing_strategy=poptorch.SharingStrategy.Fork (to a poptorch.DataLoader: "
        "async_options={'sharing_strategy': poptorch.SharingStrategy.Fork})."
    )


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
