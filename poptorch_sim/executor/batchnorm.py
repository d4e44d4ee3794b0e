"""Batch norm in an inference model: batch statistics, running statistics left alone.

PopTorch lowers ``aten::batch_norm`` to PopART's BatchNormalization with the module's own
``training`` flag, so a BatchNorm left in training mode normalises an inference model's batch by
that batch's mean and variance. Its running statistics are written back only by a training
session, so an ``inferenceModel`` never changes ``running_mean``, ``running_var`` or
``num_batches_tracked``, even for a module in training mode (PopTorch's ``half_test``
``test_buffers`` reads them back as outputs and expects them unchanged). Other buffers a
``forward`` updates in place are updated in inference as in training.

``frozen_running_stats(model)`` gives that behaviour to the eager ``forward`` this simulator
captures and runs: while it is entered, every BatchNorm in training mode that tracks running
statistics has ``track_running_stats`` off, which makes PyTorch's BatchNorm use the batch's
statistics and skip the updates, the same numbers as PopART's inference graph.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator

from torch import nn

from ..compat.overwrite import SharedPatch

__all__ = ["frozen_running_stats"]

_lock = threading.Lock()
_patches: weakref.WeakKeyDictionary[nn.Module, SharedPatch] = weakref.WeakKeyDictionary()


def _freeze(bn: nn.modules.batchnorm._BatchNorm) -> Callable[[], None]:
    if not (bn.training and bn.track_running_stats):
        return lambda: None
    bn.track_running_stats = False
    return lambda: setattr(bn, "track_running_stats", True)


def _patch(bn: nn.modules.batchnorm._BatchNorm) -> SharedPatch:
    with _lock:
        if bn not in _patches:
            _patches[bn] = SharedPatch(lambda: _freeze(bn))
        return _patches[bn]


@contextlib.contextmanager
def frozen_running_stats(model: nn.Module) -> Iterator[None]:
    """Turns off the running-statistics updates of ``model``'s training-mode BatchNorms while
    entered, and restores each module's flag on the last exit of calls that overlap (one
    ``SharedPatch`` per module: concurrent calls of a model with overlapped IO, or two models
    sharing a BatchNorm)."""
    with contextlib.ExitStack() as stack:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                stack.enter_context(_patch(m))
        yield
