"""Per-replica buffers: with ``broadcastBuffers(False)`` each replica keeps its own buffers."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from ..errors import Error

__all__ = ["ReplicaBuffers", "check_buffer_broadcast"]

BROADCAST_ERROR = (
    "PopTorch does not support broadcasting buffers. If your model is able to tolerate buffers "
    "becoming out of sync between replicas, you can disable buffer broadcasting using "
    "poptorch.Options.broadcastBuffers(False)."
)


class ReplicaBuffers:
    """One set of buffers per replica, swapped into the device model before each micro-batch.

    Replica 0 uses the model's own buffer tensors, so copies to and from the host see replica 0.
    """

    def __init__(self, model: nn.Module, replicas: int) -> None:
        self._slots = [
            (module, name)
            for module in model.modules()
            for name, buf in module._buffers.items()
            if buf is not None
        ]
        own = [module._buffers[name] for module, name in self._slots]
        self._sets = [own] + [[b.clone() for b in own] for _ in range(replicas - 1)]

    @property
    def slots(self) -> list[tuple[nn.Module, str]]:
        """``(module, buffer name)`` of every buffer, in the order of each replica's set."""
        return self._slots

    @property
    def sets(self) -> list[list[torch.Tensor]]:
        """Each replica's buffer tensors, one per slot."""
        return self._sets

    def activate(self, replica: int) -> None:
        """Put replica ``replica``'s buffers into the model."""
        for (module, name), buf in zip(self._slots, self._sets[replica]):
            module._buffers[name] = buf

    def broadcast_from_first(self) -> None:
        """Copy replica 0's buffers to every replica (after an upload from the host)."""
        with torch.no_grad():
            for other in self._sets[1:]:
                for src, dst in zip(self._sets[0], other):
                    dst.copy_(src)


def buffer_versions(model: nn.Module) -> dict[int, int]:
    """Version counters of the buffers a replicated model may not update in place."""
    return {
        id(buf): buf._version
        for module in model.modules()
        if not isinstance(module, _NormBase)
        for buf in module._buffers.values()
        if buf is not None
    }


def check_buffer_broadcast(model: nn.Module, before: dict[int, int]) -> None:
    """Raise PopTorch's error if a replicated, broadcast buffer was modified in place."""
    after = buffer_versions(model)
    if any(after.get(key) != version for key, version in before.items()):
        raise Error(BROADCAST_ERROR)
