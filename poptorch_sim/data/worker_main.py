"""The accessor's worker process itself: its entry point and its loading loop.

See [Note: the accessor's worker process] in ``worker_process.py`` (the parent's side) and
[Note: sharing strategies] in ``sharing.py`` (how this process is started).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import torch

from ..executor.custom_args import ICustomArgParser, registerCustomArgParser
from ..logger import logger
from ..runtime.threads import POLL_S
from .batch import check_batch
from .epoch_source import EpochSource
from .owner_watch import release_fork_server, watch_owner
from .prefetch import Item, Prefetcher, StartupResult
from .ring import SlotWriter, open_flags, unlink_ring
from .sharing import load_from_file

__all__ = ["WorkerSpec", "dumps_item", "worker_main"]


class WorkerSpec(NamedTuple):
    """Everything the worker process starts from (pickled unless the worker is forked)."""

    source: EpochSource | str  # a str: the file holding it (SharingStrategy.FileSystem)
    ring: str
    buffer_size: int
    load_indefinitely: bool
    early_preload: bool
    owner: int  # the parent's pid
    death_signal: bool  # see [Note: a worker never outlives its owner]
    rng_state: tuple[torch.Tensor, Any]  # torch's and Python's, as the parent had them
    parsers: dict[type, ICustomArgParser]  # the parent's registerCustomArgParser calls
    start_method: str = "fork"  # the parent's default, for the dataset's own processes
    close_in_child: tuple[int, ...] = ()  # the parent's pipe ends, inherited by a fork


def worker_main(spec: WorkerSpec, data: Connection, commands: Connection) -> None:
    """The worker process: load epochs of ``spec.source`` into the ring until told to stop."""
    # Before any tensor is touched: never enter an OpenMP team (see [Note: sharing strategies]).
    torch.set_num_threads(1)
    for fd in spec.close_in_child:
        os.close(fd)
    release_fork_server(spec.start_method)
    watch_owner(spec.owner, lambda: _owner_gone(spec.ring), spec.death_signal)
    logger.debug("AsynchronousDataAccessor worker process: %d", os.getpid())
    torch.set_rng_state(spec.rng_state[0])
    random.setstate(spec.rng_state[1])
    for cls, parser in spec.parsers.items():
        registerCustomArgParser(cls, parser)
    # A worker started by the fork server or spawn would otherwise start a torch DataLoader's
    # processes that way too, each importing torch again.
    multiprocessing.set_start_method(spec.start_method, force=True)
    loop: _WorkerLoop | None = None
    writer = SlotWriter(spec.ring, spec.buffer_size)
    try:
        source = load_from_file(spec.source) if isinstance(spec.source, str) else spec.source
        loop = _WorkerLoop(source, spec.buffer_size, spec.load_indefinitely, spec.early_preload)
        loop.connect(data, commands, open_flags(spec.ring, spec.buffer_size), writer)
        loop._run()
    except KeyboardInterrupt:
        # Ctrl-C: leave quietly, as the interpreter may already be half torn down (see
        # torch's [Data Loader Multiprocessing Shutdown Logic]).
        pass
    finally:
        writer.close()
        if loop is None or loop.parent_gone:
            unlink_ring(spec.ring)


def _owner_gone(ring: str) -> None:
    unlink_ring(ring)
    os._exit(0)


class _WorkerLoop(Prefetcher):
    """``Prefetcher``'s loading loop, run on the worker's main thread: its queue is the ring
    and the pipe, and the consumer's requests arrive as commands."""

    def __init__(
        self, source: EpochSource, buffer_size: int, load_indefinitely: bool, early_preload: bool
    ) -> None:
        super().__init__(
            source.open,
            source.close,
            buffer_size,
            load_indefinitely,
            early_preload,
            check_batch,
            name="AsynchronousDataAccessor-worker",
        )
        self.queue = self  # type: ignore[assignment]  # _load_first puts the first element
        self._seq = 0
        self.parent_gone = False

    def connect(
        self, data: Connection, commands: Connection, flags: torch.Tensor, writer: SlotWriter
    ) -> None:
        self._data_out, self._commands_in, self._flags = data, commands, flags
        self._writer = writer
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
        return self._write(("item", slot, item.generation, dumps_item(self._writer, item, slot)))

    def _set_startup(self, result: StartupResult) -> None:
        self._startup = result
        error = None
        if result.error is not None:
            error = dumps_item(self._writer, Item(0, "error", result.error), None)
        self._write(("startup", result.kind, error))

    def _write(self, message: tuple[Any, ...]) -> bool:
        try:
            self._data_out.send(message)
        except (BrokenPipeError, OSError):  # the parent is gone
            self._stop = self.parent_gone = True
            return False
        return True


def dumps_item(writer: SlotWriter, item: Item, slot: int | None) -> bytes:
    """``item`` pickled (tensors into the slot); an item that cannot be pickled becomes an
    error item carrying its type, message and traceback."""
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
