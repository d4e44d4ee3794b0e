"""The shared-memory ring the accessor's worker process loads batches into.

Slot ``i`` of a ring is a file in ``/dev/shm`` (shared memory), grown when a batch needs more,
that the worker maps and writes and the parent maps and reads. A batch crosses as a pickle
whose plain tensors are left out of it (``persistent_id``): each tensor's bytes go into the
slot at an aligned offset and the pickle holds ``(offset, dtype, shape)``; the parent copies
them out into tensors of its own, so the slot can be reused as soon as it is read. See
[Note: the accessor's worker process] in ``worker_process.py``.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import tempfile
import uuid
from typing import Any

import torch

__all__ = ["SlotReader", "SlotWriter", "new_ring_name", "remove_slots"]

_ALIGN = 64
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _path(ring: str, slot: int) -> str:
    return os.path.join(_SHM, f"{ring}-{slot}")


def new_ring_name() -> str:
    """A name no other ring on the machine has."""
    return f"poptorch_sim-ring-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def remove_slots(ring: str, slots: int) -> None:
    """Delete the ring's files (those that exist)."""
    for slot in range(slots):
        try:
            os.unlink(_path(ring, slot))
        except FileNotFoundError:
            pass


class _Mapping:
    """One slot file, mapped; remapped when the file has grown."""

    def __init__(self, path: str, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o600)
        self.map: mmap.mmap | None = None
        self.size = 0

    def ensure(self, size: int, grow: bool) -> mmap.mmap:
        if grow and os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        size = max(size, os.fstat(self.fd).st_size)
        if self.map is None or self.size < size:
            if self.map is not None:
                self.map.close()
            self.map = mmap.mmap(self.fd, size)
            self.size = size
        return self.map

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        os.close(self.fd)


class _TensorPickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            self.tensors.append(obj)
            return ("tensor", len(self.tensors) - 1)
        return None


class _Slots:
    """The slot files of one ring this process has mapped, each mapped once."""

    def __init__(self, ring: str, create: bool) -> None:
        self.ring = ring
        self._create = create  # the writer creates and grows the files; the reader maps them
        self._maps: dict[int, _Mapping] = {}

    def _memory(self, slot: int, size: int) -> mmap.mmap:
        """Slot ``slot``'s memory, at least ``size`` bytes of it mapped."""
        if slot not in self._maps:
            self._maps[slot] = _Mapping(_path(self.ring, slot), create=self._create)
        return self._maps[slot].ensure(size, grow=self._create)

    def close(self) -> None:
        for mapping in self._maps.values():
            mapping.close()
        self._maps.clear()


class SlotWriter(_Slots):
    """The worker's side: pickles an object into slot ``slot``'s memory plus a small pickle."""

    def __init__(self, ring: str) -> None:
        super().__init__(ring, create=True)

    def dumps(self, obj: Any, slot: int | None) -> bytes:
        """``obj`` as a pickle; with a slot, its plain tensors' bytes go into the slot."""
        if slot is None:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        out, tensors = io.BytesIO(), []
        _TensorPickler(out, tensors).dump(obj)
        layout, offset = [], 0
        for t in tensors:
            layout.append((offset, t.dtype, tuple(t.shape)))
            offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        if tensors:
            memory = self._memory(slot, max(offset, _ALIGN))
            for t, (start, _, _) in zip(tensors, layout):
                n = t.numel() * t.element_size()
                if n:
                    dst = torch.frombuffer(memory, dtype=torch.uint8, count=n, offset=start)
                    dst.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        return pickle.dumps((out.getvalue(), layout), protocol=pickle.HIGHEST_PROTOCOL)


class SlotReader(_Slots):
    """The parent's side: rebuilds what ``SlotWriter.dumps`` wrote, copying tensors out."""

    def __init__(self, ring: str) -> None:
        super().__init__(ring, create=False)

    def loads(self, blob: bytes, slot: int | None) -> Any:
        if slot is None:
            return pickle.loads(blob)
        data, layout = pickle.loads(blob)
        tensors = [self._copy_out(slot, *entry) for entry in layout]
        unpickler = pickle.Unpickler(io.BytesIO(data))
        unpickler.persistent_load = lambda pid: tensors[pid[1]]  # type: ignore[method-assign]
        return unpickler.load()

    def _copy_out(
        self, slot: int, offset: int, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        n = out.numel() * out.element_size()
        if n:
            memory = self._memory(slot, offset + n)
            src = torch.frombuffer(memory, dtype=torch.uint8, count=n, offset=offset)
            out.reshape(-1).view(torch.uint8).copy_(src)
        return out
