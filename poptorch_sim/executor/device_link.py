"""The link between the host model and the device: attached or not, and the weight copies.

A ``DeviceLink`` owns the host side of [Note: lazy weight sync] (``weights.py``): for a training
model it is the *owner* the host model's hooks ask to sync, and it counts the host weights'
versions so that an inference model of the same module can follow them::

    training call ─► dirty_host_weights ─► first host access / copyWeightsToHost
                                             └─► download, host_weights_version += 1
    inference call ─► owner's version changed since our last upload? ─► copyWeightsToDevice

It is handed the device copy when the model is compiled (``connect``) and drops it when the
executable is destroyed (``disconnect``). Attaching claims the model's IPU id and detaching
releases it (See [Note: one model per IPU id] in ``hardware.py``).
"""

from __future__ import annotations

import weakref
from typing import Protocol

from torch import nn

from ..hardware import IpuClaim, claim_ipu
from ..logger import logger
from ..options import Options
from .replicas import ReplicaBuffers
from .weights import DeviceCopy, HostSync, owner_of

__all__ = ["DeviceLink"]


class Executor(Protocol):
    """What the link calls on its executor."""

    def destroy(self) -> None: ...

    def copyWeightsToHost(self) -> None: ...


class DeviceLink:
    """Attachment and weight copies of one executor.

    Args:
        model: the user's model (the host weights).
        training: whether the executor trains (only then are host accesses hooked).
        executor: the executor; the host model's ``destroy()`` calls its ``destroy``, and every
            download a sync makes goes through its ``copyWeightsToHost`` (looked up at each
            call, so a method a program replaced on the executor sees them, as in PopTorch).
            Held weakly: the host model never keeps an executor alive.
        options: the executor's options (which IPU id attaching claims).
    """

    def __init__(
        self, model: nn.Module, training: bool, executor: Executor, options: Options
    ) -> None:
        self._model = model
        self._options = options
        self._claim: IpuClaim | None = None
        self._training = training
        self._executor = weakref.ref(executor)
        self._device: DeviceCopy | None = None
        self._buffers: ReplicaBuffers | None = None
        self._host_sync = HostSync(model, self) if training else None
        self._linked_version = -1  # the owner's host_weights_version we last uploaded
        self.attached = False
        self.dirty_host_weights = False  # the device trained since the last download
        self.host_weights_version = 0  # downloads so far

    # -- the executable -------------------------------------------------------------------------
    def connect(self, device: DeviceCopy, buffers: ReplicaBuffers | None) -> None:
        """Use a freshly compiled device copy (and its per-replica buffers, if any)."""
        self._device, self._buffers = device, buffers

    def disconnect(self) -> None:
        """The executable is gone: detach and unhook the host model."""
        self._device = self._buffers = None
        self.attached = False
        self._release()
        if self._host_sync is not None:
            self._host_sync.unwrap()

    def hook_host(self) -> None:
        """(Re)install the host model's sync hooks (training only)."""
        if self._host_sync is not None:
            self._host_sync.wrap()

    def destroy(self) -> None:
        """The host model's ``destroy()``: destroy the executor, if it still exists."""
        executor = self._executor()
        if executor is not None:
            executor.destroy()

    # -- attachment -----------------------------------------------------------------------------
    def claim(self) -> None:
        """Claim the model's IPU id, unless this link holds it already.

        Raises:
            Error: another model holds the id (PopTorch's "Failed to acquire IPU").
        """
        if self._claim is None or not self._claim.held:
            self._claim = claim_ipu(self._options)

    def _release(self) -> None:
        if self._claim is not None:
            self._claim.release()

    def attach(self) -> None:
        """Attach and upload the host weights (``attachToDevice``, or a call that attaches)."""
        self.claim()
        self.attached = True
        self.copy_to_device()

    def detach(self) -> None:
        """Read a training model's weights back, then release the device."""
        self.copy_to_host_if_needed()
        self.attached = False
        self._release()

    def mark_trained(self) -> None:
        """A call trained the device copy: the host weights are stale until the next download."""
        self.dirty_host_weights = True

    # -- copies ---------------------------------------------------------------------------------
    def copy_to_device(self) -> None:
        """Upload the host weights and buffers (after syncing a training owner's host copy)."""
        device = self._connected()
        owner = owner_of(self._model)
        if owner is not None and owner is not self:
            owner.copy_to_host_if_needed()
        self.dirty_host_weights = False
        logger.debug("Writing weights from host to IPU memory.")
        device.upload()
        if self._buffers is not None:
            self._buffers.broadcast_from_first()
        if owner is not None and owner is not self:
            self._linked_version = owner.host_weights_version

    def copy_to_host(self) -> None:
        """Download the device's weights and buffers into the host model."""
        device = self._connected()
        logger.debug("Writing weights from IPU to host.")
        device.download()
        self.dirty_host_weights = False
        self.host_weights_version += 1

    def copy_to_host_if_needed(self, implicit: bool = False) -> bool:
        """Download if the device trained since the last download; whether it did.
        ``implicit``: say so as PopTorch does when something else needs the host weights."""
        if self._training and self.dirty_host_weights and self._device is not None:
            if implicit:
                logger.debug("Implicit copyWeightsToHost()")
            self._download()
            return True
        return False

    def implicit_copy_to_host(self) -> None:
        """The download a host access of a training model triggers."""
        logger.debug("Implicit copyWeightsToHost()")
        self._download()

    def _download(self) -> None:
        executor = self._executor()
        if executor is not None:
            executor.copyWeightsToHost()
        else:
            self.copy_to_host()

    def copy_buffers_to_device(self, names: list[str]) -> None:
        """Upload only the buffers ``names``."""
        self._connected().upload(only=lambda n: n in names)

    def follow_training_weights(self) -> None:
        """Inference: upload the weights a training model of the same module has trained since."""
        owner = owner_of(self._model)
        if owner is None or owner is self:
            return
        owner.copy_to_host_if_needed()
        if owner.host_weights_version != self._linked_version:
            self.copy_to_device()

    def _connected(self) -> DeviceCopy:
        if self._device is None:
            raise RuntimeError("DeviceLink used before connect(): compile the model first")
        return self._device
