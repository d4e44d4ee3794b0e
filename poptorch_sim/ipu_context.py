"""Whether code is running "on the IPU": PopTorch's ``isRunningOnIpu()`` and its switch.

A model's ``forward`` sees ``isRunningOnIpu() == True`` while poptorch_sim traces or runs it,
and ``False`` when the user calls it eagerly. The flag is counted, so contexts nest, and is
either per thread (the default: a trace on one thread does not change what a model running
eagerly on another thread sees) or process-wide (``all_threads=True``, for an executor that
enters the context on one thread and runs ``forward`` on worker threads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["isRunningOnIpu", "running_on_ipu"]

_local = threading.local()
_lock = threading.Lock()
_global_depth = 0


def isRunningOnIpu() -> bool:
    """True while poptorch_sim traces or executes the model, False when it runs eagerly.

    >>> isRunningOnIpu()
    False
    """
    return getattr(_local, "depth", 0) > 0 or _global_depth > 0


@contextmanager
def running_on_ipu(all_threads: bool = False) -> Iterator[None]:
    """Make ``isRunningOnIpu()`` return True inside the ``with`` block.

    Args:
        all_threads: also for every other thread (process-wide), not only the calling one.

    >>> with running_on_ipu():
    ...     isRunningOnIpu()
    True
    """
    global _global_depth
    if all_threads:
        with _lock:
            _global_depth += 1
    else:
        _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        if all_threads:
            with _lock:
                _global_depth -= 1
        else:
            _local.depth -= 1
