"""Multi-IPU annotations: ``Block``, ``BeginBlock``, ``BlockFunction`` and ``removeBlocks``.

[Note: blocks are recorded, not executed]
Annotations do nothing when a model runs eagerly. While poptorch_sim compiles a model, its
tracer installs a ``BlockRecorder`` on the tracing thread (``recording_blocks``); every block
entry and exit is reported to it, in program order, and the recorder stamps the ops traced
after it. The strategy (``poptorch_sim.options.strategies``) later maps each entry to a stage
and an IPU. A ``with Block`` has an end; ``Block.start`` and ``BeginBlock`` have none, so the
ops that follow them stay in their block until the next block starts.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from torch import nn

from ..errors import createPoptorchError

__all__ = [
    "Block",
    "BeginBlock",
    "BlockFunction",
    "LegacyBeginBlockFn",
    "BlockRecorder",
    "active_recorder",
    "recording_blocks",
    "removeBlocks",
]

F = TypeVar("F", bound=Callable[..., Any])


class BlockRecorder(Protocol):
    """What a tracer implements to learn about block entries (see [Note: blocks are ...])."""

    def begin_block(self, user_id: str | None, ipu_id: int | None) -> None:
        """A block starts; ``user_id`` None means "the next automatic id"."""

    def end_block(self) -> None:
        """A ``with Block`` ends: no block is active until the next one starts."""

    def next_auto_id(self) -> str:
        """Consume and return the next automatic block id ("0", "1", ...)."""

    def reset_auto_id(self) -> None:
        """Restart automatic ids at "0" (``Block.useAutoId``)."""


_local = threading.local()


def _checked_ipu_id(where: str, ipu_id: int | None) -> int | None:
    """``ipu_id`` if it is None or an IPU index (a non-negative int), else a clear refusal."""
    if ipu_id is None or (
        isinstance(ipu_id, int) and not isinstance(ipu_id, bool) and ipu_id >= 0
    ):
        return ipu_id
    raise AssertionError(
        f"{where} expects ipu_id to be None or a non-negative int (the index of an IPU) but got "
        f"{ipu_id!r}"
    )


def active_recorder() -> BlockRecorder | None:
    """The recorder of the compilation running on this thread, or None (eager execution)."""
    return getattr(_local, "recorder", None)


@contextmanager
def recording_blocks(recorder: BlockRecorder) -> Iterator[BlockRecorder]:
    """Report the block annotations executed on this thread to ``recorder`` while active."""
    previous = active_recorder()
    _local.recorder = recorder
    try:
        yield recorder
    finally:
        _local.recorder = previous


class Block(nn.Module):
    """A context manager that puts the ops inside it into one block.

    Args:
        user_id: the block id; blocks with the same id are one block (it may be entered again).
            None gives an automatic id ("0", "1", ... in entry order).
        ipu_id: the IPU the block runs on (the strategy may override it).

    A no-op when the model runs eagerly.

    >>> with Block("B1", ipu_id=0):
    ...     y = torch.ones(2) * 2
    """

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        super().__init__()
        self._user_id = user_id
        self._ipu_id = _checked_ipu_id("Block", ipu_id)

    @staticmethod
    def useAutoId() -> None:
        """Restart automatic block ids at "0" (call it at the start of ``forward``)."""
        recorder = active_recorder()
        if recorder is not None:
            recorder.reset_auto_id()

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        """Start a block that lasts until the next block starts (no ``with``).

        Args:
            user_id: the block id (None: automatic).
            ipu_id: the IPU.
        """
        _checked_ipu_id("Block.start", ipu_id)
        recorder = active_recorder()
        if recorder is not None:
            recorder.begin_block(user_id, ipu_id)

    def __enter__(self) -> Block:
        Block.start(self._user_id, self._ipu_id)
        return self

    def __exit__(self, *exc: object) -> None:
        recorder = active_recorder()
        if recorder is not None:
            recorder.end_block()

    def extra_repr(self) -> str:
        return f"user_id={self._user_id!r}, ipu_id={self._ipu_id!r}"


class _BlockHook:
    """The forward-pre-hook ``BeginBlock`` registers: starts the block when the module runs."""

    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __call__(self, module: nn.Module, args: Any) -> None:
        recorder = active_recorder()
        if recorder is None:
            return
        if self._user_id is None:
            # PopTorch fixes an automatic id the first time the hook runs.
            self._user_id = recorder.next_auto_id()
        recorder.begin_block(self._user_id, self._ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self._user_id}, ipu_id={self._ipu_id})"


class LegacyBeginBlockFn(nn.Module):
    """What ``BeginBlock`` returns for a plain callable: calling it starts the block first.

    Args:
        layer_to_call: the callable.
        user_id: the block id (None: automatic, fixed on the first traced call).
        ipu_id: the IPU.
    """

    def __init__(
        self,
        layer_to_call: Callable[..., Any],
        user_id: str | None = None,
        ipu_id: int | None = None,
    ) -> None:
        super().__init__()
        self._user_id = user_id
        self._layer_to_call = layer_to_call
        self._ipu_id = ipu_id

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recorder = active_recorder()
        if recorder is not None:
            if self._user_id is None:
                self._user_id = recorder.next_auto_id()
            recorder.begin_block(self._user_id, self._ipu_id)
        return self._layer_to_call(*args, **kwargs)


def block_hooks(module: nn.Module) -> list[_BlockHook]:
    """The ``BeginBlock`` hooks registered on ``module`` itself (not its children)."""
    return [h for h in module._forward_pre_hooks.values() if isinstance(h, _BlockHook)]


def BeginBlock(
    layer_to_call: nn.Module | Callable[..., Any],
    user_id: str | None = None,
    ipu_id: int | None = None,
) -> nn.Module:
    """Start a block each time ``layer_to_call`` runs; the block lasts until the next one.

    Args:
        layer_to_call: the module (or, for old code, any callable).
        user_id: the block id (None: automatic).
        ipu_id: the IPU.

    Returns:
        The same module (a ``LegacyBeginBlockFn`` wrapping a callable that is not a module).

    Raises:
        poptorch.Error: the module already starts a block, or ``layer_to_call`` is not callable.
        AssertionError: ``ipu_id`` is not None or a non-negative int.

    >>> layer = BeginBlock(nn.Linear(2, 2), "B1", ipu_id=1)
    """
    _checked_ipu_id("BeginBlock", ipu_id)
    if not isinstance(layer_to_call, nn.Module):
        if callable(layer_to_call):
            return LegacyBeginBlockFn(layer_to_call, user_id, ipu_id)
        raise createPoptorchError("module is not an instance of torch.nn.Module or function.")
    if block_hooks(layer_to_call):
        raise createPoptorchError("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: nn.Module) -> None:
    """Remove every ``BeginBlock`` annotation from ``module`` and its sub-modules.

    Raises:
        AssertionError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise AssertionError(f"removeBlocks expects a torch.nn.Module but got {type(module)}")
    for m in module.modules():
        for key in [k for k, h in m._forward_pre_hooks.items() if isinstance(h, _BlockHook)]:
            del m._forward_pre_hooks[key]
            m._forward_pre_hooks_with_kwargs.pop(key, None)


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None) -> Callable[[F], F]:
    """Decorator: every call of the function runs inside ``with Block(user_id, ipu_id)``.

    >>> @BlockFunction("Decoder", ipu_id=1)
    ... def decode(x):
    ...     return x * 2
    >>> decode(torch.ones(1))
    tensor([2.])
    """
    _checked_ipu_id("BlockFunction", ipu_id)

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def uses_begin_block(module: nn.Module) -> bool:
    """Whether ``module`` or a sub-module carries ``BeginBlock`` annotations."""
    return any(block_hooks(m) or isinstance(m, LegacyBeginBlockFn) for m in module.modules())
