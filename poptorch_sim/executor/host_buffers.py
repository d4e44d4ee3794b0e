"""Host memory for a model's joined outputs, reused once the caller has let go of it.

[Note: output buffers are reused]
A call with ``OutputMode.All`` returns every micro-batch's outputs joined into one tensor per
output: a ``torch.cat`` into memory the process has just been given. For a language model that
is mostly the logits (a 32,000-wide head over 40 × 128 tokens: 655 MB), and glibc hands memory
that large back to the kernel when it is freed, so each call's join writes pages the kernel
must map again, one fault per 4 KiB: on the project's two-vCPU VMs the join took 460-640 ms
into fresh memory and 80-150 ms into memory written before (the copy alone). Eager PyTorch's
loop never joins, so the faults were a tenth of a sharded Llama inference call.

So each executable keeps the buffers of its last ``KEEP`` joined outputs of each size (from
``MIN_BYTES`` up; smaller joins fault little). A call takes a kept buffer whose storage nobody
else references any more: ``torch._C._storage_Use_Count`` is 1, the pool's own reference, so no
tensor, view, NumPy array or DLPack capsule of the caller's still points into it (each holds the
storage). A buffer the caller still holds is never written; the call allocates a new one, and
``KEEP = 2`` covers the usual ``out = model(x)`` loop, where the previous output is alive until
the call returns. This is the CUDA caching allocator's rule (memory returns when its last
tensor dies) for one kind of host tensor. Values are unchanged: the buffer is written whole.
The cost is memory held between calls, not a higher peak: in that loop the old output and
the new one were both alive during each call anyway; now the idle one stays mapped until the next
call (at most ``KEEP`` buffers per output size, all let go by ``destroy()``).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence

import torch

__all__ = ["KEEP", "MIN_BYTES", "OutputBuffers"]

KEEP = 2
MIN_BYTES = 8 << 20


def _only_ours(storage: torch.UntypedStorage) -> bool:
    return torch._C._storage_Use_Count(storage._cdata) == 1  # type: ignore[attr-defined,no-any-return]


class OutputBuffers:
    """Empty CPU tensors for joined outputs. See [Note: output buffers are reused].

    Safe to use from several threads (calls of a served model join on their own threads).

    >>> buffers = OutputBuffers()
    >>> first = buffers.empty((1024, 4096), torch.float32)
    >>> ptr = first.data_ptr()
    >>> del first
    >>> buffers.empty((4096, 1024), torch.float32).data_ptr() == ptr
    True
    """

    def __init__(self, keep: int = KEEP, min_bytes: int = MIN_BYTES) -> None:
        self._keep = keep
        self._min_bytes = min_bytes
        self._lock = threading.Lock()
        self._kept: dict[int, deque[torch.UntypedStorage]] = {}

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous CPU tensor of ``shape`` and ``dtype`` with unspecified values."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self._min_bytes or self._keep < 1:
            return torch.empty(shape, dtype=dtype)
        with self._lock:  # the check and the claim together: a claimed buffer is not ours only
            kept = self._kept.setdefault(nbytes, deque())
            for storage in kept:
                if _only_ours(storage):  # every kept storage here has nbytes
                    kept.remove(storage)
                    kept.append(storage)  # most recently used last
                    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))
            out = torch.empty(shape, dtype=dtype)
            kept.append(out.untyped_storage())
            if len(kept) > self._keep:
                kept.popleft()  # the caller's, or idle: dropped from the pool either way
            return out

    def clear(self) -> None:
        """Let go of every kept buffer (those the caller still holds stay alive)."""
        with self._lock:
            self._kept.clear()

    @property
    def kept_bytes(self) -> int:
        """The bytes of every kept buffer, held by the caller or idle."""
        with self._lock:
            return sum(s.nbytes() for kept in self._kept.values() for s in kept)
