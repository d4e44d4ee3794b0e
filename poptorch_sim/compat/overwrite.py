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
first entry and restore on the last exit, once (``SharedPatch``, which the executor's other
temporary swaps use too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["SharedPatch", "_OverwriteContextManager", "substitutions"]


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


class SharedPatch:
    """A process-wide change made on the first of nested or concurrent entries and undone on the
    last exit, whichever thread makes them.

    ``apply()`` makes the change and returns the function that undoes it. The executor enters
    its patches around compiling and around each call, and calls of one model (overlapped IO,
    a served model) or of several models may overlap, so an entry that finds the change made
    only counts itself: no exit undoes it while another entry is still inside. An ``apply()``
    that raises leaves nothing counted.

    >>> state = {"on": False}
    >>> def turn_on():
    ...     state["on"] = True
    ...     return lambda: state.update(on=False)
    >>> patch = SharedPatch(turn_on)
    >>> with patch:
    ...     with patch:
    ...         pass
    ...     print(state["on"])
    True
    >>> state["on"]
    False
    """

    def __init__(self, apply: Callable[[], Callable[[], None]]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._depth = 0
        self._undo: Callable[[], None] | None = None

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._undo = self._apply()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._undo is not None:
                undo, self._undo = self._undo, None
                undo()


def _enter_managers() -> Callable[[], None]:
    if not _OverwriteContextManager._subsitution_manager_types:
        return lambda: None
    manager = _OverwriteContextManager()
    manager.__enter__()
    return lambda: manager.__exit__(None, None, None)


_SUBSTITUTIONS = SharedPatch(_enter_managers)


def substitutions() -> SharedPatch:
    """The registered substitutions in force for the ``with`` body (see the module docstring)."""
    return _SUBSTITUTIONS
