"""The shared-memory ring the accessor's worker process loads batches into.

Slot ``i`` of a ring is a file in ``/dev/shm`` (shared memory), grown when a batch needs more,
that the worker maps and writes and the parent maps and reads; one more file holds the slots'
flags. A batch crosses as a pickle whose plain tensors are left out of it (``persistent_id``):
each tensor's bytes go into the slot at an aligned offset and the pickle holds ``(offset, dtype,
shape)``; the parent copies them out into tensors of its own, so the slot can be reused as soon
as it is read. See [Note: the accessor's worker process] in ``worker_process.py``.

[Note: ring files outlive nobody]
The parent creates every file of a ring before it starts the worker; both sides open them all
at once, and the parent unlinks them as soon as the worker has reported (``unlink_ring``). From
then on the memory lives only as long as a process holds it open, so nothing is left in
``/dev/shm`` whichever process is killed. A ring's name holds its owner's pid
(``poptorch_sim-ring-<pid>-<random>``): files left by an owner killed before the worker reported
are removed by the next ring made on the machine (``remove_orphaned_rings``).
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

__all__ = [
    "RING_PREFIX",
    "SlotReader",
    "SlotWriter",
    "create_ring",
    "new_ring_name",
    "open_flags",
    "remove_orphaned_rings",
    "ring_files",
    "unlink_ring",
]

RING_PREFIX = "poptorch_sim-ring-"
_ALIGN = 64
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _path(ring: str, slot: int | str) -> str:
    return os.path.join(_SHM, f"{ring}-{slot}")


def new_ring_name() -> str:
    """A name no other ring on the machine has, holding this process's pid.

    Rings whose owner is dead are removed first (see [Note: ring files outlive nobody]).
    """
    remove_orphaned_rings()
    return f"{RING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def create_ring(ring: str, slots: int) -> None:
    """Create the ring's files: ``slots`` empty slots and the flags, one byte per slot."""
    for name in [*range(slots), "flags"]:
        fd = os.open(_path(ring, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if name == "flags":
            os.ftruncate(fd, slots)
        os.close(fd)


def open_flags(ring: str, slots: int) -> torch.Tensor:
    """The ring's flags, mapped: ``flags[i]`` is 1 while slot ``i`` holds an unread batch."""
    return torch.from_file(_path(ring, "flags"), shared=True, size=slots, dtype=torch.uint8)


def ring_files(owner: int | None = None) -> list[str]:
    """Paths of the ring files on the machine (of ``owner``'s rings only, if given)."""
    prefix = RING_PREFIX if owner is None else f"{RING_PREFIX}{owner}-"
    try:
        names = os.listdir(_SHM)
    except OSError:
        return []
    return [os.path.join(_SHM, name) for name in names if name.startswith(prefix)]


def unlink_ring(ring: str) -> None:
    """Remove the ring's files; processes that have them open keep their memory."""
    for path in ring_files():
        if os.path.basename(path).startswith(f"{ring}-"):
            _unlink(path)


def remove_orphaned_rings() -> list[str]:
    """Remove ring files whose owner process has exited; returns their paths."""
    removed = []
    for path in ring_files():
        owner = os.path.basename(path)[len(RING_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            _unlink(path)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Mapping:
    """One slot file, mapped; remapped when the file has grown."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)
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
    """The slot files of one ring, all opened at once (they are unlinked soon after)."""

    def __init__(self, ring: str, slots: int, grow: bool) -> None:
        self.ring = ring
        self._grow = grow  # the writer grows the files; the reader maps what is there
        self._maps = {slot: _Mapping(_path(ring, slot)) for slot in range(slots)}

    def _memory(self, slot: int, size: int) -> mmap.mmap:
        """Slot ``slot``'s memory, at least ``size`` bytes of it mapped."""
        return self._maps[slot].ensure(size, grow=self._grow)

    def close(self) -> None:
        for mapping in self._maps.values():
            mapping.close()
        self._maps.clear()


class SlotWriter(_Slots):
    """The worker's side: pickles an object into slot ``slot``'s memory plus a small pickle."""

    def __init__(self, ring: str, slots: int) -> None:
        super().__init__(ring, slots, grow=True)

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

    def __init__(self, ring: str, slots: int) -> None:
        super().__init__(ring, slots, grow=False)

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
