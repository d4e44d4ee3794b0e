"""Keeping PopTorch's ops opaque when a model is traced symbolically with ``torch.fx``.

[Note: ops under fx tracing]
PopTorch's ops check ``isinstance(x, torch.Tensor)`` and branch on values (a print, a
registry look-up, a CPU call-back); none of that can run on an ``fx.Proxy``. So while a model
is traced, each op decorated with ``fx_leaf`` records itself as one ``call_function`` node
and runs for real, on real tensors, when the traced graph executes. Ops that take Python
callables (``for_loop``, ``cond``, ``CPU``) are not leaves: their bodies are traced inline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch.fx

__all__ = ["fx_leaf", "find_proxy", "is_proxy"]

F = TypeVar("F", bound=Callable[..., Any])


def is_proxy(value: object) -> bool:
    """Whether ``value`` is a ``torch.fx.Proxy`` (a value being traced)."""
    return isinstance(value, torch.fx.Proxy)


def find_proxy(value: object) -> torch.fx.Proxy | None:
    """Return the first ``fx.Proxy`` found in ``value`` (nested lists, tuples, dicts), if any."""
    if isinstance(value, torch.fx.Proxy):
        return value
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = find_proxy(item)
        if found is not None:
            return found
    return None


def fx_leaf(num_outputs: int | Callable[..., int] | None = None) -> Callable[[F], F]:
    """Make the decorated op record itself as a single node when called with fx proxies.

    Args:
        num_outputs: when set, the op returns a list of this many tensors and the traced call
            returns a list of as many proxies (so ``a, b = op(...)`` traces); a callable gets the
            op's arguments and returns that count; ``None``: the op returns one value.

    Returns:
        A decorator. See [Note: ops under fx tracing].
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            proxy = find_proxy((args, kwargs))
            if proxy is None:
                return fn(*args, **kwargs)
            out = proxy.tracer.create_proxy("call_function", wrapper, args, kwargs)
            count = num_outputs(*args, **kwargs) if callable(num_outputs) else num_outputs
            if count is None:
                return out
            return [out[i] for i in range(count)]

        return wrapper  # type: ignore[return-value]

    return decorate
