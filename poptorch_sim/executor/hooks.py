"""Pre- and post-compile hooks (``registerPreCompileHook`` / ``registerPostCompileHook``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch.utils.hooks import RemovableHandle

__all__ = [
    "registerPreCompileHook",
    "registerPostCompileHook",
    "run_pre_compile",
    "run_post_compile",
]

_pre: OrderedDict[int, Callable[[], None]] = OrderedDict()
_post: OrderedDict[int, Callable[[], None]] = OrderedDict()


def registerPreCompileHook(hook: Callable[[], None]) -> RemovableHandle:
    """Call ``hook()`` before each model compiles; returns a handle whose ``remove()`` undoes it.

    Raises:
        RuntimeError: ``hook`` is not callable.
    """
    if not callable(hook):
        raise RuntimeError("Pre-compile hook must be callable")
    handle = RemovableHandle(_pre)
    _pre[handle.id] = hook
    return handle


def registerPostCompileHook(hook: Callable[[], None]) -> RemovableHandle:
    """Call ``hook()`` after each model compiles; returns a handle whose ``remove()`` undoes it.

    Raises:
        RuntimeError: ``hook`` is not callable.
    """
    if not callable(hook):
        raise RuntimeError("Post-compile hook must be callable")
    handle = RemovableHandle(_post)
    _post[handle.id] = hook
    return handle


def run_pre_compile() -> None:
    """Run the pre-compile hooks in registration order."""
    for hook in list(_pre.values()):
        hook()


def run_post_compile() -> None:
    """Run the post-compile hooks in registration order."""
    for hook in list(_post.values()):
        hook()
