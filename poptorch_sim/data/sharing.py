"""How the accessor's worker process is started, for each ``poptorch.SharingStrategy``.

[Note: sharing strategies]
As PopTorch's, the worker is started the way ``sharing_strategy`` says::

    SharingStrategy         start method   how the dataset reaches the worker
    ----------------------  -------------  ------------------------------------------------
    ForkServer (default)    forkserver     pickled; its tensors cross in shared memory
    Fork                    fork           inherited: nothing is pickled
    SharedMemory            spawn          pickled; its tensors cross in shared memory
    FileSystem              spawn          pickled into a file that the worker reads

The fork server is a process started once per program, the first time a worker is needed, that
imports torch and poptorch_sim (``WORKER_MODULE``) before it forks anything; every later worker
is forked from it in a fraction of a second. Neither the server nor its children have ever run
an OpenMP parallel region when they are forked, so they never wait on threads that do not
exist, as a child forked from a process that used torch's thread pool would. The worker also
runs torch on one thread whatever the strategy (as torch's own data-loader workers do), so
even a forked worker never calls into the OpenMP team it inherited.

``forkserver`` and ``spawn`` need what they send to be picklable. Python's multiprocessing
imports the program's main module again in such a worker, which runs a script's top level
there unless it is guarded by ``if __name__ == "__main__":``. Here the main module is imported
again only when what is sent refers to it (a dataset class defined in the script, say): a
script that loads a ``TensorDataset`` or a torchvision dataset runs unguarded, as it did when
the worker was forked (``main_module_needed``, ``main_module_hidden``). The fork server never
imports the main module itself.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pickle
import sys
import tempfile
import types
from collections.abc import Iterator
from typing import Any

import torch

from ..enums import SharingStrategy

__all__ = [
    "WORKER_MODULE",
    "dump_to_file",
    "load_from_file",
    "main_module_hidden",
    "main_module_needed",
    "start_context",
]

WORKER_MODULE = "poptorch_sim.data.worker_main"

_METHODS = {
    SharingStrategy.ForkServer: "forkserver",
    SharingStrategy.Fork: "fork",
    SharingStrategy.SharedMemory: "spawn",
    SharingStrategy.FileSystem: "spawn",
}


def start_context(strategy: SharingStrategy) -> multiprocessing.context.BaseContext:
    """The multiprocessing context that starts workers for ``strategy``.

    >>> start_context(SharingStrategy.Fork).get_start_method()
    'fork'
    """
    method = _METHODS[SharingStrategy(strategy)]
    if method not in multiprocessing.get_all_start_methods():  # no fork server off POSIX
        method = "spawn"
    context = multiprocessing.get_context(method)
    if context.get_start_method() == "forkserver":
        _preload_worker_module()
    return context


def _preload_worker_module() -> None:
    """Have the fork server import the worker's module (and never the main module) if the
    server has not started yet."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        return
    preload = [name for name in getattr(server, "_preload_modules", []) if name != "__main__"]
    if WORKER_MODULE not in preload:
        preload.append(WORKER_MODULE)
    multiprocessing.forkserver.set_forkserver_preload(preload)


class _MainFinder(pickle.Pickler):
    """Pickles into nothing, noting whether anything refers to the main module."""

    def __init__(self) -> None:
        super().__init__(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        self.uses_main = False

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            return tuple, ()  # its bytes do not matter here
        if getattr(obj, "__module__", None) == "__main__" and isinstance(
            obj, (type, types.FunctionType)
        ):
            self.uses_main = True
        return NotImplemented


class _Discard(io.RawIOBase):
    def write(self, data: Any) -> int:
        return len(data)


def main_module_needed(value: Any) -> bool:
    """Whether unpickling ``value`` needs the program's main module (a class defined there).

    A value that cannot be pickled counts as needing it (starting the worker then reports why).

    >>> main_module_needed(torch.utils.data.TensorDataset(torch.zeros(2)))
    False
    """
    finder = _MainFinder()
    try:
        finder.dump(value)
    except Exception:
        return True
    return finder.uses_main


@contextlib.contextmanager
def main_module_hidden(hide: bool) -> Iterator[None]:
    """While starting a worker: show multiprocessing a bare main module, so that the worker
    does not import the program's own again (see [Note: sharing strategies])."""
    if not hide:
        yield
        return
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def dump_to_file(value: Any) -> str:
    """Pickle ``value`` into a new file (``SharingStrategy.FileSystem``); returns its path."""
    fd, path = tempfile.mkstemp(prefix="poptorch_sim-dataset-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as out:
            pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        os.unlink(path)
        raise
    return path


def load_from_file(path: str) -> Any:
    """What ``dump_to_file`` wrote to ``path``."""
    with open(path, "rb") as source:
        return pickle.load(source)
