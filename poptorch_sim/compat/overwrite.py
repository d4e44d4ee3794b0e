"""PopTorch's substitution hook: managers that swap library functions while a model is compiled.

PopTorch's add-on packages register a *substitution manager* (a class whose instances have
``replace()`` and ``restore()``) with the private
``poptorch._poplar_executor._OverwriteContextManager.registerSubsitutionManager`` (PopTorch's
spelling). PopTorch enters every registered manager while it compiles a model, so the compiled
graph holds the replacements: ``poptorch_geometric`` swaps PyTorch Geometric's
``HeteroLinear.forward``, ``ClusterGCNConv.forward``, ``knn`` ... for static-shape versions.

poptorch_sim enters them with ``substitutions()`` around compiling *and* around each run, since a
model that runs as one program executes its Python ``forward`` at every call (PopTorch runs the
graph it compiled, which already holds the replacements), so both see the same functions.
``substitutions()`` nests and may be entered from several threads: the managers replace on the
first entry and restore on the last exit, once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["_OverwriteContextManager", "substitutions"]


class _OverwriteContextManager:
    """Enters every registered substitution manager (``replace()``), and restores them in
    reverse order on exit.

    >>> class Swap:
    ...     def replace(self): print("replace")
    ...     def restore(self): print("restore")
    >>> _OverwriteContextManager.registerSubsitutionManager(Swap)
    >>> with _OverwriteContextManager():
    ...     pass
    replace
    restore
    """

    _subsitution_manager_types: list[type] = []

    def __init__(self) -> None:
        self.substitution_managers = [t() for t in type(self)._subsitution_manager_types]
        self._replaced: list[Any] = []

    def __enter__(self) -> _OverwriteContextManager:
        try:
            for manager in self.substitution_managers:
                manager.replace()
                self._replaced.append(manager)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        while self._replaced:
            self._replaced.pop().restore()

    @classmethod
    def registerSubsitutionManager(cls, manager_type: type) -> None:
        """Enter ``manager_type()`` whenever a model is compiled or run (once per type)."""
        if manager_type not in cls._subsitution_manager_types:
            cls._subsitution_manager_types.append(manager_type)


_lock = threading.Lock()
_depth = 0
_active: _OverwriteContextManager | None = None


@contextlib.contextmanager
def substitutions() -> Iterator[None]:
    """The registered substitutions in force for the ``with`` body (see the module docstring)."""
    global _depth, _active
    with _lock:
        if _depth == 0 and _OverwriteContextManager._subsitution_manager_types:
            manager = _OverwriteContextManager()
            manager.__enter__()
            _active = manager
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _active is not None:
                manager, _active = _active, None
                manager.__exit__(None, None, None)
