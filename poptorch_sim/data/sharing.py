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
is forked from it in a fraction of a second (see [Note: what the fork server imports]). Neither
the server nor its children have ever run an OpenMP parallel region when they are forked, so
they never wait on threads that do not exist, as a child forked from a process that used
torch's thread pool would. The worker also runs torch on one thread whatever the strategy (as
torch's own data-loader workers do), so even a forked worker never calls into the OpenMP team
it inherited.

``forkserver`` and ``spawn`` need what they send to be picklable. Python's multiprocessing
imports the program's main module again in such a worker, which runs a script's top level
there unless it is guarded by ``if __name__ == "__main__":``. Here the main module is imported
again only when what is sent refers to it (a dataset class defined in the script, say): a
script that loads a ``TensorDataset`` or a torchvision dataset runs unguarded, as it did when
the worker was forked (``references``, ``main_module_hidden``). The fork server never
imports the main module itself.

[Note: what the fork server imports]
A worker forked from the server still imports, as it unpickles its dataset, every module the
dataset's classes live in that the server has not imported: a torchvision dataset brings
torchvision, and with it torch._dynamo, about 2 s on a two-core machine, in every worker. So
the first worker's start also gives the server the installed packages' modules its dataset
refers to (those under site-packages, already imported by the program, so they import cleanly;
never the program's own modules, whose imports may have effects): the MNIST tutorial's second
loader started in 0.1-0.2 s instead of 2.1-3.1 s, its first in 4.2-4.3 s instead of 4.7-4.9 s
(two Async loaders over torchvision's MNIST, 2 workers each, 2-vCPU Xeon, 2026-11-29). Datasets
of later loaders import their own modules in their workers, as before: a running server's
imports are fixed.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pickle
import site
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch

from ..enums import SharingStrategy

__all__ = [
    "WORKER_MODULE",
    "dump_to_file",
    "load_from_file",
    "main_module_hidden",
    "preload_in_fork_server",
    "references",
    "References",
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
    return multiprocessing.get_context(method)


def preload_in_fork_server(modules: Iterable[str]) -> None:
    """Have the fork server import the worker's module and ``modules`` (never the main module),
    if the server has not started yet; once it runs, its imports are fixed."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        return
    preload = [name for name in getattr(server, "_preload_modules", []) if name != "__main__"]
    for name in (WORKER_MODULE, *modules):
        if name not in preload:
            preload.append(name)
    server.set_forkserver_preload(preload)


class _Discard(io.RawIOBase):
    def write(self, data: Any) -> int:
        return len(data)


class _Referenced(pickle.Pickler):
    """Pickles into nothing, noting the modules whose classes and functions it refers to."""

    def __init__(self) -> None:
        super().__init__(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            return tuple, ()  # its bytes do not matter here
        module = getattr(obj, "__module__", None)
        if module and isinstance(obj, (type, types.FunctionType)):
            self.modules.add(module)
        return NotImplemented


class References(NamedTuple):
    """What unpickling a value will import."""

    main: bool  # the program's main module (a class defined in the script)
    libraries: tuple[str, ...]  # installed packages' modules (site-packages), already imported


def references(value: Any) -> References:
    """The modules unpickling ``value`` imports (see [Note: what the fork server imports]).

    A value that cannot be pickled counts as needing the main module (starting the worker then
    reports why).

    >>> references(torch.utils.data.TensorDataset(torch.zeros(2))).main
    False
    """
    finder = _Referenced()
    try:
        finder.dump(value)
    except Exception:
        return References(True, ())
    return References("__main__" in finder.modules, _libraries(finder.modules))


def _libraries(names: Iterable[str]) -> tuple[str, ...]:
    # site.getsitepackages is missing from some old virtualenv builds: then nothing is preloaded.
    sites = (*getattr(site, "getsitepackages", list)(), site.getusersitepackages())
    roots = tuple(os.path.join(os.path.realpath(path), "") for path in sites if path)
    found = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and os.path.realpath(path).startswith(roots):
            found.append(name)
    return tuple(found)


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
